"""The start-up measurements of the REPL and the benchmark (``session``): the KV cache kind, the
kernels, the dtype, the target's verification costs and the drafter's cost. Each is announced on
stderr, runs within its budget (``utils.measurements.BUDGETS``) with a safe fallback, and is saved
per machine, model and settings, then reused on the next start unless ``remeasure``.

Only speed depends on them (kernels, cache kind, the policy's costs): never a generated token.
"""
import hashlib
import time
from pathlib import Path
from typing import Optional, Tuple

from torch.nn import Module

from runners.config import EAGER, RunnerConfig
from sampling import calibration
from sampling.draft_policy import DraftPolicy
from utils.measurements import (BUDGETS, Budget, Clock, Say, announce, finish_progress, machine_key, model_identity,
                                remembered, to_stderr)


EMBEDDED_PARAMETERS = 135e6  # the budgets are set for the embedded SmolLM2-135M
MAX_SCALE = 8.0


def budget_scale(model: Optional[Module]) -> float:
    """How many times the budgets a model gets: its parameters against the embedded model's (a pass
    of a 1.5B model costs about ten of SmolLM2's), at least 1, at most ``MAX_SCALE``."""
    if model is None:
        return 1.0
    return min(MAX_SCALE, max(1.0, sum(p.numel() for p in model.parameters()) / EMBEDDED_PARAMETERS))


def _budget(kind: str, what: str, clock: Clock, say: Say, model: Optional[Module] = None) -> Budget:
    """The budget of one measurement (``BUDGETS``, scaled by ``budget_scale(model)``), announced:
    "Measuring <what>, budget 3 s) ..."."""
    seconds = round(BUDGETS[kind] * budget_scale(model), 1)
    return Budget(seconds, clock, announce(f"Measuring {what}, budget {seconds:g} s) ...", say))


def _kernels(model: Module, runner: RunnerConfig = EAGER) -> dict:
    """What runs the model's passes besides its weights: prepacked linears, quantization, compilation."""
    from runners import prepacked
    from utils.quantization import model_quantization

    return {"prepacked": prepacked(model), "quantization": model_quantization(model) or "none",
            "compiled": runner.compiled_for(model)}


def _with_source(line: str, source: str) -> str:
    """``line`` ending in ")" with "; <source>" inside its parentheses."""
    return f"{line[:-1]}; {source})" if source and line.endswith(")") else line + (f" ({source})" if source else "")


def _check_choice(field: str, values: tuple):
    def check(result: dict) -> None:
        if result.get(field) not in values or not isinstance(result.get("line"), str):
            raise ValueError(f"expected {field} in {values} and a line")
    return check


def _check_kernels(result: dict) -> None:
    seconds = result.get("seconds")
    options = (calibration.PREPACKED, calibration.OWN)
    if not isinstance(seconds, dict) or set(seconds) != set(options) or not isinstance(result.get("line"), str):
        raise ValueError(f"expected seconds of {options} and a line")
    lengths = {len(seconds[o]) for o in options}
    if len(lengths) != 1 or not all(isinstance(t, (int, float)) and t > 0 for o in options for t in seconds[o]):
        raise ValueError("expected as many positive seconds for each option")


def startup_kernels(model: Module, role: str = "target", remeasure: bool = False, clock: Clock = time.perf_counter,
                    busy: bool = False, say: Say = to_stderr) -> Tuple[Optional["calibration.KernelChoice"], str]:
    """``calibration.choose_kernels`` within its budget, or its saved measurement: ``(choice, line)``
    (choice None: the model keeps its own linears, the line says why). The model gets the kernels
    that decode fastest; each row of a comparison then gets its own (``strategies.row_kernels``)."""
    from runners import drop_prepacked

    key = {**machine_key(), "model": model_identity(model), "context": 64, "repeats": 3, "max_rows": 12}

    def measure() -> Tuple[dict, bool]:
        budget = _budget("prepack", f"the {role}'s kernels (prepacked and own linears, 1-12 positions, 3 rounds", clock, say, model)
        choice, line = calibration.choose_kernels(model, budget=budget)
        finish_progress(budget.progress)
        seconds = {o: list(t) for o, t in choice.seconds.items()} if choice is not None else None
        return {"seconds": seconds, "line": line}, budget.stopped

    def check(result: dict) -> None:
        if result.get("seconds") is not None:
            _check_kernels(result)
        elif not isinstance(result.get("line"), str):
            raise ValueError("expected a line")

    result, source = remembered("kernels", key, measure, check, remeasure, busy, say)
    choice = None
    if result["seconds"] is not None:
        choice = calibration.KernelChoice({o: tuple(float(t) for t in times) for o, times in result["seconds"].items()})
    if source:  # reused: give the model what the saved measurement chose
        if choice is None:
            drop_prepacked(model)
        else:
            calibration.apply_kernels(model, choice, 1)
    return choice, _with_source(result["line"], source)


def startup_cache(model: Module, role: str = "target", remeasure: bool = False, clock: Clock = time.perf_counter,
                  busy: bool = False, say: Say = to_stderr) -> Tuple[str, str]:
    """``calibration.choose_cache`` within its budget, or its saved choice: ``(cache, line)``, the
    line for the header."""
    from runners import CACHES, runner_cache

    if runner_cache(model, "static") != "static":
        return calibration.choose_cache(model)  # nothing to measure
    key = {**machine_key(), "model": model_identity(model), **_kernels(model), "context": 256, "repeats": 7}

    def measure() -> Tuple[dict, bool]:
        budget = _budget("cache", f"the {role}'s KV cache (static and dynamic, 7 rounds", clock, say, model)
        cache, line = calibration.choose_cache(model, budget=budget)
        finish_progress(budget.progress)
        return {"cache": cache, "line": line}, budget.stopped

    result, source = remembered("cache", key, measure, _check_choice("cache", CACHES), remeasure, busy, say)
    return result["cache"], _with_source(result["line"], source)


def _policy_key(model: Module, runner: RunnerConfig) -> dict:
    return {"model": model_identity(model), **_kernels(model, runner), "cache": runner.cache_for(model)}


def _check_costs(result: dict) -> None:
    costs = result.get("costs")
    if not isinstance(costs, list) or not isinstance(result.get("note"), str):
        raise ValueError("expected a list of costs and a note")
    if costs and not calibration.plausible_row_costs(tuple(costs)):
        raise ValueError(f"costs {costs} are not plausible")


def verification_costs(target: Module, max_rows: int = 12, remeasure: bool = False, clock: Clock = time.perf_counter,
                       busy: bool = False, say: Say = to_stderr, runner: RunnerConfig = EAGER) -> Tuple[Tuple[float, ...], str]:
    """``(costs, note)``: the target's verification costs by positions 1..``max_rows``
    (``calibration.measure_row_costs``, taken again once when not plausible), within their budget
    or saved. A budget cut short: the positions timed, the rest extrapolated (the note says which);
    too short, or never plausible: () and the note says why (the policy keeps a constant length)."""
    key = {**machine_key(), **_policy_key(target, runner), "max_rows": max_rows}

    def measure() -> Tuple[dict, bool]:
        budget = _budget("verification", f"verification costs (1-{max_rows} positions", clock, say, target)
        costs: Tuple[float, ...] = ()
        for _ in range(2):
            costs = calibration.measure_row_costs(target, max_rows=max_rows, budget=budget, runner=runner)
            if calibration.plausible_row_costs(costs) or budget.exhausted():
                break
        finish_progress(budget.progress)
        plausible = calibration.plausible_row_costs(costs)
        if plausible:
            note = f"{budget.note}: {budget.reason}" if budget.stopped and budget.note else ""
        elif budget.stopped:
            note = f"Verification costs not measured (fallback: {budget.reason}): constant draft length"
        else:
            shown = " ".join(f"{c:.2f}" for c in costs)
            note = f"Verification costs measured twice and not plausible ({shown}): not used, constant draft length"
        return {"costs": list(costs) if plausible else [], "note": note}, budget.stopped or not plausible

    result, source = remembered("verification", key, measure, _check_costs, remeasure, busy, say)
    costs = tuple(float(c) for c in result["costs"])
    if not costs:
        return (), result["note"] + (f" ({source})" if source else "")
    return costs, "; ".join(part for part in (result["note"], source) if part)


def _check_cost(result: dict) -> None:
    cost = result.get("cost")
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 <= cost < 1e3 or not isinstance(result.get("note"), str):
        raise ValueError("expected a cost from 0 to 1000 and a note")


def draft_cost(drafter: Module, target: Module, remeasure: bool = False, clock: Clock = time.perf_counter,
               busy: bool = False, say: Say = to_stderr, runner: RunnerConfig = EAGER,
               drafter_runner: Optional[RunnerConfig] = None) -> Tuple[float, str]:
    """``(cost, note)``: a drafter pass against a target pass (``calibration.measure_draft_cost``)
    within its budget, or saved. Cut short before 2 rounds: the ratio of their parameter counts."""
    drafter_runner = drafter_runner or runner
    key = {**machine_key(), "drafter": _policy_key(drafter, drafter_runner), "target": _policy_key(target, runner)}

    def measure() -> Tuple[dict, bool]:
        budget = _budget("drafter", "the drafter's cost (7 rounds against the target", clock, say, target)
        cost = calibration.measure_draft_cost(drafter, target, budget=budget, runner=runner, drafter_runner=drafter_runner)
        finish_progress(budget.progress)
        if cost is None:
            ratio = sum(p.numel() for p in drafter.parameters()) / sum(p.numel() for p in target.parameters())
            return {"cost": round(ratio, 3), "note": f"fallback: the parameter counts' ratio, {budget.reason}"}, True
        return {"cost": cost, "note": f"{budget.note}: {budget.reason}" if budget.stopped and budget.note else ""}, budget.stopped

    result, source = remembered("drafter", key, measure, _check_cost, remeasure, busy, say)
    return float(result["cost"]), "; ".join(part for part in (result["note"], source) if part)


def startup_policy(target: Module, drafter: Optional[Module] = None, row_costs: Optional[Tuple[float, ...]] = None,
                   remeasure: bool = False, clock: Clock = time.perf_counter, busy: bool = False, say: Say = to_stderr,
                   kernel_choice: Optional["calibration.KernelChoice"] = None, runner: RunnerConfig = EAGER,
                   drafter_runner: Optional[RunnerConfig] = None, **policy) -> Tuple[DraftPolicy, str]:
    """``(policy, drafter note)``: ``calibration.calibrated_policy`` from the start-up measurements
    (or ``row_costs`` given, ``--row-costs``; or the costs of the drafting rows' kernels in
    ``kernel_choice``, not measured again), and what the drafter's cost line adds ("" or "(...)").
    ``runner``/``drafter_runner``: the configurations the rows run the models under."""
    policy.setdefault("min_gain", calibration.DEFAULT_MIN_GAIN)
    cost, drafter_note = (draft_cost(drafter, target, remeasure, clock, busy, say, runner, drafter_runner)
                          if drafter is not None else (0.0, ""))
    drafter_note = f" ({drafter_note})" if drafter_note else ""
    runs = dict(drafter=drafter, draft_cost=cost, runner=runner, drafter_runner=drafter_runner)
    if row_costs is not None:
        return calibration.calibrated_policy(target, row_costs=row_costs, **runs, **policy), drafter_note
    option = None if kernel_choice is None else kernel_choice.for_auto()
    if option is not None and len(kernel_choice.seconds[option]) >= 12 and calibration.plausible_row_costs(kernel_choice.row_costs(option)):
        return calibration.calibrated_policy(target, kernel_choice=kernel_choice, **runs, **policy), drafter_note
    from runners import kernels

    with kernels(target, None if option is None else option == calibration.PREPACKED):  # the drafting rows' kernels
        costs, note = verification_costs(target, remeasure=remeasure, clock=clock, busy=busy, say=say, runner=runner)
    if not costs:
        return DraftPolicy(draft_cost=cost, calibration=note, **policy), drafter_note
    return calibration.calibrated_policy(target, row_costs=costs, source=note, **runs, **policy), drafter_note


def startup_dtype(folder, prepack: bool, remeasure: bool = False, clock: Clock = time.perf_counter, busy: bool = False,
                  say: Say = to_stderr) -> Tuple[str, str]:
    """``utils.cpu_dtype.choose_for_folder`` within its budget, or its saved choice: ``(dtype, reason)``.
    Keyed by the folder's config (its layers' shape) rather than loaded weights: it runs before loading."""
    from utils.cpu_dtype import choose_for_folder

    config = (Path(folder) / "config.json").read_bytes()
    key = {**machine_key(), "model": Path(folder).name, "config": hashlib.sha256(config).hexdigest()[:16], "prepack": prepack}

    def measure() -> Tuple[dict, bool]:
        budget = _budget("dtype", "the dtype (float32 and bfloat16 matmuls of the model's shape", clock, say)
        dtype, reason = choose_for_folder(folder, prepack, budget=budget)
        return {"dtype": dtype, "line": reason}, budget.stopped

    result, source = remembered("dtype", key, measure, _check_choice("dtype", ("float32", "bfloat16")), remeasure, busy, say)
    return result["dtype"], result["line"] + (f" ({source})" if source else "")
