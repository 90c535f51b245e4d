"""What the start-up measured and chose, as one immutable record (``Measured``), and how it is asked
to measure (``Options``). Each figure or choice is a ``Finding``: its value, the line the programs
print about it, where it came from (``MEASURED`` now, ``REMEMBERED`` from an earlier start,
``GIVEN`` by a flag, ``FIXED`` with nothing to measure) and whether it is noisy."""
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from measure.kernels import KernelChoice
from runners.config import RunnerConfig
from utils.load import Meter, start_up_meter

Say = Callable[[str], None]  # one line (an announcement, a saved file ignored or not written)
Clock = Callable[[], float]  # seconds
Progress = Callable[[int, int], None]  # (passes done, passes planned); (0, 0): the measurement is over

MEASURED, REMEMBERED, GIVEN, FIXED = "measured", "remembered", "given", "fixed"


def silent(line: str) -> None:
    """The default ``Options.say``: the record's lines are printed by the programs, not here."""


@dataclass(frozen=True)
class Options:
    """How the start-up measures: the programs' flags, and where its lines go (``measure`` prints nothing)."""

    prepack: str = "auto"  # --prepack: "auto" measures both kernel options; "on" / "off" give one
    cache: Optional[str] = "auto"  # --cache: "auto" measures the kind on CPU; else the runner holds the one given
    calibrate: bool = True  # measure the costs the calibrated policy reads (--no-calibrate: False)
    row_costs: Optional[Tuple[float, ...]] = None  # --row-costs: verification costs given, not measured
    remeasure: bool = False  # --remeasure: measure again rather than reuse what an earlier start saved
    busy: str = ""  # the load hint read before loading (``machine.busy_note``): not "", every result is noisy
    say: Say = silent  # a line as each measurement starts
    progress: Optional[Progress] = None  # between passes (a terminal's progress bar); None: nothing drawn
    clock: Clock = time.perf_counter  # what budgets are counted in (tests: a fake one)
    # a new meter for each measurement's window: the other processes' cores over it (above utils.load.BUSY: saved noisy)
    meter: Callable[[], Meter] = start_up_meter


@dataclass(frozen=True)
class Finding:
    """One start-up figure or choice: ``value``, the ``line`` said about it, its ``source``, ``when``
    it was measured (remembered ones: "YYYY-MM-DD HH:MM"), and ``noisy`` (measured on a busy machine, beside
    other processes' work, or cut short by its budget; the line names the load, the budget's fallback or what it cut)."""

    value: Any
    line: str = ""
    source: str = MEASURED
    when: str = ""
    noisy: bool = False

    def as_dict(self) -> dict:
        value = self.value
        if isinstance(value, KernelChoice):  # seconds a pass, by option and positions
            value = {option: list(times) for option, times in value.seconds.items()}
        elif isinstance(value, tuple):
            value = list(value)
        return {"value": value, "line": self.line, "source": self.source, "when": self.when, "noisy": self.noisy}


@dataclass(frozen=True)
class ModelMeasured:
    """One model's runner (its KV cache kind chosen) and kernels (``value``: a ``KernelChoice``, or None:
    a flag's, compiled, nothing to prepack, or a fallback to its own linears); ``cache`` None where the
    kind was not measured (given by --cache, compiled, not on CPU); ``prompt`` its long passes' GEMM
    (``measure.prompt``: ``value`` {"tile", "chunk"}), None where they do not run the float32 C step."""

    role: str  # "target" or "drafter"
    runner: RunnerConfig
    kernels: Finding
    cache: Optional[Finding] = None
    prompt: Optional[Finding] = None

    def as_dict(self) -> dict:
        return {"runner": {"cache": self.runner.cache, "compile": self.runner.compile}, "kernels": self.kernels.as_dict(),
                "cache": None if self.cache is None else self.cache.as_dict(),
                "prompt": None if self.prompt is None else self.prompt.as_dict()}


@dataclass(frozen=True)
class Costs:
    """What the calibrated policy reads: the target's verification costs (``value``: by positions
    1..N relative to one, () when none usable) and a drafter model's pass cost (None without one)."""

    row_costs: Finding
    draft_cost: Optional[Finding] = None


@dataclass(frozen=True)
class Measured:
    """Everything the start-up measured and chose (``measure.entry.startup``). ``costs`` None: not
    asked (--no-calibrate); ``dtype`` None: not chosen by measurement; ``busy``: the load hint."""

    target: ModelMeasured
    drafter: Optional[ModelMeasured] = None
    dtype: Optional[Finding] = None
    costs: Optional[Costs] = None
    busy: str = ""

    def noisy(self) -> bool:
        """Whether any figure is noisy (a busy machine, a budget cut short)."""
        models = [m for m in (self.target, self.drafter) if m is not None]
        found = [m.kernels for m in models] + [m.cache for m in models] + [m.prompt for m in models] + [self.dtype]
        found += [self.costs.row_costs, self.costs.draft_cost] if self.costs is not None else []
        return bool(self.busy) or any(f is not None and f.noisy for f in found)

    def notes(self, role: str) -> Dict[str, str]:
        """The header's words on ``role``'s model: {"cache": ..., "kernels": ..., "prompt": ...} where they were chosen here."""
        model = self.target if role == "target" else self.drafter
        if model is None:
            return {}
        notes = {"cache": model.cache.line} if model.cache is not None else {}
        notes = {**notes, "kernels": model.kernels.line} if model.kernels.line else notes
        return {**notes, "prompt": model.prompt.line} if model.prompt is not None and model.prompt.line else notes

    def lines(self) -> List[str]:
        """What the programs print after the header: the verification costs and the drafter's cost."""
        if self.costs is None:
            return []
        draft = self.costs.draft_cost
        return [self.costs.row_costs.line + (f" · {draft.line}" if draft is not None else "")]

    def as_dict(self) -> dict:
        """The record as JSON (the benchmark writes it with each run)."""
        costs = self.costs
        return {"target": self.target.as_dict(), "drafter": None if self.drafter is None else self.drafter.as_dict(),
                "dtype": None if self.dtype is None else self.dtype.as_dict(),
                "row_costs": None if costs is None else costs.row_costs.as_dict(),
                "draft_cost": None if costs is None or costs.draft_cost is None else costs.draft_cost.as_dict(),
                "busy": self.busy, "noisy": self.noisy()}
