"""Each start-up measurement within its budget, or its saved result: the kernels, the KV cache kind,
the CPU dtype, the verification costs and the drafter's cost. A step announces itself
(``Options.say``: "Measuring ..., budget 3 s) ..."), runs within ``measure.budgets`` with a safe
fallback, is saved per machine, model and settings (``measure.saved``) and reused on the next start
unless ``Options.remeasure`` (or it was noisy and the machine is quiet now). Every step returns a
``Finding``. Called by ``measure.entry`` only; the calls below (timing, kernels, saved, dtype) are
made from here.

Only speed depends on them (kernels, cache kind, the policy's costs): never a generated token."""
import hashlib
from pathlib import Path
from typing import Callable, Optional, Tuple, TypeVar

from torch.nn import Module

import measure.pass_dtype as pass_dtype
import measure.kernels as kernels
import measure.prompt as prompt
import measure.saved as saved
import measure.timing as timing
from measure.budgets import budget_seconds
from measure.costs import checked, costs_line, draft_cost_line, implausible_line, plausible_row_costs
from measure.kernels import KernelChoice
from measure.machine import machine_key
from measure.record import FIXED, GIVEN, MEASURED, REMEMBERED, Finding, ModelMeasured, Options
from kernels import skinny
from measure.budgets import parameter_count
from runners.cache_kind import runner_cache
from runners.config import RunnerConfig
from runners.device import model_device
from utils.load import over_busy

MAX_ROWS = 12  # positions the verification costs are measured for (1..12)
T = TypeVar("T")


def under_load(run: Callable[[], T], options: Options) -> Tuple[T, str]:
    """``run()`` inside a window of ``options.meter``, and "" or, where the other processes used more than
    ``BUSY`` cores over it, the words for it (said, and kept with the result): "measured under load: other
    processes used 1.50 cores". The load average read before loading (``Options.busy``) lags a minute: a start
    that begins as other work begins would save every measurement as quiet without this window."""
    meter = options.meter()
    meter.start()
    value = run()
    cores = over_busy(meter.stop())
    if cores is None:
        return value, ""
    note = f"measured under load: other processes used {cores:.2f} cores"
    options.say(f"{note}; saved as noisy, a quiet start measures it again")
    return value, note


def remembered(kind: str, key: dict, measure: Callable[[], Tuple[dict, bool]], options: Options) -> Tuple[dict, str, bool]:
    """``(result, when, noisy)``: the result saved for ``kind`` and ``key`` (``when`` its date) unless
    ``options.remeasure``, or unless it was noisy and the machine is quiet now (a better measurement is
    possible); else ``measure()`` (the result and whether its budget stopped it) in a load window
    (``under_load``: its words kept as the result's "load"), saved, ``when`` "". Noisy: a busy start, a budget
    that stopped it, or other processes' work over it."""
    found = None
    if not options.remeasure:
        found, problem = saved.recall(kind, key)
        if problem:
            options.say(f"ignoring unreadable measurement {saved.saved_path(kind, key)}: {problem}; measuring again")
    if found is not None and not (found.noisy and not options.busy):
        return found.result, found.when, found.noisy
    (result, stopped), load = under_load(measure, options)
    result = {**result, "load": load} if load else result
    noisy = bool(options.busy) or stopped or bool(load)
    try:
        saved.save(kind, key, result, noisy=noisy)
    except OSError as error:  # a read-only cache: measured, not saved
        options.say(f"could not save the measurement in {saved.measurements_dir()}: {error.strerror}")
    return result, "", noisy


def _budget(kind: str, what: str, options: Options, model: Optional[Module] = None) -> timing.Budget:
    """The budget of one measurement (``BUDGETS``, scaled by the model's size), announced:
    "Measuring <what>, budget 3 s) ..."."""
    seconds = budget_seconds(kind, model)
    options.say(f"Measuring {what}, budget {seconds:g} s) ...")
    return timing.Budget(seconds, options.clock, options.progress)


def _found(value, line: str, when: str, noisy: bool) -> Finding:
    return Finding(value, line, REMEMBERED if when else MEASURED, when, noisy)


def _reused(when: str) -> str:
    return f"reused from {when}" if when else ""


def _source(result: dict, when: str) -> str:
    """Where ``result`` came from, for its line: the load it was measured under (``under_load``), and its date if reused."""
    load = result.get("load")
    return "; ".join(part for part in (load if isinstance(load, str) else "", _reused(when)) if part)


def _with_source(line: str, source: str) -> str:
    """``line`` ending in ")" with "; <source>" inside its parentheses."""
    return f"{line[:-1]}; {source})" if source and line.endswith(")") else line + (f" ({source})" if source else "")


def _model_key(model: Module, runner: RunnerConfig) -> dict:
    """A model as a measurement of its passes depends on it: identity, kernels and the library they are built in (the
    C step's and the skinny kernel's: another build may cost a pass's width otherwise; the bfloat16 pair's saved
    verification costs, 1.37 at 12 positions from a day's first start, measured 2.7 on a build of that afternoon),
    compiled, cache kind. On a GPU no library: none is built for it."""
    build = skinny.identity() if model_device(model).type == "cpu" else "none"
    return {"model": saved.model_identity(model), **kernels.identity(model), "build": build,
            "compiled": runner.compiled_for(model), "cache": runner.cache_for(model),
            **({"llama.cpp": runner.gguf} if runner.gguf is not None else {}),
            **({"forward": "lean"} if runner.lean_for(model) else {}), **({"forward": "step"} if runner.step_for(model) else {})}


def kernels_step(model: Module, role: str, runner: RunnerConfig, options: Options) -> Finding:
    """The model's kernels: measured (``--prepack auto``: ``measure_kernels``, the model given the
    faster for decoding), or saved and given back to it; a flag's, or the compiled graphs' (the app
    froze them before compiling), with nothing measured. ``value``: the ``KernelChoice`` or None."""
    if runner.compiled_for(model):
        line = "compiled: own linears frozen, kernels by --gemm" if options.prepack == "auto" and kernels.measurable(model) else ""
        return Finding(None, line, GIVEN)
    if options.prepack != "auto" or not kernels.measurable(model):
        kernels.by_flag(model, options.prepack == "on")
        return Finding(None, "", GIVEN if options.prepack != "auto" else FIXED)
    key = {**machine_key(), "model": saved.model_identity(model), "context": 64, "repeats": 3, "max_rows": 12,
           "plan": "one family", "skinny": skinny.identity(), **({"forward": "lean"} if runner.lean_for(model) else {})}

    def measure() -> Tuple[dict, bool]:
        budget = _budget("prepack", f"the {role}'s kernels ({timing.kernel_options_text()}, 1-12 positions, 3 rounds", options, model)
        choice, line = kernels.decide(model, timing.measure_kernels(model, budget=budget, runner=runner), budget)
        budget.finish()
        seconds = {o: list(t) for o, t in choice.seconds.items()} if choice is not None else None
        return {"seconds": seconds, "line": line}, budget.stopped

    result, when, noisy = remembered("kernels", key, measure, options)
    choice = None
    if result["seconds"] is not None:
        choice = KernelChoice({o: tuple(float(t) for t in times) for o, times in result["seconds"].items()})
    if when:  # reused: give the model what the saved measurement chose
        kernels.reuse(model, choice)
    return _found(choice, _with_source(result["line"], _source(result, when)), when, noisy)


def cache_step(model: Module, role: str, options: Options) -> Finding:
    """The KV cache kind (``choose_cache``) within its budget, or its saved choice; ``value``: "static" or "dynamic"."""
    if runner_cache(model, "static") != "static":
        return Finding(*timing.choose_cache(model), FIXED)  # nothing to measure
    key = {**machine_key(), "model": saved.model_identity(model), **kernels.identity(model), "compiled": False,
           "context": 256, "repeats": 7}

    def measure() -> Tuple[dict, bool]:
        budget = _budget("cache", f"the {role}'s KV cache (static and dynamic, 7 rounds", options, model)
        cache, line = timing.choose_cache(model, budget=budget)
        budget.finish()
        return {"cache": cache, "line": line}, budget.stopped

    result, when, noisy = remembered("cache", key, measure, options)
    return _found(result["cache"], _with_source(result["line"], _source(result, when)), when, noisy)


def prompt_step(model: Module, role: str, runner: RunnerConfig, options: Options) -> Optional[Finding]:
    """The GEMM of the model's long passes (``measure.prompt``: a many-row variant and a chunk length,
    given to the model, ``kernels.prompt_gemm.set_plan``) within its budget, or saved; None where its long
    passes do not run the float32 C step. A budget spent first: the default plan, and the line says so.
    ``value``: {"tile": variant, "chunk": positions}."""
    if not prompt.measurable(model, runner.lean_for(model) and not runner.compiled_for(model)):
        return None
    from kernels.prompt_gemm import DEFAULT, describe, set_plan

    key = {**machine_key(), "model": saved.model_identity(model), "skinny": skinny.identity(), "rows": prompt.ROWS,
           "chunks": list(prompt.CHUNKS), "repeats": prompt.REPEATS}

    def measure() -> Tuple[dict, bool]:
        budget = _budget("prompt", f"the {role}'s prompt GEMM (its many-row variants over {prompt.ROWS} positions, then chunks of "
                         f"{'/'.join(map(str, prompt.CHUNKS))}, {prompt.REPEATS} rounds", options, model)
        choice, names = prompt.measure_model(model, budget)
        budget.finish()
        if choice is None:
            return {"tiles": None, "line": f"{describe(DEFAULT, skinny.library())} (fallback: {budget.reason})"}, True
        cut = f"; {budget.reason}: chunk lengths not all timed" if budget.stopped else ""
        return {**choice.as_result(), "line": choice.line(names, skinny.library())[:-1] + cut + ")"}, budget.stopped

    result, when, noisy = remembered("prompt", key, measure, options)
    plan = DEFAULT if result["tiles"] is None else prompt.PromptChoice.from_result(result).plan()
    set_plan(model, plan)
    return _found({"tile": plan.tile, "chunk": plan.chunk or prompt.DEFAULT_CHUNK}, _with_source(result["line"], _source(result, when)),
                  when, noisy)


def model_step(model: Module, role: str, runner: RunnerConfig, options: Options) -> ModelMeasured:
    """One model's kernels, its long passes' GEMM where they run the C step, then (``--cache auto``,
    eager on CPU, transformers' forward) its KV cache kind, put in its runner; the lean forward
    (``runners.lean``) has one cache kind, static."""
    found = kernels_step(model, role, runner, options)
    long_passes = prompt_step(model, role, runner, options)
    if (options.cache != "auto" or runner.compiled_for(model) or runner.gguf is not None or model_device(model).type != "cpu"
            or runner.lean_for(model)):
        return ModelMeasured(role, runner, found, prompt=long_passes)
    cache = cache_step(model, role, options)
    return ModelMeasured(role, runner.with_(cache=cache.value), found, cache, long_passes)


def given_costs(options: Options) -> Optional[Finding]:
    """``--row-costs``: the costs given, checked (``ImplausibleCosts``), or None when none were."""
    if options.row_costs is None:
        return None
    costs = checked(options.row_costs)
    return Finding(costs, costs_line(costs, "given, not measured"), GIVEN)


def verification_step(target: Module, runner: RunnerConfig, options: Options) -> Finding:
    """The target's verification costs by positions (``measure_row_costs``, taken again once when not
    plausible) within their budget, or saved. A budget cut short: the positions timed, the rest
    extrapolated (the line says which); too short, or never plausible: () and the line says why."""
    key = {**machine_key(), **_model_key(target, runner), "max_rows": MAX_ROWS}

    def measure() -> Tuple[dict, bool]:
        budget = _budget("verification", f"verification costs (1-{MAX_ROWS} positions", options, target)
        costs: Tuple[float, ...] = ()
        for _ in range(2):
            costs = timing.measure_row_costs(target, max_rows=MAX_ROWS, budget=budget, runner=runner)
            if plausible_row_costs(costs) or budget.exhausted():
                break
        budget.finish()
        plausible = plausible_row_costs(costs)
        if plausible:
            note = f"{budget.note}: {budget.reason}" if budget.stopped and budget.note else ""
        elif budget.stopped:
            note = f"Verification costs not measured (fallback: {budget.reason}): constant draft length"
        else:
            note = implausible_line(costs)
        return {"costs": list(costs) if plausible else [], "note": note}, budget.stopped or not plausible

    result, when, noisy = remembered("verification", key, measure, options)
    costs, source = tuple(float(c) for c in result["costs"]), _source(result, when)
    if not costs:
        return _found((), result["note"] + (f" ({source})" if source else ""), when, noisy)
    return _found(costs, costs_line(costs, "; ".join(part for part in (result["note"], source) if part)), when, noisy)


def row_costs_step(target: Module, runner: RunnerConfig, choice: Finding, options: Options) -> Finding:
    """The verification costs the calibrated policy reads: those of the kernel plan (each pass width on
    its faster kernels) from the kernel measurement (``choice``) when it covers 1-12 positions
    plausibly, else measured on the model as it is (``verification_step``)."""
    kernel_choice: Optional[KernelChoice] = choice.value
    if kernel_choice is not None and kernel_choice.widths() >= MAX_ROWS and plausible_row_costs(kernel_choice.row_costs()):
        costs = kernel_choice.row_costs()
        return Finding(costs, costs_line(costs, f"{kernel_choice.label()}, from the kernel measurement"), choice.source,
                       choice.when, choice.noisy)
    return verification_step(target, runner, options)  # on the kernels the model was given, as every row runs


def drafter_step(drafter: Module, target: Module, runner: RunnerConfig, drafter_runner: RunnerConfig, options: Options,
                 head: int = 0) -> Finding:
    """A drafter pass as it drafts (under ``drafter_runner``, with ``head`` output rows: ``RunnerConfig.drafter_head``,
    0 every row) against a target pass (``timing.drafting_cost``) within its budget, or saved: keyed by those rows too
    (a cut head's pass costs less: a cost saved at another count is measured again). Cut short before 2 rounds: the
    ratio of their parameter counts. ``value``: the cost."""
    drafter_runner = drafter_runner.with_(drafter_head=head)
    key = {**machine_key(), "drafter": _model_key(drafter, drafter_runner), "target": _model_key(target, runner),
           **({"rows": head} if head else {})}  # every row: the key costs saved before rows were keyed had

    def measure() -> Tuple[dict, bool]:
        budget = _budget("drafter", "the drafter's cost (7 rounds against the target", options, target)
        cost, rows = timing.drafting_cost(drafter, target, budget=budget, runner=runner, drafter_runner=drafter_runner)
        budget.finish()
        if cost is None:
            ratio = parameter_count(drafter) / parameter_count(target)
            return {"cost": round(ratio, 3), "note": f"fallback: the parameter counts' ratio, {budget.reason}", "rows": None}, True
        return {"cost": cost, "note": f"{budget.note}: {budget.reason}" if budget.stopped and budget.note else "", "rows": rows}, budget.stopped

    result, when, noisy = remembered("drafter", key, measure, options)
    cost, note = float(result["cost"]), "; ".join(part for part in (result["note"], _source(result, when)) if part)
    return _found(cost, draft_cost_line(cost, result.get("rows"), note), when, noisy)


def _dtype_key(folder) -> dict:
    """What the dtype race depends on: the machine, the model (its folder's name and config: keyed before
    loading, so that a saved result loads one copy) and the C step's library build."""
    config = (Path(folder) / "config.json").read_bytes()
    return {**machine_key(), "model": Path(folder).name, "config": hashlib.sha256(config).hexdigest()[:16],
            "pass": "one position", "skinny": skinny.identity()}


def saved_dtype(folder, options: Options) -> Optional[Finding]:
    """The dtype an earlier start measured for the model in ``folder`` on this machine, or None (none saved,
    ``Options.remeasure``, unreadable, or noisy while the machine is quiet now): then ``dtype_step`` measures."""
    if options.remeasure:
        return None
    key = _dtype_key(folder)
    found, problem = saved.recall("pass-dtype", key)
    if problem:
        options.say(f"ignoring unreadable measurement {saved.saved_path('pass-dtype', key)}: {problem}; measuring again")
    if found is None or (found.noisy and not options.busy):
        return None
    return _found(found.result["dtype"], f"{found.result['line']} ({_source(found.result, found.when)})", found.when, found.noisy)


def dtype_step(folder, float32_model: Module, bfloat16_model: Module, role: str, options: Options) -> Finding:
    """The CPU dtype of the model in ``folder``: its two copies' one-position passes raced within the
    budget (``measure.pass_dtype``), saved for the next start (``saved_dtype``). ``value``: "float32" or "bfloat16"."""
    weights = sum(p.numel() * p.element_size() for m in (float32_model, bfloat16_model) for p in m.parameters())
    budget = _budget("dtype", f"the {role}'s dtype (one-position passes in float32 and bfloat16, "
                     f"{pass_dtype.ROUNDS} alternating rounds", options, float32_model)
    found, load = under_load(lambda: pass_dtype.race(*timing.dtype_race((float32_model, bfloat16_model), budget,
                                                                       pass_dtype.ROUNDS)), options)
    budget.finish()
    chosen, line = pass_dtype.choose(found, budget, pass_dtype.where_read(weights))
    result = {"dtype": chosen, "line": line, **({"load": load} if load else {})}  # as ``remembered`` keeps it
    kernels.as_loaded(float32_model if chosen == "float32" else bfloat16_model)  # the other one is the caller's to free
    noisy = bool(options.busy) or budget.stopped or bool(load)
    try:
        saved.save("pass-dtype", _dtype_key(folder), result, noisy=noisy)
    except OSError as error:  # a read-only cache: measured, not saved
        options.say(f"could not save the measurement in {saved.measurements_dir()}: {error.strerror}")
    return _found(chosen, f"{line} ({load})" if load else line, "", noisy)
