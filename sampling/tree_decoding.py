"""Draft trees verified in one target pass: the tree loop, its acceptance rules, and how big a tree pays.

A tree drafter proposes ``(nodes, parents)`` (``propose_tree``; parent -1 is the root, the last
accepted token; parents come before their children). The target scores every node in one pass
(``tree_pass``), the loop walks down the tree by one of the rules below, and the runner keeps
only the accepted branch (``keep_branch``).
"""
import time
from typing import Dict, List, Tuple

import torch
from torch import Tensor

from sampling.config import GenerationConfig, Step
from sampling.depth_acceptance import DECAY, PRIOR, bucket
from sampling.draft_policy import DraftPolicy
from sampling.chain_decoding import _loop_start, _on_host, _residual, _tensors
from sampling.tree_shape import best_prefix, choose_nodes, rank_estimates
from drafters.base import Drafter
from runners import tree_depths
from utils.logits_processor import GreedyProcessor, LogitsProcessor


TreeDrafter = Drafter  # what the tree loop needs from a source of draft trees: ``Drafter`` with ``supports_trees``


class TreeRecord:
    """What a generation's tree steps showed, per sibling rank (the drafter's order): decaying counts
    of the levels reached that offered a child of that rank, and of those where it was accepted;
    and the same per (depth, rank), shrunk toward the rank's pooled rate as the chain policy's
    acceptance by depth is (``depth_acceptance``): a copy that grows likelier deeper grows deeper trees."""

    DECAY = 0.7  # as DraftPolicy's record: recent steps weigh most (counts saturate at 1 / (1 - 0.7))
    PRIOR_WEIGHT = 0.5
    EVIDENCE_PRIOR = 0.5  # pseudo-observations of the depth's rate an evidence cell starts from

    def __init__(self):
        self.offered: List[float] = []
        self.taken: List[float] = []
        self.by_depth: Dict[Tuple[int, int], List[float]] = {}  # (depth, rank) -> [taken, offered], all decayed each step
        # (evidence bucket, depth, rank) -> [taken, offered], decayed as each is observed: a bucket is met a step in
        # several (a long match is rarer than a short one), and decayed every step it would fade into the depth's prior
        self.by_evidence: Dict[Tuple[int, int, int], List[float]] = {}

    def rate(self, rank: int, depth: int | None = None, evidence: int | None = None) -> float:
        """Estimated chance that the child of ``rank`` is the one accepted at a level reached (at
        ``depth``, 1 for the root's children, when given; for a node backed by ``evidence``, its
        bucket's cell shrunk toward the depth's). Half a pseudo-observation of ``0.5^(rank + 1)``
        keeps it defined, and brings a rank that is no longer verified back toward that prior as its
        record decays, so it is tried again."""
        prior = 0.5 ** (rank + 1)
        pooled = prior if rank >= len(self.offered) else (self.taken[rank] + self.PRIOR_WEIGHT * prior) / (self.offered[rank] + self.PRIOR_WEIGHT)
        cell = self.by_depth.get((depth, rank)) if depth is not None else None
        rate = pooled if cell is None else (cell[0] + PRIOR * pooled) / (cell[1] + PRIOR)
        top = 0 if evidence is None else bucket(evidence)
        for level in range(1, top + 1):  # a longer match is taken to back a node at least as well as a shorter one
            cell = self.by_evidence.get((level, depth, rank))
            if cell is not None:
                shrunk = (cell[0] + self.EVIDENCE_PRIOR * rate) / (cell[1] + self.EVIDENCE_PRIOR)
                rate = shrunk if level == top else max(rate, shrunk)
        return rate

    def update(self, children: List[List[int]], path: List[int], evidence: List[int] | None = None) -> None:
        """Learn from one step: the rows the walk reached (the root, then each accepted node) and which
        child it took; ``evidence``: each node's, when the drafter tells it."""
        self.offered = [c * self.DECAY for c in self.offered]
        self.taken = [c * self.DECAY for c in self.taken]
        for cell in self.by_depth.values():  # every cell, reached or not: a depth no longer reached fades
            cell[0] *= DECAY
            cell[1] *= DECAY
        for level, row in enumerate([0] + [i + 1 for i in path]):
            kids = children[row]
            grow = len(kids) - len(self.offered)
            if grow > 0:
                self.offered += [0.0] * grow
                self.taken += [0.0] * grow
            for rank in range(len(kids)):
                self.offered[rank] += 1.0
                hit = level < len(path) and kids[rank] == path[level]
                cell = self.by_depth.setdefault((level + 1, rank), [0.0, 0.0])
                cell[0], cell[1] = cell[0] + hit, cell[1] + 1.0
                if evidence:
                    cell = self.by_evidence.setdefault((bucket(evidence[kids[rank]]), level + 1, rank), [0.0, 0.0])
                    cell[0], cell[1] = cell[0] * DECAY + hit, cell[1] * DECAY + 1.0
            if level < len(path):
                self.taken[kids.index(path[level])] += 1.0

    @property
    def empty(self) -> bool:
        return not self.offered


def tree_size(policy: DraftPolicy, record: TreeRecord, parents: List[int], rows_before: int = 1) -> int:
    """How many of the proposal's first nodes to verify: the count that maximises expected tokens
    per unit of pass cost (``tree_shape.best_prefix``, each node estimated by its sibling ranks'
    ``record.rate``); 0 when no tree is expected to give more tokens than its pass costs. Without
    ``row_costs``, or before any tree step of the generation, the whole proposal. The loop also
    weighs the tree's best chain (``tree_shape.choose_nodes``)."""
    if policy.row_costs is None or record.empty or not parents:
        return len(parents)
    return best_prefix(policy, rank_estimates(record.rate, parents), rows_before)[0]


def _within(depths: List[int], room: int) -> List[int]:
    """Indices of the nodes at depth < ``room`` (a dropped node's descendants are deeper: dropped too)."""
    return [i for i, depth in enumerate(depths) if depth < room]


def _subtree(nodes: List[int], parents: List[int], kept: List[int]) -> Tuple[List[int], List[int]]:
    """The nodes ``kept`` (ascending, closed under parents) and their parents, reindexed."""
    index = {-1: -1}
    for new, old in enumerate(kept):
        index[old] = new
    return [nodes[i] for i in kept], [index[parents[i]] for i in kept]


def _children(parents: List[int]) -> List[List[int]]:
    """Children of the root (index 0) and of each node (index 1 + i), in node order."""
    children: List[List[int]] = [[] for _ in range(len(parents) + 1)]
    for i, parent in enumerate(parents):
        children[parent + 1].append(i)
    return children


def walk_by_tokens(nodes: List[int], children: List[List[int]], own: List[int]) -> List[int]:
    """The accepted branch when the target's own token at each row (``own[0]`` at the root,
    ``own[1 + i]`` after node ``i``; argmax or a sample) walks down the tree: descend into the
    child holding that token, stop where none does."""
    path, row = [], 0
    while True:
        match = next((c for c in children[row] if nodes[c] == own[row]), None)
        if match is None:
            return path
        path.append(match)
        row = match + 1


def multi_candidate_draws(p: Tensor, q: Tensor, nodes: List[int], children: List[List[int]], processor: LogitsProcessor) -> Tuple[Tensor, Tensor]:
    """On the device, for SpecInfer's multi-step speculative sampling: whether each node would be
    accepted if its parent's turn reached it ``[N]`` (bool), and each row's correction token
    ``[1 + N]``, drawn from what is left of ``p`` after all its children are rejected (``p`` itself
    at a leaf). ``p``, ``q``: ``[1 + N, V]`` target and draft distributions by row.

    The residual of a row after its first ``s`` children were rejected does not depend on any
    draw, so every sibling rank is done for all rows at once, ``max children`` rounds in all."""
    n = len(nodes)
    residual = p.clone()
    accepted = torch.zeros(n, dtype=torch.bool, device=p.device)
    node_ids = torch.tensor(nodes, dtype=torch.long, device=p.device)
    for rank in range(max((len(c) for c in children), default=0)):
        rows = [row for row, c in enumerate(children) if len(c) > rank]
        kids = [children[row][rank] for row in rows]
        at_rows = torch.tensor(rows, dtype=torch.long, device=p.device)
        at_kids = torch.tensor(kids, dtype=torch.long, device=p.device)
        tokens = node_ids[at_kids]
        draws = torch.rand(len(rows), device=p.device, dtype=p.dtype)
        accepted[at_kids] = draws * q[at_rows, tokens] < residual[at_rows, tokens]
        residual[at_rows] = _residual(residual[at_rows], q[at_rows])
    return accepted, processor.sample(residual)[:, 0]


def walk_by_acceptance(children: List[List[int]], accepted: List[int], corrections: List[int]) -> Tuple[List[int], int]:
    """The accepted branch and the token emitted after it under multi-step speculative sampling:
    at each row the children are tried in order, the first accepted one is descended into; when
    all are rejected, the row's correction token is emitted."""
    path, row = [], 0
    while True:
        match = next((c for c in children[row] if accepted[c]), None)
        if match is None:
            return path, corrections[row]
        path.append(match)
        row = match + 1


def _proposal(drafter: TreeDrafter, tokens: List[int], budget: int, room: int, policy: DraftPolicy, record: TreeRecord,
              with_probs: bool) -> Tuple[List[int], List[int], List[int], Tensor | None, List[int] | None, int]:
    """The tree to verify this step: nodes, parents, depths, for a drafter with probabilities ``q``
    ``[1 + N, V]``, each node's evidence (``tree_evidence``; else None), and the drafts the drafter paid
    for (``Drafter.tree_drafts``: its passes, whatever is verified of them). Nodes deeper than
    ``room`` are dropped, then the best prefix or the best chain kept (``tree_shape.choose_nodes``, by
    the measured pass costs). For drafts with probabilities the estimates come from the shape only,
    never from a token, so they stay independent samples of their parents' ``q``; a deterministic
    drafter may give its own (``estimates``), or its nodes' evidence, which keys the record's cells.
    A gated tree (``DraftPolicy.gated``) cut to no node probes its first node after ``next_pause``
    such steps in a row (``DraftPolicy.probes``): the record of a tree never verified cannot recover."""
    q = None
    if with_probs:
        nodes, parents, q = drafter.propose_tree_with_probs(tokens, budget)
    else:
        nodes, parents = drafter.propose_tree(tokens, budget)
    made = drafter.tree_drafts(parents)
    own = None if with_probs else drafter.estimates()  # a drafter's own estimates rank tokens: deterministic drafts only
    evidence = drafter.evidence() if drafter.tree_evidence and not with_probs else None
    depths = tree_depths(parents)
    kept = _within(depths, room)
    nodes, parents = _subtree(nodes, parents, kept)
    evidence = None if evidence is None else [evidence[i] for i in kept]
    if own is not None:
        estimates = [own[i] for i in kept]
    else:
        estimates = None if record.empty else rank_estimates(record.rate, parents, evidence)
    chosen = choose_nodes(policy, estimates, parents)  # the best tree prefix or its best chain (or nothing)
    if len(chosen) < policy.min_draft:
        chosen = []
    if policy.gated and nodes:
        chosen = chosen or ([0] if policy.probes() else [])  # node 0: a child of the root, the drafter's best
        policy.gate_cut(len(chosen))
    nodes, parents = _subtree(nodes, parents, chosen)
    kept = [kept[i] for i in chosen]
    if q is not None:
        q = q[[0] + [1 + i for i in kept]] if kept else None
    return nodes, parents, [depths[i] for i in kept], q, None if evidence is None else [evidence[i] for i in chosen], made


@torch.no_grad()
def draft_tree_and_verify(prompt: List[int], target, drafter: TreeDrafter, config: GenerationConfig) -> List[int]:
    """The speculative loop for draft trees; returns the new tokens (prompt excluded).

    Each step the drafter proposes a tree of at most ``config.gamma`` nodes (``_proposal`` keeps the
    best prefix or its best chain by the measured pass costs), the target scores the last accepted token and every
    node in one pass (``target.tree_pass``), giving ``p`` at the root and after each node.
    Acceptance:

    * greedy processor: the target's argmax walks down the tree (descend into the child whose token
      is the target's own, stop where none is) and the target's token after the last accepted
      node is emitted. Output equals greedy autoregressive decoding exactly.
    * sampling, deterministic drafts: the same walk with the target's own sample ``t ~ p`` at each
      row (one independent draw per row). Lossless: every emitted token is the target's own
      sample given the tokens before it (whether a row's draw is used depends only on the draws
      of its ancestors' rows, which are independent of it).
    * sampling, drafts with probabilities (``propose_tree_with_probs``, each child drawn
      independently from ``q`` of its parent's row): multi-step speculative sampling (SpecInfer,
      Miao et al. 2024, ASPLOS, arXiv:2305.09781, Algorithm 2 / Theorem 4.2): at a row with
      target distribution ``r = p``, the children ``c_1..c_k`` are tried in order; ``c_j`` is
      accepted with probability ``min(1, r(c_j) / q(c_j))`` and descended into, else
      ``r <- norm(max(0, r - q))``; when every child is rejected a token is drawn from ``r`` and
      emitted. For k = 1 this is the chain rule of Leviathan et al. 2023; for any k the emitted
      token follows ``p``.

    After the walk the runner keeps the accepted branch (``target.keep_branch``). Generation stops
    after ``config.max_gen_len`` new tokens, a stop token, or at the target's window; one
    host-device sync per step. Statistics count a step's *levels* (its deepest branch) as drafts,
    so per-position acceptance reads per depth.
    """
    drafter, end, ids, tokens = _loop_start(prompt, target, drafter, config)
    processor, policy, stats = config.processor, config.policy, config.stats
    greedy = isinstance(processor, GreedyProcessor)
    with_probs = drafter.tree_probs
    drafting = not config.first_target
    record = TreeRecord()
    while len(tokens) < end:
        cur = len(tokens)
        room = end - cur - 1  # a branch of depth d emits d + 2 tokens at most
        asked = policy.length(policy.bound()) > 0 and room > 0 if drafting else False
        drafting = True
        clock = time.perf_counter()
        nodes, parents, depths, q, evidence, made = (_proposal(drafter, tokens, config.gamma, room, policy, record, with_probs)
                                                     if asked else ([], [], [], None, None, 0))
        drafted_at = time.perf_counter()
        n_nodes = len(nodes)
        if n_nodes:
            logits = target.tree_pass(ids, cur, nodes, parents)
        else:
            logits = target(ids[:, :cur], 1)
        if config.vocab_size is not None:
            logits = logits[:, : config.vocab_size]
        p = processor(logits) if not greedy or drafter.fetches else None  # [1 + N, V]; greedy: as the chain loop
        children = _children(parents)
        if q is not None and not greedy:
            accepted, corrections = multi_candidate_draws(p, q.to(p.device), nodes, children, processor)
            decided = [accepted.long(), corrections]
        else:
            decided = [(processor.sample(p) if p is not None else processor.choose(logits))[:, 0]]
        wanted_back = drafter.fetch(p) if p is not None else None
        parts = decided + [t.reshape(-1).to(decided[0].device) for t in _tensors(wanted_back)]
        # the only host-device synchronisation of the step
        fetched = torch.cat(parts).tolist()
        if q is not None and not greedy:
            path, own = walk_by_acceptance(children, fetched[:n_nodes], fetched[n_nodes : 2 * n_nodes + 1])
            rest = fetched[2 * n_nodes + 1 :]
        else:
            own_rows = fetched[: n_nodes + 1]
            path = walk_by_tokens(nodes, children, own_rows)
            own, rest = own_rows[path[-1] + 1 if path else 0], fetched[n_nodes + 1 :]
        n = len(path)
        emitted = [nodes[i] for i in path] + [own]
        stop_at = next((i for i, t in enumerate(emitted) if t in config.stop_tokens), None)
        if stop_at is not None:
            emitted = emitted[: stop_at + 1]
        ids[0, cur : cur + len(emitted)] = torch.tensor(emitted, dtype=torch.long)
        tokens.extend(emitted)
        if n_nodes:
            target.keep_branch(cur, path)
        levels = max(depths) + 1 if n_nodes else 0
        stopped_below = children[path[-1] + 1 if path else 0] != []  # a rejection at the last row reached
        # pauses, min_gain: per pass and its cost, the drafts made priced each as the chain loop prices them
        policy.update(n + int(stopped_below) if n_nodes else 0, n, 1 + n_nodes, made)
        if n_nodes:
            record.update(children, path, evidence)
        stats.record_step(levels, min(n, len(emitted)), len(emitted))
        stats.credit(drafter.sources(nodes, path[: min(n, len(emitted))]))
        verified_at = time.perf_counter()
        stats.draft_seconds += drafted_at - clock
        stats.verify_seconds += verified_at - drafted_at
        if cur == len(prompt):
            stats.first_step_seconds = verified_at - clock
        else:  # the first pass also runs the prompt: not what a tree of its size costs
            policy.measured(1 + n_nodes, verified_at - drafted_at, drafted_at - clock, bool(asked), made)  # for the next steps
        shown = [nodes[i] for i in path] + ([nodes[children[path[-1] + 1 if path else 0][0]]] if stopped_below else [])
        config.observe(Step(tokens, cur, len(prompt), shown, n, own, stop_at is not None, rows=1 + n_nodes))
        if stop_at is not None:
            break
        drafter.accept_tree(tokens, cur, nodes, parents, path, _on_host(wanted_back, iter(rest)))
    stats.paused_steps += policy.paused_steps
    stats.policy = policy.chosen()
    policy.finish()
    return tokens[len(prompt) :]


def tree_speculative(prompt: List[int], target, drafter: TreeDrafter, config: GenerationConfig) -> Tuple[List[int], float]:
    """``draft_tree_and_verify``, returned as the public functions return: (new token ids, acceptance rate)."""
    return draft_tree_and_verify(prompt, target, drafter, config), config.stats.acceptance_rate
