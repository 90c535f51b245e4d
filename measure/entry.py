"""The start-up's one entry: ``startup`` measures what runs fastest on this machine for a loaded
target (and drafter) and returns one ``Measured`` record; the CPU dtype is the one measurement
made on a model's copies before the record (``saved_dtype`` before loading, else
``measured_dtype`` on both copies). The programs (``app.pair``) call these and print the record's
lines; each step is ``measure.steps``'."""
from typing import Optional

from torch.nn import Module

import measure.steps as steps
from measure.record import Costs, Finding, Measured, Options
from runners.config import RunnerConfig


def startup(target: Module, runner: RunnerConfig, options: Options, drafter: Optional[Module] = None,
            drafter_runner: Optional[RunnerConfig] = None, dtype: Optional[Finding] = None, drafter_head: int = 0) -> Measured:
    """Measure, in this order: the target's kernels and KV cache kind, the drafter's (``drafter``, run
    under ``drafter_runner``, by default ``runner``), then, with ``options.calibrate``, the drafter's
    cost and the target's verification costs (given by ``options.row_costs``, read from the kernel
    measurement, or measured on the drafting rows' kernels). Each model is left with the kernels chosen
    for plain decoding; the record's runners hold the cache kinds chosen. ``dtype``: what
    ``saved_dtype`` or ``measured_dtype`` chose, kept in the record. ``drafter_head``: the drafter's output rows
    while it drafts (``RunnerConfig.drafter_head``; 0: all), those its cost is timed on (the record's runner keeps
    every row: the drafter as a row of its own computes them all). ``ImplausibleCosts`` (a ValueError)
    for ``options.row_costs`` that cannot be real, before anything is measured."""
    given = steps.given_costs(options)
    first = steps.model_step(target, "target", runner, options)
    second = None if drafter is None else steps.model_step(drafter, "drafter", drafter_runner or runner, options)
    costs = None
    if options.calibrate:
        draft = None if second is None else steps.drafter_step(drafter, target, first.runner, second.runner, options, drafter_head)
        rows = given or steps.row_costs_step(target, first.runner, first.kernels, options)
        costs = Costs(rows, draft)
    return Measured(first, second, dtype, costs, options.busy)


def saved_dtype(folder, options: Options) -> Optional[Finding]:
    """The CPU dtype for ``--dtype auto`` (``--preset pair``) or a drafter's auto dtype, saved by an earlier
    start for the model in ``folder`` on this machine (then one copy is loaded), else None."""
    return steps.saved_dtype(folder, options)


def measured_dtype(folder, float32_model: Module, bfloat16_model: Module, role: str, options: Options) -> Finding:
    """That dtype measured now on the model's two copies, loaded by the caller (who frees the one not
    chosen): their one-position passes alternated, bfloat16 only where clearly faster (``measure.pass_dtype``),
    within its budget, saved. ``value``: "float32" or "bfloat16"."""
    return steps.dtype_step(folder, float32_model, bfloat16_model, role, options)
