"""The model's kernels: ``KernelChoice`` (what a kernel measurement decides for each pass width: prepacked
or own float32 CPU linear layers), giving the model that plan, and what a measurement's key says of them.
The one module of ``measure`` that switches a model's kernels (``runners.prepacking``); the timing that
feeds a ``KernelChoice`` is ``measure.timing.measure_kernels``."""
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from torch.nn import Module

from runners.prepacking import drop_prepacked, plan, prepack_fits, prepackable, set_prepack
from utils.quantization import model_quantization

PREPACKED, OWN = "prepacked", "own"  # the kernel options of a float32 CPU model's linear layers
PREPACK_MARGIN = 0.95  # prepacking costs a copy of the weights: made only where some pass runs at least 5% faster


@dataclass(frozen=True)
class KernelChoice:
    """Seconds of one cached pass of a model over r = 1..R new positions under each kernel option
    (``PREPACKED`` / ``OWN`` linear layers), measured on this machine: what decides, for each pass
    width, the kernels it runs on (``own_at``). Every row runs the same plan, so a drafting row's
    one-position passes cost what target AR's cost."""

    seconds: Dict[str, Tuple[float, ...]]

    def pays(self) -> bool:
        """Whether prepacking is clearly faster (``PREPACK_MARGIN``) for some pass length: otherwise
        its copy of the weights is not worth keeping."""
        return any(p < PREPACK_MARGIN * o for p, o in zip(self.seconds[PREPACKED], self.seconds[OWN]))

    def widths(self) -> int:
        return len(self.seconds[OWN])

    def for_width(self, rows: int) -> str:
        """The kernels of a pass over ``rows`` positions (past the measured passes: the longest one's)."""
        i = max(1, min(rows, self.widths())) - 1
        return PREPACKED if self.pays() and self.seconds[PREPACKED][i] < self.seconds[OWN][i] else OWN

    def own_at(self) -> Tuple[bool, ...]:
        """By pass width 1..R, whether it runs the model's own layers (``set_prepack``'s plan)."""
        return tuple(self.for_width(r) == OWN for r in range(1, self.widths() + 1))

    def uses(self, option: str) -> bool:
        """Whether some pass width runs on ``option``."""
        return any(self.for_width(r) == option for r in range(1, self.widths() + 1))

    def label(self) -> str:
        """What the passes run on: "own", "prepacked", or by width ("own at 1-2, prepacked at 3+ positions")."""
        return plan_label(self.own_at() if self.uses(PREPACKED) else None)

    def row_costs(self, option: Optional[str] = None) -> Tuple[float, ...]:
        """Relative pass costs (r = 1 costs 1), as ``measure_row_costs`` gives them: of the chosen plan
        (each width on its faster kernels), or of one ``option`` throughout."""
        times = (self.seconds[option] if option is not None else
                 tuple(self.seconds[self.for_width(r)][r - 1] for r in range(1, self.widths() + 1)))
        return tuple(round(t / times[0], 3) for t in times)

    def line(self) -> str:
        """One line: both options' one-position passes, the plan, and the costs of the plan and of both options."""
        one = {option: times[0] * 1e3 for option, times in self.seconds.items()}
        costs = " · ".join(f"{name} {' '.join(f'{c:.2f}' for c in self.row_costs(option))}"
                           for name, option in (("chosen", None), (PREPACKED, PREPACKED), (OWN, OWN)))
        return (f"kernels by measurement: decoding {one[PREPACKED]:.1f} ms a pass prepacked, {one[OWN]:.1f} ms own; "
                f"every pass on {self.label()} (costs by positions 1..{self.widths()}: {costs})")


def plan_label(own_at: Optional[Sequence[bool]]) -> str:
    """The name of a kernel plan (``runners.prepacking.plan``): "own" (None, or own at every width),
    "prepacked" (at every width), else the widths of each, e.g. "own at 1-2, prepacked at 3+ positions"."""
    if own_at is None or (own_at and all(own_at)):
        return OWN
    if not any(own_at):
        return PREPACKED
    ranges, start = [], 1
    for width in range(2, len(own_at) + 2):
        if width > len(own_at) or own_at[width - 1] != own_at[start - 1]:
            name = OWN if own_at[start - 1] else PREPACKED
            ranges.append(f"{name} at {start}" + ("+" if width > len(own_at) else f"-{width - 1}" if width - 1 > start else ""))
            start = width
    return ", ".join(ranges) + " positions"


def label_plan(label: str) -> bool | Tuple[bool, ...]:
    """The plan ``plan_label`` named (False: the model's own layers; True: prepacked at every width)."""
    if label == OWN:
        return False
    if label == PREPACKED:
        return True
    own_at = []
    for part in label.removesuffix(" positions").split(", "):
        name, _, widths = part.partition(" at ")
        first, _, last = widths.rstrip("+").partition("-")
        own_at += [name == OWN] * (int(last or first) - int(first) + 1)
    return tuple(own_at)


def model_label(model: Module) -> str:
    """``plan_label`` of what ``model``'s linear layers run now."""
    return plan_label(plan(model))


def apply_kernels(model: Module, choice: Optional[KernelChoice]) -> str:
    """Give ``model`` the plan ``choice`` measured (each pass width on its faster kernels); its label.
    The prepacked copies are freed when no width would use them."""
    if choice is None:
        return ""
    if choice.uses(PREPACKED):
        set_prepack(model, True, choice.own_at())
    else:
        drop_prepacked(model)
    return choice.label()


def decide(model: Module, choice: Optional[KernelChoice], budget=None) -> Tuple[Optional[KernelChoice], str]:
    """``(choice, line)`` for a kernel measurement just made (``measure.timing.measure_kernels``
    within ``budget``, a ``measure.timing.Budget``): the model gets the faster kernels for plain
    decoding; None (nothing timed under both options) keeps its own linears, and the line says why."""
    if choice is None:
        drop_prepacked(model)
        return None, f"the model's own linears (fallback: {budget.reason})"
    apply_kernels(model, choice)
    cut = f"; {budget.note}: {budget.reason}" if budget is not None and budget.stopped and budget.note else ""
    return choice, choice.line()[:-1] + cut + ")"


def reuse(model: Module, choice: Optional[KernelChoice]) -> None:
    """Give ``model`` what a saved kernel measurement chose (None: its own linears)."""
    if choice is None:
        drop_prepacked(model)
    else:
        apply_kernels(model, choice)


def measurable(model: Module) -> bool:
    """Whether ``model`` has float32 CPU linear layers that could be prepacked: a choice to measure."""
    return bool(prepackable(model))


def by_flag(model: Module, on: bool) -> None:
    """``--prepack on`` / ``off`` (or nothing to measure): the model's linears prepacked or its own."""
    set_prepack(model, on)


def would_prepack(prepack: bool, size: int) -> bool:
    """Whether float32 linear layers of ``size`` bytes would be prepacked with ``--prepack`` on or auto
    (``prepack``): oneDNN is there and the copy fits in memory."""
    return prepack and prepack_fits(size)


def identity(model: Module) -> Dict[str, object]:
    """What runs the model's passes besides its weights, for a measurement's key: its kernel plan
    (``model_label``) and quantization (the caller adds whether its passes are compiled)."""
    return {"kernels": model_label(model), "quantization": model_quantization(model) or "none"}
