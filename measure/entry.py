"""The start-up's one entry: ``startup`` measures what runs fastest on this machine for a loaded
target (and drafter) and returns one ``Measured`` record; ``startup_dtype`` is the one measurement
made before loading (the CPU dtype, from the model's folder). The programs (``app.session``) call
these two and print the record's lines; each step is ``measure.steps``'."""
from typing import Optional

from torch.nn import Module

import measure.steps as steps
from measure.record import Costs, Finding, Measured, Options
from runners.config import RunnerConfig


def startup(target: Module, runner: RunnerConfig, options: Options, drafter: Optional[Module] = None,
            drafter_runner: Optional[RunnerConfig] = None, dtype: Optional[Finding] = None) -> Measured:
    """Measure, in this order: the target's kernels and KV cache kind, the drafter's (``drafter``, run
    under ``drafter_runner``, by default ``runner``), then, with ``options.calibrate``, the drafter's
    cost and the target's verification costs (given by ``options.row_costs``, read from the kernel
    measurement, or measured on the drafting rows' kernels). Each model is left with the kernels chosen
    for plain decoding; the record's runners hold the cache kinds chosen. ``dtype``: what
    ``startup_dtype`` chose before loading, kept in the record. ``ImplausibleCosts`` (a ValueError)
    for ``options.row_costs`` that cannot be real, before anything is measured."""
    given = steps.given_costs(options)
    first = steps.model_step(target, "target", runner, options)
    second = None if drafter is None else steps.model_step(drafter, "drafter", drafter_runner or runner, options)
    costs = None
    if options.calibrate:
        draft = None if second is None else steps.drafter_step(drafter, target, first.runner, second.runner, options)
        rows = given or steps.row_costs_step(target, first.runner, first.kernels, options)
        costs = Costs(rows, draft)
    return Measured(first, second, dtype, costs, options.busy)


def startup_dtype(folder, options: Options) -> Finding:
    """The dtype for ``--dtype auto`` on CPU of the model in ``folder`` (a model worth measuring:
    ``--preset pair``): bfloat16 only where its matmuls measure clearly faster (``measure.dtype``),
    within its budget, or saved from an earlier start (``value``: "float32" or "bfloat16")."""
    return steps.dtype_step(folder, options)
