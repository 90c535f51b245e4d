"""Verification costs: which can be real (``plausible_row_costs``), how they are written, and
``measure_costs``, the costs the calibrated policy reads measured now (a notebook's call: no budget,
nothing saved; the programs' start-up measures them within budgets, ``measure.steps``). A cost is
the time of one pass relative to a one-position target pass."""
from typing import Optional, Sequence, Tuple

from torch.nn import Module

import measure.timing as timing
from measure.record import GIVEN, MEASURED, Costs, Finding
from runners.config import EAGER, RunnerConfig


class ImplausibleCosts(ValueError):
    """Costs given (``--row-costs``) that no machine could have measured."""


def plausible_row_costs(costs: Tuple[float, ...]) -> bool:
    """Whether measured relative pass costs can be real: a pass over more positions does the
    work of a shorter one and more, so no cost may fall well below one position's (0.8 allows
    for noise), and none may exceed the positions' count twice over (a busy machine)."""
    return bool(costs) and all(0.8 <= c <= 2.0 * rows for rows, c in enumerate(costs, start=1))


def checked(row_costs: Sequence[float]) -> Tuple[float, ...]:
    """Costs given rather than measured, as floats; ``ImplausibleCosts`` when they cannot be real."""
    costs = tuple(float(c) for c in row_costs)
    if not plausible_row_costs(costs):
        raise ImplausibleCosts(f"row costs {costs} are not plausible: r = 1 costs 1, each r costs 0.8 to 2r")
    return costs


def costs_line(costs: Tuple[float, ...], source: str = "") -> str:
    """"Verification cost by positions 1..N: 1.00 1.10 ... (source)": the line the programs print."""
    shown = " ".join(f"{c:.2f}" for c in costs)
    return f"Verification cost by positions 1..{len(costs)}: {shown}" + (f" ({source})" if source else "")


def draft_cost_line(cost: float, rows: Optional[int] = None, source: str = "") -> str:
    """"a drafter pass of 32,768 output rows costs 0.26 of a target pass (source)": what was timed, its rows where
    it computed part of them (``rows``, ``timing.drafting_cost``'s; None: every row, or a fallback not timed)."""
    of = f" of {rows:,} output rows" if rows else ""
    return f"a drafter pass{of} costs {cost:.2f} of a target pass" + (f" ({source})" if source else "")


def implausible_line(costs: Tuple[float, ...]) -> str:
    """The line for costs measured twice and not plausible either time (the policy keeps a constant length)."""
    shown = " ".join(f"{c:.2f}" for c in costs)
    return f"Verification costs measured twice and not plausible ({shown}): not used, constant draft length"


def measure_costs(target: Module, runner: RunnerConfig = EAGER, drafter: Optional[Module] = None,
                  drafter_runner: Optional[RunnerConfig] = None, row_costs: Optional[Sequence[float]] = None) -> Costs:
    """What ``sampling.calibrated_policy`` reads, measured now on ``target`` where it runs
    (``runner``): its verification costs (``measure_row_costs``, taken again once when not plausible;
    ``row_costs`` given are checked, not measured) and, with a ``drafter`` model, its pass's cost
    (``timing.drafting_cost``, under ``drafter_runner``, with the output rows its ``drafter_head`` asks for)."""
    if row_costs is not None:
        costs = checked(row_costs)
        rows = Finding(costs, costs_line(costs, "given, not measured"), GIVEN)
    else:
        for _ in range(2):
            costs = timing.measure_row_costs(target, runner=runner)
            if plausible_row_costs(costs):
                break
        rows = Finding(costs, costs_line(costs)) if plausible_row_costs(costs) else Finding((), implausible_line(costs))
    if drafter is None:
        return Costs(rows)
    cost, drafted = timing.drafting_cost(drafter, target, runner=runner, drafter_runner=drafter_runner)
    return Costs(rows, Finding(cost, draft_cost_line(cost, drafted), MEASURED))
