"""Start-up measurement: what runs fastest on this machine, measured once per machine, model and
settings, within budgets, and remembered. Above ``runners`` and ``utils`` (all it imports of the
project), below everything that decides or runs with it (``sampling``, ``eagle``, ``drafters``,
``strategies``, ``app``). It prints nothing: lines go to ``Options.say`` and the record's ``lines()``.

    entry.py    ``startup(target, runner, options, drafter)`` -> ``Measured``; ``saved_dtype``, ``measured_dtype`` (a model's two copies)
    steps.py    each measurement within its budget, or its saved result (the only caller of the files below)
    record.py   ``Measured``, ``Finding``, ``Costs``, ``Options``: what was measured and chosen, and how
    choose.py   ``choose_kernels``, ``choose_prepack``: a notebook's one call (decoding's kernels, then the prompt GEMM)
    timing.py   ``Budget``, ``PassTimer``, interleaved rounds; the kernels', cache's, verification and drafter timings
    kernels.py  ``KernelChoice`` (each row's kernels), giving a model its kernels, their part of a key
    costs.py    which verification costs can be real; ``measure_costs`` (now, no budget, not saved)
    pass_dtype.py  the CPU dtype by the model's own one-position pass, float32 against bfloat16
    dtype.py    a dtype by a matmul of a model's shape (EAGLE training's)
    prompt.py   the prompt pass's GEMM: a many-row variant and a chunk length, by timings of the model's own linears
    saved.py    results saved per machine, model and settings; their keys and shapes
    budgets.py  how long each measurement may take
    machine.py  the machine's load, its key, a result's environment
"""
from measure.choose import choose_kernels, choose_prepack
from measure.costs import ImplausibleCosts, measure_costs, plausible_row_costs
from measure.entry import measured_dtype, saved_dtype, startup
from measure.kernels import OWN, PREPACKED, KernelChoice, apply_kernels
from measure.machine import busy_note, machine_key, run_environment, versions_line
from measure.record import FIXED, GIVEN, MEASURED, REMEMBERED, Costs, Finding, Measured, ModelMeasured, Options
from measure.timing import (Budget, PassTimer, choose_cache, compared, drafting_cost, measure_draft_cost, measure_kernels,
                            measure_row_costs)

__all__ = [
    "Budget", "Costs", "FIXED", "Finding", "GIVEN", "ImplausibleCosts", "KernelChoice", "MEASURED", "Measured", "ModelMeasured",
    "OWN", "Options", "PREPACKED", "PassTimer", "REMEMBERED", "apply_kernels", "busy_note", "choose_cache", "choose_kernels",
    "choose_prepack", "compared", "drafting_cost", "machine_key", "measure_costs", "measure_draft_cost", "measure_kernels",
    "measure_row_costs", "measured_dtype", "plausible_row_costs", "run_environment", "saved_dtype", "startup", "versions_line",
]
