"""The suffix-tree drafter (SuffixDecoding: Oliaro et al., NeurIPS 2025, arXiv:2411.04975; vLLM's
``suffix`` method): drafts the most frequent continuation of the best match of the context's tail
in a suffix trie over the prompt and the generation, and optionally in a global one over earlier
outputs (``SuffixMemory``).

Defaults are the authors' (``arctic_inference`` ``SuffixDecodingCache.speculate`` and vLLM's
``suffix_decoding_*`` settings): ``max_tree_depth`` 24 (vLLM; the cache's own default is 64),
``max_spec_factor`` 1.0, ``max_spec_offset`` 0, ``min_token_prob`` 0.1, and at most
``max_spec_tokens`` = ``max_tree_depth`` drafts a step.
"""
from dataclasses import dataclass
from typing import List, Tuple

from torch import Tensor

from drafters.base import Drafter, write_drafts
from drafters.spec import DraftContext, DrafterSpec
from utils.parsing import check_positive_int
from drafters.suffix_memory import MAX_DEPTH, SuffixMemory
from drafters.suffix_tree import ROOT, TIE, SuffixTrie, best_match_path, best_match_tree


@dataclass(frozen=True)
class SuffixSettings:
    """SuffixDecoding's settings, with the authors' defaults (see the module's docstring)."""

    max_tree_depth: int = 24
    max_spec_tokens: int = 24
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1

    def __post_init__(self):
        check_settings(**self.arguments())

    def describe(self) -> str:
        return (f"depth {self.max_tree_depth}, <= min({self.max_spec_tokens}, {self.max_spec_factor:g} x match + "
                f"{self.max_spec_offset:g}) drafts, min prob {self.min_token_prob:g}")

    def arguments(self) -> dict:
        """The five settings by name (``SuffixDrafter``'s keywords)."""
        return {name: getattr(self, name) for name in SETTINGS}


SETTINGS = ("max_tree_depth", "max_spec_tokens", "max_spec_factor", "max_spec_offset", "min_token_prob")


@dataclass(frozen=True)
class SuffixSpec(SuffixSettings, DrafterSpec):
    """Suffix decoding: drafts from a suffix trie over the prompt and the generation (``SuffixDrafter``)
    and, with ``DraftContext.memory`` (a ``SuffixMemory`` of depth ``max_tree_depth``), over earlier
    outputs too: this generation's output joins it at the end. Each step drafts at most
    ``max_spec_tokens`` tokens (``min(max_spec_tokens, match_len * max_spec_factor + max_spec_offset)``
    for a match of ``match_len`` tokens, none below the estimated probability ``min_token_prob``).
    ``trees``: each step proposes a tree of up to ``max_spec_tokens`` nodes (the best match's most
    frequent branches), verified in one target pass (needs full attention). Deterministic drafts:
    greedy exact, sampling lossless."""

    trees: bool = False

    def budget(self) -> int:
        return self.max_spec_tokens

    def prepare(self, target, context: DraftContext) -> dict:
        check_memory(context.memory, self.max_tree_depth)
        return super().prepare(target, context)

    def make(self, prompt: List[int], target, config, context: DraftContext) -> "SuffixDrafter":
        return SuffixDrafter(prompt, **self.arguments(), memory=context.memory)


def check_memory(memory: SuffixMemory | None, depth: int) -> None:
    """One line when a global memory's depth is not the drafter's ``max_tree_depth``."""
    if memory is not None and memory.max_depth != depth:
        raise ValueError(f"the memory's depth is {memory.max_depth}, not max_tree_depth {depth}")


class SuffixDrafter(Drafter):
    """Drafts from a suffix trie over the prompt and the tokens emitted so far (and ``memory``'s
    trie when given; the better-scoring draft of the two wins, the request's own on a tie).

    For each match length ``m`` (the context's last ``m`` tokens occur in the trie, ``m`` up to the
    depth), the draft follows the most frequent child while the estimated path probability stays
    >= ``min_token_prob``, for at most ``min(max_spec_tokens, m * max_spec_factor + max_spec_offset)``
    tokens; the draft with the highest score (sum of its path probabilities) wins, ties to the
    longer match. Deterministic (no q): the target's own token decides every position, so greedy is
    exact and sampling lossless. Pure-Python ints; the trie grows by O(depth) per emitted token, and
    a draft costs O(depth^2) at most (every match length, each path up to the depth; an upper
    bound on a match's score skips the hopeless ones)."""

    supports_trees = True
    reports_evidence = True

    def __init__(self, prompt: List[int], max_tree_depth: int = 24, max_spec_tokens: int = 24, max_spec_factor: float = 1.0,
                 max_spec_offset: float = 0.0, min_token_prob: float = 0.1, memory: SuffixMemory | None = None):
        check_settings(max_tree_depth, max_spec_tokens, max_spec_factor, max_spec_offset, min_token_prob)
        self.max_spec_tokens, self.factor, self.offset, self.min_prob = max_spec_tokens, max_spec_factor, max_spec_offset, min_token_prob
        self.memory_key = ("suffix",)
        self.trie = SuffixTrie(max_tree_depth)
        self.memory = memory
        self.matches = [ROOT]  # the context's tail in memory's trie (see SuffixTrie.follow)
        self.seen = 0
        self._sync(prompt)
        self.last_match = 0  # the match length of the last draft (0: none)
        self._drafted = 0  # drafts of the last chain

    def _sync(self, tokens: List[int]) -> None:
        """Add ``tokens[self.seen:]`` to the tries' views (the tokens only ever grow)."""
        if self.memory is not None:
            memory = self.memory.trie
            start = max(self.seen, len(tokens) - memory.max_depth)  # matches depend on the last max_depth tokens only
            if start > self.seen:
                del self.matches[1:]
            for i in range(start, len(tokens)):
                memory.follow(self.matches, tokens[i])
        for i in range(self.seen, len(tokens)):
            self.trie.append(tokens[i])
        self.seen = len(tokens)

    def draft(self, tokens: List[int], k: int) -> List[int]:
        """The best path draft of at most ``k`` tokens after ``tokens``."""
        self._sync(tokens)
        limit = min(k, self.max_spec_tokens)
        draft, score, self.last_match = best_match_path(self.trie, self.trie.active, limit, self.factor, self.offset, self.min_prob)
        if self.memory is not None:
            other, other_score, match = best_match_path(self.memory.trie, self.matches, limit, self.factor, self.offset, self.min_prob)
            if other_score > score + TIE:
                draft, self.last_match = other, match
        return draft

    def propose_tree(self, tokens: List[int], budget: int) -> Tuple[List[int], List[int]]:
        """SuffixDecoding's tree mode after ``tokens``: up to ``budget`` node tokens and their parents
        (-1: a child of the last context token, else the index of an earlier node), the greedy
        best-first expansion by estimated path probability from the best-scoring match (its length
        in ``last_match``, as after ``draft``)."""
        self._sync(tokens)
        limit = min(budget, self.max_spec_tokens)
        nodes, parents, score, self.last_match = best_match_tree(self.trie, self.trie.active, limit, self.factor, self.offset,
                                                                 self.min_prob)
        if self.memory is not None:
            other = best_match_tree(self.memory.trie, self.matches, limit, self.factor, self.offset, self.min_prob)
            if other[2] > score + TIE:
                nodes, parents, self.last_match = other[0], other[1], other[3]
        return nodes, parents

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, None]:
        drafts = self.draft(tokens, k)
        self._drafted = len(drafts)
        return write_drafts(ids, len(tokens), drafts), None

    def evidence(self) -> List[int]:
        """Each draft of the last chain: the length of the match it continues."""
        return [self.last_match] * self._drafted

    # accept, accept_tree: the base's (nothing): the next proposal adds the emitted tokens

    def finish(self, output: List[int] | None) -> None:
        """The generation's output joins ``memory`` (when given)."""
        if output is not None and self.memory is not None:
            self.memory.add(output)


def check_settings(max_tree_depth: int, max_spec_tokens: int, max_spec_factor: float, max_spec_offset: float,
                   min_token_prob: float) -> None:
    """One line for a setting out of range."""
    check_positive_int("max_spec_tokens", max_spec_tokens)
    if not isinstance(max_tree_depth, int) or isinstance(max_tree_depth, bool) or not 1 <= max_tree_depth <= MAX_DEPTH:
        raise ValueError(f"max_tree_depth must be an integer from 1 to {MAX_DEPTH}, got {max_tree_depth!r}")
    for name, value, low, high in (("max_spec_factor", max_spec_factor, 0.0, 64.0), ("max_spec_offset", max_spec_offset, -64.0, 64.0),
                                   ("min_token_prob", min_token_prob, 0.0, 1.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ValueError(f"{name} must be a number from {low} to {high}, got {value!r}")
