"""The copy tree: a draft tree shaped by the earlier occurrences of the context's last token in the
prompt and the output so far (strategy ``tree_copy``; docs/trees.md).

Each step ranks every earlier occurrence of the last token by its *match*: how many tokens before it
equal the context's tail (the longest backward match first, up to ``CAP``; the most recent on a tie).
The ``width`` best occurrences' distinct next tokens are siblings under the root, and the best one is
continued to ``depth`` (so ``width + depth - 1`` nodes at most). Where a copy is ambiguous (the same
phrase followed by different words in a summarised text), the siblings verify several of its
continuations in one pass; where it is not, the best one's chain is the suffix chain's draft.

Each node's evidence is its occurrence's match length (``evidence``): the tree loop estimates a node
by its (evidence, depth, sibling rank) record and gates the tree by the pass costs, as the chain loop
gates a chain drafter's evidence (``sampling.tree_decoding``). Deterministic drafts: greedy exact,
sampling lossless.
"""
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from drafters.base import Drafter
from drafters.spec import DraftContext, DrafterSpec
from utils.parsing import check_positive_int

CAP = 64  # how far back a match is measured (tokens)
WIDTH = 3  # siblings: the best of scripts/grounded_ceiling.py's trees on grounded prompts (docs/profile.md)


def occurrences(seq: Sequence[int], cap: int = CAP, starts: Sequence[int] | None = None) -> List[Tuple[int, int]]:
    """(match length, start) of every earlier occurrence of ``seq``'s last token, the longest backward
    match first (at most ``cap``), the most recent first on a tie. ``starts``: the positions holding
    that token, when an index has them (None: every position is scanned)."""
    last, length, found = seq[-1], len(seq), []
    for start in range(length - 1) if starts is None else starts:
        if start >= length - 1 or seq[start] != last:
            continue
        match = 1
        while match < cap and start - match >= 0 and seq[start - match] == seq[length - 1 - match]:
            match += 1
        found.append((match, start))
    found.sort(key=lambda item: (-item[0], -item[1]))
    return found


def copy_tree(seq: Sequence[int], found: Sequence[Tuple[int, int]], width: int, depth: int) -> Tuple[List[int], List[int], List[int]]:
    """(nodes, parents, evidence) after ``seq`` from its ranked ``found`` occurrences: the best one's
    next token, the next tokens of the following occurrences that differ from those taken (siblings,
    until ``width`` are under the root), then the best one's continuation to ``depth`` under its first
    node. Parents come before children (-1: the root), every prefix is a tree; ``evidence[i]``: the
    match length of the occurrence node ``i`` came from."""
    if not found:
        return [], [], []
    match, start = found[0]
    chain = list(seq[start + 1 : start + 1 + depth])
    nodes, parents, evidence = chain[:1], [-1], [match]
    for other_match, other in found[1:]:
        if len(nodes) >= width:
            break
        if seq[other + 1] not in nodes:  # every node so far is a sibling under the root
            nodes.append(seq[other + 1])
            parents.append(-1)
            evidence.append(other_match)
    for i, token in enumerate(chain[1:]):
        parents.append(0 if i == 0 else len(nodes) - 1)
        nodes.append(token)
        evidence.append(match)
    return nodes, parents, evidence


class CopyTreeDrafter(Drafter):
    """Drafts ``copy_tree`` from an index of the positions of every token of the prompt and the output
    so far (token -> positions, grown by the tokens emitted): a step costs the last token's occurrences
    times their matches, not the context's length. ``evidence()``: each node's match length."""

    supports_trees = True
    tree_evidence = True

    def __init__(self, prompt: Sequence[int], width: int = WIDTH, depth: int = 14):
        self.width = check_positive_int("width", width)
        self.depth = check_positive_int("depth", depth)
        self.positions: Dict[int, List[int]] = {}
        self.seen = 0
        self._sync(prompt)
        self._evidence: List[int] = []

    def _sync(self, tokens: Sequence[int]) -> None:
        """Index ``tokens[self.seen:]`` (the tokens only ever grow)."""
        for i in range(self.seen, len(tokens)):
            self.positions.setdefault(tokens[i], []).append(i)
        self.seen = len(tokens)

    def propose_tree(self, tokens: List[int], budget: int) -> Tuple[List[int], List[int]]:
        """The copy tree after ``tokens``, its first ``budget`` nodes (a prefix: still a tree)."""
        self._sync(tokens)
        found = occurrences(tokens, CAP, self.positions.get(tokens[-1], ()))
        nodes, parents, self._evidence = copy_tree(tokens, found, self.width, self.depth)
        del nodes[budget:], parents[budget:], self._evidence[budget:]
        return nodes, parents

    def evidence(self) -> List[int]:
        """Each node of the last tree: the match length of the occurrence it came from."""
        return list(self._evidence)


@dataclass(frozen=True)
class CopyTreeSpec(DrafterSpec):
    """The copy tree (``CopyTreeDrafter``): the ``width`` best earlier occurrences' distinct next tokens,
    the best continued so that a tree holds ``tree_size`` nodes at most (depth ``tree_size - width + 1``),
    verified in one target pass, gated by each node's evidence. Needs a decoder-only target with full
    attention. Deterministic drafts: greedy exact, sampling lossless."""

    tree_size: int = 16
    width: int = WIDTH
    trees = True

    def __post_init__(self):
        check_positive_int("tree_size", self.tree_size)
        check_positive_int("width", self.width)

    def budget(self) -> int:
        return self.tree_size

    def make(self, prompt: List[int], target, config, context: DraftContext) -> CopyTreeDrafter:
        return CopyTreeDrafter(prompt, self.width, max(1, self.tree_size - self.width + 1))
