"""Token Recycling's drafter (Luo et al., ACL 2025, arXiv:2408.08696): the target's top-k next tokens
for every token it has seen, kept in an adjacency table and read out into a static draft tree."""
import functools
import heapq
from dataclasses import dataclass
from typing import Dict, List, Tuple

from torch import Tensor

from drafters.base import Drafter
from drafters.spec import DraftContext, DrafterSpec
from utils.parsing import check_positive_int

RANK_DECAY = 0.5  # the template's estimate: rank r of a row is right with weight RANK_DECAY^(r + 1)
MAX_DEPTH = 6


@functools.lru_cache(maxsize=None)
def tree_template(size: int, top_k: int, max_depth: int = MAX_DEPTH) -> Tuple[Tuple[int, ...], ...]:
    """The static tree shape: ``size`` nodes as rank paths (``(0, 2)``: the root's best candidate,
    then that token's third), best first by ``prod(RANK_DECAY^(rank + 1))``, so every prefix is a
    tree and the best smaller one. The paper's tree is hand-tuned (80 nodes on a GPU); this one
    has the same form, wide near the root and narrow deeper, at any size."""
    heap = [(-RANK_DECAY ** (r + 1), 1, (r,)) for r in range(top_k)]  # ties: the shallower first (breadth first)
    heapq.heapify(heap)
    shape: List[Tuple[int, ...]] = []
    while heap and len(shape) < size:
        negative, depth, ranks = heapq.heappop(heap)
        shape.append(ranks)
        if depth < max_depth:
            for r in range(top_k):
                heapq.heappush(heap, (negative * RANK_DECAY ** (r + 1), depth + 1, ranks + (r,)))
    return tuple(shape)


class RecyclingDrafter(Drafter):
    """Drafts a static tree from the adjacency table ``table`` (token -> the target's ``top_k`` most
    probable next tokens, best first, as last seen), updated from every verification pass: each
    row the pass scored (the root and every node, accepted or not) replaces its token's entry.

    ``table`` may be shared across generations (the paper keeps it across queries); tokens the
    target has not scored yet are seeded from the prompt's own bigrams (latest first), an addition
    to the paper that gives input-grounded prompts drafts from the first step."""

    supports_trees = True

    def __init__(self, table: Dict[int, List[int]] | None = None, top_k: int = 8):
        self.table: Dict[int, List[int]] = {} if table is None else table
        self.top_k = check_positive_int("top_k", top_k)
        self.memory_key = ("recycling",)

    def seed(self, prompt: List[int]) -> None:
        """Give tokens the target has not scored the continuations they have in the prompt."""
        seeded: Dict[int, List[int]] = {}
        for token, after in zip(prompt, prompt[1:]):
            if token in self.table and token not in seeded:
                continue
            row = seeded.setdefault(token, [])
            if after in row:
                row.remove(after)
            row.insert(0, after)
        for token, row in seeded.items():
            self.table[token] = row[: self.top_k]

    def propose_tree(self, tokens: List[int], budget: int) -> Tuple[List[int], List[int]]:
        """The template's first ``budget`` nodes read from the table; a node whose parent's row is
        missing or too short is left out, with its subtree."""
        nodes: List[int] = []
        parents: List[int] = []
        placed: Dict[Tuple[int, ...], int] = {(): -1}
        for ranks in tree_template(budget, self.top_k):
            parent = placed.get(ranks[:-1])
            if parent is None:
                continue
            row = self.table.get(nodes[parent] if parent >= 0 else tokens[-1])
            if row is None or ranks[-1] >= len(row):
                continue
            placed[ranks] = len(nodes)
            nodes.append(row[ranks[-1]])
            parents.append(parent)
        return nodes, parents

    def fetch(self, target_probs: Tensor) -> Tensor:
        """The target's ``top_k`` most probable tokens at every row of the pass ``[1 + N, top_k]``."""
        return target_probs.topk(min(self.top_k, target_probs.size(-1)), dim=-1).indices

    def accept_tree(self, tokens: List[int], start: int, nodes: List[int], parents: List[int], path: List[int], fetched) -> None:
        for i, token in enumerate(nodes):
            self.table[token] = fetched[1 + i]
        for i in path:  # an accepted node's row is the one in its real context: it wins over a sibling's
            self.table[nodes[i]] = fetched[1 + i]
        self.table[tokens[start - 1]] = fetched[0]


@dataclass(frozen=True)
class RecyclingSpec(DrafterSpec):
    """Token Recycling (Luo et al. 2025): the target's ``top_k`` next tokens of every token it has
    scored, kept in an adjacency table (``DraftContext.table``: a dict kept across generations; None:
    a fresh one), drafted as a static tree of up to ``tree_size`` nodes (``tree_template``) and
    verified in one target pass. Deterministic drafts: greedy exact, sampling lossless."""

    tree_size: int = 24
    top_k: int = 8
    trees = True

    def __post_init__(self):
        check_positive_int("tree_size", self.tree_size)
        check_positive_int("top_k", self.top_k)

    def budget(self) -> int:
        return self.tree_size

    def make(self, prompt: List[int], target, config, context: DraftContext) -> RecyclingDrafter:
        drafter = RecyclingDrafter(context.table, self.top_k)
        drafter.seed(prompt)
        return drafter
