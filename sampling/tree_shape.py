"""Which nodes of a proposed draft tree to verify: the best prefix of the tree, or its best chain,
or nothing, by expected tokens per unit of measured pass cost.

A node's *estimate* is the probability that the walk accepts it (the product along its path of
each node's chance given its parent). A verified set of nodes emits ``1 + sum of their
estimates`` tokens on average (the accepted branch, plus the target's own token) and its pass
over ``1 + N`` positions costs ``policy.cost(1 + N)`` one-position passes (``DraftPolicy.cost``:
the measured ``row_costs``, linear beyond). The chain form (the tree of width one) is always a
candidate, so a step never verifies a tree that is expected to pay less than one of its chains.
Deterministic given the estimates and the cost table: no clock, no token of the target.
"""
from typing import List, Sequence

from sampling.draft_policy import DraftPolicy


def rank_estimates(rate, parents: Sequence[int], evidence: Sequence[int] | None = None) -> List[float]:
    """Each node's estimate from the rate of its sibling rank at its depth (``rate(rank, depth)``,
    e.g. ``TreeRecord.rate``; depth 1: the root's children; ``rate(rank, depth, evidence[i])`` with
    each node's ``evidence``): the product of those rates along its path."""
    siblings: dict = {}
    out: List[float] = []
    depths: List[int] = []
    for i, parent in enumerate(parents):
        rank = siblings.get(parent, 0)
        siblings[parent] = rank + 1
        depths.append(1 + (depths[parent] if parent >= 0 else 0))
        own = rate(rank, depths[-1]) if evidence is None else rate(rank, depths[-1], evidence[i])
        out.append(own * (out[parent] if parent >= 0 else 1.0))
    return out


def best_prefix(policy: DraftPolicy, estimates: Sequence[float], rows_before: int = 1) -> tuple:
    """(count, value): the prefix of the nodes (a tree, since parents come first) with the most
    expected tokens per unit of cost; count 0 is the plain step."""
    expected, best, best_value = 1.0, 0, 1.0 / policy.cost(rows_before)
    for i, estimate in enumerate(estimates):
        expected += estimate
        value = expected / policy.cost(rows_before + i + 1)
        if value > best_value:
            best, best_value = i + 1, value
    return best, best_value


def best_chain(policy: DraftPolicy, estimates: Sequence[float], parents: Sequence[int], rows_before: int = 1) -> tuple:
    """(node indices root to leaf, value): the branch, cut at any depth, with the most expected
    tokens per unit of cost; ([], value of the plain step) when none beats it."""
    cumulative: List[float] = []
    depth: List[int] = []
    best, best_value = -1, 1.0 / policy.cost(rows_before)
    for i, parent in enumerate(parents):
        cumulative.append(estimates[i] + (cumulative[parent] if parent >= 0 else 0.0))
        depth.append(1 + (depth[parent] if parent >= 0 else 0))
        value = (1.0 + cumulative[i]) / policy.cost(rows_before + depth[i])
        if value > best_value:
            best, best_value = i, value
    chain: List[int] = []
    while best >= 0:
        chain.append(best)
        best = parents[best]
    return chain[::-1], best_value


def choose_nodes(policy: DraftPolicy, estimates: Sequence[float] | None, parents: Sequence[int], rows_before: int = 1) -> List[int]:
    """Indices (ascending, closed under parents) of the nodes to verify: the best tree prefix or the
    best chain, whichever gives more expected tokens per unit of cost (the chain on a tie: fewer
    positions); [] when neither beats a plain step. Without ``row_costs`` or ``estimates``, all."""
    if policy.row_costs is None or estimates is None or not parents:
        return list(range(len(parents)))
    count, tree_value = best_prefix(policy, estimates, rows_before)
    chain, chain_value = best_chain(policy, estimates, parents, rows_before)
    if chain and chain_value >= tree_value:
        return chain
    return list(range(count))
