"""What a run pays for its steps, estimated in the loop from the clock readings it already takes.

The start-up measurement (``measure_row_costs``) times passes alone; a run pays more around them
(sampling, the host sync, the rollback, the drafter's own host work, a machine busy now and not
then). ``LiveCosts`` keeps decayed means of each step's seconds by pass width, and of a drafting
step's host seconds, and turns them into the relative costs ``DraftPolicy`` weighs: the seconds of a
pass of ``r`` positions over those of one position. No pass is added to measure anything.

A width seen rarely is shrunk toward its start-up cost by ``PRIOR`` pseudo-observations; the unit
(a one-position step's seconds) is pooled over every width seen through the start-up costs' shape,
so a run that never makes a one-position pass still has one, and one that sees a single width
learns nothing relative from it (it keeps the start-up costs). A run that drafts every step would thus
never learn that its passes cost more than the start-up said against a plain one: ``stale`` tells the
policy, which then takes a one-position step where its choice to draft is close.

A drafter whose every draft is a pass (a drafter model, a learned head: ``per_draft``, its start-up cost a
draft) is priced by the draft: its drafting seconds over the drafts it made (its passes and the host work
around them), shrunk toward the start-up cost by ``PRIOR`` pseudo-drafts. Its drafting step's seconds are
not a fixed cost besides: they are those drafts (counted twice, a fixed cost of about k drafts made long
drafts look cheap, as it is amortized over more of them: the pair's speculative row drafted 6-11 a step).
The tree loop prices a tree alike: its drafts are the passes its drafter ran for it (``Drafter.tree_drafts``:
a head's or a drafter model's, one a level), whatever part of the tree is verified.
"""
from typing import Dict, List, Optional, Sequence, Tuple

DECAY = 0.95  # per observed step: the last few dozen steps weigh (a machine's load moves slowly)
PRIOR = 4.0  # pseudo-observations of the start-up cost each width's estimate starts from
REFRESH = 8  # steps between two refreshes of the relative costs the policy reads
# one-position steps set the unit while their decayed weight is at least this (one seen in about the last 27 steps);
# below STALE (none in about the last 16) the unit is ``stale``: the policy may take one to measure it (``DraftPolicy.length``)
UNIT_SEEN = 0.25
STALE = DECAY ** 16


class LiveCosts:
    """Decayed seconds per pass width and per drafting step; ``costs`` are relative (a one-position step = 1)."""

    def __init__(self, prior: Sequence[float], per_draft: float = 0.0) -> None:
        self.prior: Tuple[float, ...] = tuple(prior)  # start-up relative costs by positions 1..N
        self.prior_draft = per_draft  # the start-up cost of a draft that is a pass (0: drafts are host work)
        self._widths: Dict[int, List[float]] = {}  # rows -> [decayed seconds, decayed count]
        self._draft = [0.0, 0.0]  # a drafting step's host seconds: [decayed sum, decayed count]
        self._per = [0.0, 0.0]  # with ``per_draft``: drafting seconds and drafts made, [decayed sum, decayed count]
        self.per_draft: Optional[float] = None  # a draft's cost now, in one-position steps (None: not estimated)
        self.steps = 0  # steps observed
        self.costs: Tuple[float, ...] = self.prior  # the relative costs now (refreshed every REFRESH steps)
        self.draft: float = 0.0  # a drafting step's host cost now, in one-position steps
        self.seconds: Optional[float] = None  # a one-position step's seconds now (None: not yet estimated)

    def observe(self, rows: int, verify_seconds: float, draft_seconds: float, drafted: bool, drafts: int = 0) -> bool:
        """Learn from a step whose pass covered ``rows`` positions and took ``verify_seconds`` (the
        pass and the host work around it), after ``draft_seconds`` of drafting (``drafted``: the drafter
        was asked; ``drafts``: the drafts it made). Returns whether the relative costs were refreshed (the policy's cache is stale)."""
        for cell in self._widths.values():
            cell[0] *= DECAY
            cell[1] *= DECAY
        cell = self._widths.setdefault(rows, [0.0, 0.0])
        cell[0] += verify_seconds
        cell[1] += 1.0
        if drafted:
            self._draft[0] = DECAY * self._draft[0] + draft_seconds
            self._draft[1] = DECAY * self._draft[1] + 1.0
        if drafts > 0 and self.prior_draft:
            self._per[0] = DECAY * self._per[0] + draft_seconds
            self._per[1] = DECAY * self._per[1] + drafts
        self.steps += 1
        if self.steps % REFRESH:
            return False
        self.costs, self.draft, self.seconds = self.estimate()
        if self.seconds and self._per[1] > 0:
            self.per_draft = (self._per[0] / self.seconds + PRIOR * self.prior_draft) / (self._per[1] + PRIOR)
        return True

    def unit(self) -> Optional[float]:
        """Seconds of a one-position step: their own mean where one-position steps were seen, else
        pooled over the widths seen (each through its start-up cost)."""
        one = self._widths.get(1)
        if one is not None and one[1] >= UNIT_SEEN:
            return one[0] / one[1]
        weight = sum(count for _, count in self._widths.values())
        if weight <= 0:
            return None
        return sum(total / self._prior(rows) for rows, (total, _) in self._widths.items()) / weight

    def stale(self) -> bool:
        """Whether the unit lacks a recent one-position step of its own (after the first ``REFRESH`` steps)."""
        one = self._widths.get(1)
        return self.steps >= REFRESH and (one is None or one[1] < STALE)

    def estimate(self) -> Tuple[Tuple[float, ...], float, Optional[float]]:
        """(relative cost by positions 1..N, a drafting step's host cost, a one-position step's
        seconds), from what was observed. Each width seen gives the ratio of what the run paid to its
        start-up cost (shrunk toward 1 by ``PRIOR``); a width between two seen ones takes the ratio
        interpolated linearly, one past them the nearest one's: a run that pays 3x for nine positions
        pays more than the start-up said for eight too."""
        unit = self.unit()
        if not unit:
            return self.prior, 0.0, None
        scales = {1: 1.0}
        for rows, (total, count) in self._widths.items():
            if rows > 1 and rows <= len(self.prior) and count > 0:
                paid = total / count / unit / self._prior(rows)
                scales[rows] = (count * paid + PRIOR) / (count + PRIOR)
        seen = sorted(scales)
        costs = tuple(prior * _interpolated(seen, scales, rows) for rows, prior in enumerate(self.prior, start=1))
        costs = tuple(c / costs[0] for c in costs)
        draft = self._draft[0] / self._draft[1] / unit if self._draft[1] > 0 else 0.0
        return costs, draft, unit

    def line(self) -> str:
        """What the loop measured, for the record: the unit, the widths seen most, the drafter's cost."""
        if self.seconds is None:
            return f"costs in the loop: too few steps ({self.steps}), start-up costs kept"
        seen = sorted(self._widths.items(), key=lambda item: -item[1][1])[:4]
        widths = ", ".join(f"{rows}: {self.costs[rows - 1]:.2f}" for rows, _ in sorted(seen) if rows <= len(self.costs))
        drafts = f", a draft {self.per_draft:.3f} of a step" if self.per_draft is not None else ""
        return (f"costs in the loop over {self.steps} steps: a one-position step {1e3 * self.seconds:.1f} ms, "
                f"by positions {{{widths}}}, drafting {self.draft:.3f} of a step{drafts}")

    def _prior(self, rows: int) -> float:
        if rows <= len(self.prior):
            return self.prior[rows - 1]
        slope = (self.prior[-1] - self.prior[0]) / max(1, len(self.prior) - 1)  # linear past the measured range
        return self.prior[-1] + slope * (rows - len(self.prior))


def _interpolated(seen: List[int], scales: Dict[int, float], rows: int) -> float:
    """``scales`` at ``rows``: linear between the nearest widths ``seen`` (sorted) around it, the nearest one's past them."""
    if rows <= seen[0]:
        return scales[seen[0]]
    for low, high in zip(seen, seen[1:]):
        if rows <= high:
            return scales[low] + (scales[high] - scales[low]) * (rows - low) / (high - low)
    return scales[seen[-1]]
