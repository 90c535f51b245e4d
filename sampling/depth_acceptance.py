"""Acceptance by draft depth and by the drafter's evidence, for ``DraftPolicy``'s cost-optimal length.

One acceptance rate for every depth undervalues a long verbatim copy, where each accepted draft
makes the next one likelier (and overvalues a drafter whose first guess is its best). Here the
rate of depth ``d`` is the *conditional* acceptance of the ``d``-th draft given the ``d - 1``
before it were accepted, learned from each step (depths ``1..n`` accepted, depth ``n + 1``
rejected, deeper ones unobserved), and, when the drafter reports it, per bucket of its evidence
(``Drafter.evidence``: a matched context's length, on a log2 scale). Each estimate is shrunk
toward its parent by ``PRIOR`` pseudo-observations, so a cell seen once or twice cannot swing a
length, and one never seen is its parent: a bucket's depth toward that depth over every bucket,
a depth toward the depth before it, depth 1 toward the policy's pooled rate. A depth never
drafted is thus guessed from the deepest one seen (a copy accepted 5 deep is likely 6 deep), so
the policy tries it, and learns it, instead of holding at the pooled rate's length.
"""
from typing import Dict, List, Optional, Sequence, Tuple

DECAY = 0.9  # per step: about the last ten steps weigh, and a depth no longer reached (a copy that
# ended) fades back to its parent instead of keeping a stale promise
PRIOR = 2.0  # pseudo-observations of the parent's rate each cell starts from
BUCKETS = 6  # evidence 1, 2-3, 4-7, 8-15, 16-31, 32+ (0: none)
ANY = -1  # the bucket of a depth's cell over every evidence
MEMO = 64  # ``expected``'s answers kept at most (a long stretch without drafts asks for new evidence now and then)


def bucket(evidence: int) -> int:
    """The bucket of ``evidence`` (a drafter's int strength, e.g. a match length): its log2 scale."""
    return min(BUCKETS, max(0, int(evidence)).bit_length())


class DepthAcceptance:
    """Decayed counts of accepted / tried drafts per (evidence bucket, depth); see the module.

    The policy weighs these estimates against costs; this only estimates."""

    def __init__(self) -> None:
        self._cells: Dict[Tuple[int, int], List[float]] = {}  # (bucket or ANY, depth) -> [hits, trials]
        # ``expected``'s answers since the cells last changed, by its arguments: a gated drafter's policy asks the same
        # ones step after step while its drafts are cut to none (issue 71: the policy's host work a plain step)
        self._answers: Dict[tuple, List[float]] = {}

    def __len__(self) -> int:
        return len(self._cells)

    def rate(self, depth: int, prior: float, evidence: Optional[int] = None) -> float:
        """Estimated acceptance of the ``depth``-th draft (1-based) given the ones before it were
        accepted; ``prior``: the pooled rate it shrinks toward; ``evidence``: the draft's own."""
        rate = prior
        for level in range(1, depth + 1):
            rate = self._shrunk((ANY, level), rate)
        return rate if evidence is None else self._shrunk((bucket(evidence), depth), rate)

    def expected(self, drafts: int, prior: float, evidence: Optional[Sequence[int]] = None) -> List[float]:
        """Expected tokens of a step drafting ``k`` tokens, for every ``k`` in ``0..drafts`` (the
        accepted run plus the target's own token: ``1 + sum_d prod_{j <= d} rate(j)``). The list is shared with later
        calls of the same arguments until ``observe``: read it, do not change it."""
        key = (drafts, prior, None if evidence is None else tuple(evidence[:drafts]))
        known = self._answers.get(key)
        if known is not None:
            return known
        if len(self._answers) >= MEMO:
            self._answers.clear()
        out, chain, rate = [1.0], 1.0, prior
        for depth in range(1, drafts + 1):
            rate = self._shrunk((ANY, depth), rate)  # the depth's own, toward the one before it
            chain *= rate if evidence is None else self._shrunk((bucket(evidence[depth - 1]), depth), rate)
            out.append(out[-1] + chain)
        self._answers[key] = out
        return out

    def observe(self, drafted: int, accepted: int, evidence: Optional[Sequence[int]] = None) -> None:
        """Learn from a step that verified ``drafted`` drafts and accepted the first ``accepted``
        (``evidence``: each draft's, or None): depths past the first rejection were not tried."""
        self._answers.clear()
        for cell in self._cells.values():
            cell[0] *= DECAY
            cell[1] *= DECAY
        for depth in range(1, min(drafted, accepted + 1) + 1):
            hit = depth <= accepted
            self._add((ANY, depth), hit)
            if evidence is not None:
                self._add((bucket(evidence[depth - 1]), depth), hit)

    def _shrunk(self, key: Tuple[int, int], prior: float) -> float:
        cell = self._cells.get(key)
        return prior if cell is None else (cell[0] + PRIOR * prior) / (cell[1] + PRIOR)

    def _add(self, key: Tuple[int, int], hit: bool) -> None:
        cell = self._cells.setdefault(key, [0.0, 0.0])
        cell[0] += hit
        cell[1] += 1.0
