"""The sources a merged draft tree is built from (``drafters/merged.py``): each proposes branches after
the context as token paths, each with its own estimate of the chance that its last token follows
the path before it (a *conditional score*):

* ``suffix``: the suffix trie's tree mode (``SuffixDrafter``), a child's count over its node's;
* ``ngram``: the n-gram storage's most frequent branches (``NGramDrafter``), count fractions;
* ``recycling``: the recycling table's static tree (``RecyclingDrafter``), ``RANK_DECAY^(rank + 1)``;
* ``model``: a drafter model's ``top_k`` tokens at each depth of its own greedy chain, their
  probabilities under the model (softmax of its logits).
"""
from typing import Dict, List, Sequence, Tuple

import torch

from drafters.ngram import NGramDrafter
from drafters.recycling import RANK_DECAY, RecyclingDrafter
from drafters.suffix import SuffixDrafter
from drafters.suffix_tree import TIE, best_match_tree

Branch = Tuple[Tuple[int, ...], float]  # (token path after the context, conditional score of its last token)


def paths_of(nodes: Sequence[int], parents: Sequence[int]) -> List[Tuple[int, ...]]:
    """Each node's token path from the root (parents before children)."""
    paths: List[Tuple[int, ...]] = []
    for token, parent in zip(nodes, parents):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return paths


def suffix_branches(drafter: SuffixDrafter, tokens: List[int], budget: int) -> List[Branch]:
    """The suffix drafter's tree (own trie or global memory, the better-scoring match) with each node's
    count over its parent's in the trie it came from."""
    drafter._sync(tokens)
    limit = min(budget, drafter.max_spec_tokens)
    settings = (limit, drafter.factor, drafter.offset, drafter.min_prob)
    found = [(drafter.trie, drafter.trie.active, best_match_tree(drafter.trie, drafter.trie.active, *settings))]
    if drafter.memory is not None:
        memory = drafter.memory.trie
        found.append((memory, drafter.matches, best_match_tree(memory, drafter.matches, *settings)))
    trie, matches, (nodes, parents, _, match) = found[0] if len(found) == 1 or found[0][2][2] + TIE >= found[1][2][2] else found[1]  # own on a tie
    drafter.last_match = match
    if not nodes:
        return []
    at: List[int] = []
    out: List[Branch] = []
    for token, parent, path in zip(nodes, parents, paths_of(nodes, parents)):
        above = at[parent] if parent >= 0 else matches[match]
        node = trie.child(above, token)
        at.append(node)
        out.append((path, trie.count[node] / trie.count[above]))
    return out


def ngram_branches(drafter: NGramDrafter, tokens: List[int], budget: int) -> List[Branch]:
    """The n-gram storage's tree, each node's count over its context's total."""
    nodes, parents = drafter.propose_tree(tokens, budget)
    width = drafter.storage.n - 1
    out: List[Branch] = []
    for path in paths_of(nodes, parents):
        context = (list(tokens) + list(path[:-1]))[-width:] if width > 0 else []
        counts = drafter.storage.continuations(context)
        total = sum(counts.values())
        out.append((path, counts.get(path[-1], 0) / total if total else 0.0))
    return out


def recycling_branches(drafter: RecyclingDrafter, tokens: List[int], budget: int) -> List[Branch]:
    """The recycling table's tree, each node scored by its rank in its parent's row."""
    nodes, parents = drafter.propose_tree(tokens, budget)
    out: List[Branch] = []
    for path in paths_of(nodes, parents):
        row = drafter.table.get(path[-2] if len(path) > 1 else tokens[-1], [])
        out.append((path, RANK_DECAY ** (row.index(path[-1]) + 1)))
    return out


class ModelSource:
    """A drafter model's top-k at each depth: it runs its greedy chain for ``depth`` tokens (one pass
    each, through its own KV cache) and offers the ``top_k`` most probable tokens at every depth as
    siblings, the chain's token first. Deterministic (the target's own token decides acceptance)."""

    def __init__(self, runner, vocab_size: int | None, top_k: int = 3, depth: int = 4):
        self.runner, self.vocab_size, self.top_k, self.depth = runner, vocab_size, top_k, depth
        self.chain: List[int] = []
        self.start = 0
        self.passes = 0  # its passes in the last ``branches``, each a draft (``MergedDrafter.tree_drafts``)

    def branches(self, tokens: List[int], budget: int) -> List[Branch]:
        cur = len(tokens)
        depth = self.passes = min(self.depth, budget)
        ids = torch.zeros((1, cur + depth), dtype=torch.long, device=self.runner.device)
        ids[0, :cur] = torch.tensor(tokens, dtype=torch.long)
        values, indices = [], []
        for d in range(depth):  # the chain's token is written on the device: one host sync, after the loop
            logits = self.runner(ids[:, : cur + d], 1)[0, : self.vocab_size].float()
            top = torch.softmax(logits, -1).topk(min(self.top_k, logits.numel()))
            values.append(top.values)
            indices.append(top.indices)
            ids[0, cur + d] = top.indices[0]
        out: List[Branch] = []
        self.chain, self.start = [], cur
        if not indices:
            return out
        for probs, picks in zip(torch.stack(values).tolist(), torch.stack(indices).tolist()):
            out.extend((tuple(self.chain) + (token,), prob) for token, prob in zip(picks, probs))
            self.chain.append(picks[0])
        return out

    def accept(self, tokens: List[int]) -> None:
        """Keep the cached positions the emitted tokens agree with, the last token excepted (the next
        step's first pass feeds it)."""
        same = 0
        while same < len(self.chain) and self.start + same < len(tokens) and tokens[self.start + same] == self.chain[same]:
            same += 1
        if self.chain:
            self.runner.rollback(min(self.start + same, len(tokens) - 1))
        self.chain = []


class HeadSource:
    """A learned head's dynamic tree (``drafters.eagle.EagleDrafter.propose_tree``) as branches, each
    scored by its path probability over its parent's (the head's conditional probability)."""

    def __init__(self, drafter):
        self.drafter = drafter

    def branches(self, tokens: List[int], budget: int) -> List[Branch]:
        nodes, parents = self.drafter.propose_tree(tokens, budget)
        estimates = self.drafter.estimates()
        return [(path, estimates[i] / (estimates[parents[i]] if parents[i] >= 0 else 1.0))
                for i, path in enumerate(paths_of(nodes, parents))]


class Calibration:
    """Per source: how its conditional scores have fared, as decaying sums of the scores of its
    branches whose parent row the walk reached (verified or not) and of those the target took.
    ``factor`` = (accepted + PRIOR_TAKEN) / (scored + PRIOR), 0.5 before any evidence: a source not
    yet measured is trusted for half its scores, so the first steps verify only what is near sure
    and the sources are measured from the rows every step reaches (the root's at least) before a
    wide tree is paid for (starting at 1, the first unmeasured trees did not pay and the policy's
    cost-aware pause then stopped the drafting that measures them)."""

    DECAY = 0.9
    PRIOR = 1.0
    PRIOR_TAKEN = 0.5

    def __init__(self):
        self.scored: Dict[str, float] = {}
        self.taken: Dict[str, float] = {}

    def factor(self, source: str) -> float:
        return (self.taken.get(source, 0.0) + self.PRIOR_TAKEN) / (self.scored.get(source, 0.0) + self.PRIOR)

    def update(self, offered: List[Tuple[str, float, bool]]) -> None:
        """One step: (source, its score, accepted) for every node of a source the walk reached."""
        for source in set(self.scored) | {s for s, _, _ in offered}:
            self.scored[source] = self.DECAY * self.scored.get(source, 0.0)
            self.taken[source] = self.DECAY * self.taken.get(source, 0.0)
        for source, score, accepted in offered:
            self.scored[source] += score
            self.taken[source] += float(accepted)
