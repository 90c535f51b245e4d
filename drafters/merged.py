"""One draft tree from every drafter: the candidates of the suffix trie, the n-gram storage, token
recycling and (when present) a drafter model and a learned head, merged into one tree (a shared prefix appears once)
under a node budget, ranked by each branch's estimated acceptance, verified in one target pass by
the tree loop (``sampling.tree_decoding``).

A node's estimate is the product along its path of its *conditional* estimates; each source scores
its own nodes (``merged_sources``), calibrated by how that source's scores have fared so far
(``Calibration.factor``), and a node several sources propose takes the highest of their
estimates (its *owner*, credited when it is accepted). The drafts are deterministic (no ``q``):
the target's own token walks down the tree, so greedy output is the target's and sampled output
follows the target's distribution whatever the sources propose.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from torch import Tensor

from drafters.base import Drafter
from drafters.eagle import EagleDrafter
from drafters.merged_sources import Calibration, HeadSource, ModelSource, ngram_branches, recycling_branches, suffix_branches
from drafters.ngram import NGramDrafter, ngram_tree_drafter
from drafters.recycling import RecyclingDrafter
from drafters.spec import DraftContext, DrafterSpec
from drafters.suffix import SuffixDrafter, SuffixSettings, check_memory
from runners.limits import common_vocab_size
from utils.parsing import check_positive_int

Path = Tuple[int, ...]


def merge(proposals: Dict[str, List[Tuple[Path, float]]], factors: Dict[str, float], budget: int
          ) -> Tuple[List[int], List[int], List[float], Dict[Path, Dict[str, float]]]:
    """Merge the sources' branches (``{source: [(token path, conditional score)]}``, parents before
    children in each) into one tree of at most ``budget`` nodes.

    Returns (nodes, parents, estimates, scores): the nodes best first by estimated acceptance (ties:
    the shallower, then the earlier proposed), so every prefix is a tree; ``scores[path]`` each
    source's own conditional score of a kept node."""
    conditional: Dict[Path, float] = {}
    scores: Dict[Path, Dict[str, float]] = {}
    for source, branches in proposals.items():
        for path, score in branches:
            if len(path) > 1 and path[:-1] not in conditional:
                continue  # a branch whose parent was not proposed (cannot happen for a well-formed tree)
            estimate = min(1.0, factors[source] * score)
            scores.setdefault(path, {})[source] = score
            conditional[path] = max(conditional.get(path, 0.0), estimate)
    estimate: Dict[Path, float] = {}
    for path in conditional:  # insertion order: a parent before its children
        estimate[path] = conditional[path] * (estimate[path[:-1]] if len(path) > 1 else 1.0)
    order = {path: i for i, path in enumerate(conditional)}
    ranked = sorted(conditional, key=lambda p: (-estimate[p], len(p), order[p]))[:budget]
    index = {path: i for i, path in enumerate(ranked)}
    nodes = [path[-1] for path in ranked]
    parents = [index[path[:-1]] if len(path) > 1 else -1 for path in ranked]
    return nodes, parents, [estimate[p] for p in ranked], {p: scores[p] for p in ranked}


class MergedDrafter(Drafter):
    """Drafts one tree merged from its sources (any of ``suffix``, ``ngram``, ``recycling``, ``model``, ``head``),
    learns for each of them from every step, and tells the loop which source each accepted draft
    came from (``sources``) and each node's estimate (``estimates``)."""

    supports_trees = True

    def __init__(self, suffix: SuffixDrafter | None = None, ngram: NGramDrafter | None = None,
                 recycling: RecyclingDrafter | None = None, model: ModelSource | None = None, head: HeadSource | None = None):
        self.suffix, self.ngram, self.recycling, self.model, self.head = suffix, ngram, recycling, model, head
        self.cheap = model is None and head is None
        self.step_cost = head.drafter.step_cost if model is None and head is not None else None  # the head's, measured
        self.memory_key = ("merged",) + tuple(name for name in self.names)
        self.calibration = Calibration()
        self.last: Tuple[List[float], Dict[Path, Dict[str, float]]] = ([], {})
        self.proposals: Dict[str, List[Tuple[Path, float]]] = {}  # the last step's branches by source

    @property
    def names(self) -> List[str]:
        return [name for name in ("suffix", "ngram", "recycling", "model", "head") if getattr(self, name) is not None]

    def branches(self, tokens: List[int], budget: int) -> Dict[str, List[Tuple[Path, float]]]:
        """Each source's proposal after ``tokens``."""
        out: Dict[str, List[Tuple[Path, float]]] = {}
        if self.suffix is not None:
            out["suffix"] = suffix_branches(self.suffix, tokens, budget)
        if self.ngram is not None:
            out["ngram"] = ngram_branches(self.ngram, tokens, budget)
        if self.recycling is not None:
            out["recycling"] = recycling_branches(self.recycling, tokens, budget)
        if self.model is not None:
            out["model"] = self.model.branches(tokens, budget)
        if self.head is not None:
            out["head"] = self.head.branches(tokens, budget)
        return out

    def attach(self, target) -> None:
        if self.head is not None:
            self.head.drafter.attach(target)

    def propose_tree(self, tokens: List[int], budget: int) -> Tuple[List[int], List[int]]:
        factors = {name: self.calibration.factor(name) for name in self.names}
        self.proposals = self.branches(tokens, budget)
        nodes, parents, estimates, scores = merge(self.proposals, factors, budget)
        self.last = (estimates, scores)
        return nodes, parents

    def estimates(self) -> List[float]:
        return self.last[0]

    def tree_drafts(self, parents: List[int]) -> int:
        """The passes its drafter model and head ran for the last tree, each a draft (the other sources are host work)."""
        return (self.model.passes if self.model is not None else 0) + (self.head.drafter.tree_drafts(parents) if self.head is not None else 0)

    def owner(self, path: Path) -> str:
        """The source whose calibrated estimate ranked the node (the first named on a tie)."""
        scores = self.last[1][path]
        return max(scores, key=lambda s: (scores[s] * self.calibration.factor(s), -self.names.index(s)))

    def sources(self, nodes: List[int], path: List[int]) -> List[str]:
        tokens = tuple(nodes[i] for i in path)
        return [self.owner(tokens[: d + 1]) for d in range(len(tokens))]

    def fetch(self, target_probs: Tensor) -> Tensor | None:
        """The target's top-k at every row, as many as the n-gram filler and the recycling table take."""
        k = max(self.ngram.filler_top_k if self.ngram is not None else 0, self.recycling.top_k if self.recycling is not None else 0)
        return target_probs.topk(min(k, target_probs.size(-1)), dim=-1).indices if k > 1 else None

    def accept_tree(self, tokens: List[int], start: int, nodes: List[int], parents: List[int], path: List[int], fetched) -> None:
        """Calibrate every source on the rows the walk reached, and let each learn as on its own."""
        self._calibrate(tokens[start:])
        if self.ngram is not None:
            k = self.ngram.filler_top_k
            self.ngram.accept_tree(tokens, start, nodes, parents, path, None if fetched is None or k <= 1 else [r[:k] for r in fetched])
        if self.recycling is not None and fetched is not None:
            k = self.recycling.top_k
            self.recycling.accept_tree(tokens, start, nodes, parents, path, [r[:k] for r in fetched])
        if self.model is not None:
            self.model.accept(tokens)
        if self.head is not None:  # the target's hidden states of the merged tree's accepted branch
            self.head.drafter.accept_tree(tokens, start, nodes, parents, path, None)

    def _calibrate(self, emitted: List[int]) -> None:
        """Every branch a source proposed (verified or not) whose parent row the walk reached is
        scored against the target's own token at that row (``emitted[depth]``)."""
        offered = []
        for source, branches in self.proposals.items():
            for path, score in branches:
                depth = len(path) - 1
                if depth < len(emitted) and path[:depth] == tuple(emitted[:depth]):
                    offered.append((source, score, path[depth] == emitted[depth]))
        self.calibration.update(offered)

    def finish(self, output: List[int] | None) -> None:
        if self.suffix is not None:
            self.suffix.finish(output)


@dataclass(frozen=True)
class MergedSpec(DrafterSpec):
    """One draft tree merged from every drafter, up to ``tree_size`` nodes best first by estimated
    acceptance, verified in one target pass: the suffix trie (``suffix``; ``DraftContext.memory``, its
    global tree), the n-gram storage ``DraftContext.storage`` (None: no n-gram source; ``filler_top_k``),
    token recycling (``recycling_top_k``; 0: none), the drafter model ``DraftContext.drafter`` when
    given (its ``model_top_k`` tokens at each of ``model_depth`` depths) and the head
    ``DraftContext.head`` when given (its dynamic tree). Deterministic drafts: greedy exact, sampling
    lossless; ``GenerationStats.accepted_by`` counts accepted drafts by source."""

    tree_size: int = 16
    filler_top_k: int = 3
    recycling_top_k: int = 8
    suffix: SuffixSettings = field(default_factory=SuffixSettings)
    model_top_k: int = 3
    model_depth: int = 4
    trees = True

    def __post_init__(self):
        for name in ("tree_size", "filler_top_k", "model_top_k", "model_depth") + (("recycling_top_k",) if self.recycling_top_k else ()):
            check_positive_int(name, getattr(self, name))

    def budget(self) -> int:
        return self.tree_size

    def prepare(self, target, context: DraftContext) -> dict:
        check_memory(context.memory, self.suffix.max_tree_depth)
        return super().prepare(target, context)

    def make(self, prompt: List[int], target, config, context: DraftContext) -> MergedDrafter:
        recycling = None
        if self.recycling_top_k:
            recycling = RecyclingDrafter(None, self.recycling_top_k)
            recycling.seed(prompt)
        model = None
        if context.drafter is not None:
            model = ModelSource(config.make_runner(context.drafter, drafter=True), common_vocab_size(context.drafter, target, context.tokenizer),
                                self.model_top_k, self.model_depth)
        learned = None if context.head is None else HeadSource(EagleDrafter.of(context.head, config))
        suffix = SuffixDrafter(prompt, **self.suffix.arguments(), memory=context.memory)
        ngram = None if context.storage is None else ngram_tree_drafter(context.storage, prompt, self.filler_top_k)
        return MergedDrafter(suffix, ngram, recycling, model, learned)
