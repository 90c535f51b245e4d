"""The model's kernels: ``KernelChoice`` (what a kernel measurement decides for each row: prepacked or
own float32 CPU linear layers), giving the model its choice, and what a measurement's key says of them.
The one module of ``measure`` that switches a model's kernels (``runners.prepacking``); the timing that
feeds a ``KernelChoice`` is ``measure.timing.measure_kernels``."""
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional, Tuple

from torch.nn import Module

from runners.prepacking import drop_prepacked, kernels, prepack_fits, prepackable, prepacked, set_prepack
from utils.quantization import model_quantization

PREPACKED, OWN = "prepacked", "own"  # the kernel options of a float32 CPU model's linear layers
PREPACK_MARGIN = 0.95  # prepacking costs a copy of the weights: made only where some pass runs at least 5% faster
TYPICAL_ACCEPTANCE = 0.7  # per-draft acceptance assumed when a row's draft length is not fixed


@dataclass(frozen=True)
class KernelChoice:
    """Seconds of one cached pass of a model over r = 1..R new positions under each kernel option
    (``PREPACKED`` / ``OWN`` linear layers), measured on this machine: what decides, per row of a
    comparison, the kernels that give it the most tokens per second."""

    seconds: Dict[str, Tuple[float, ...]]

    def _better(self, rate: Callable[[str], float]) -> str:
        """The option with the higher ``rate`` (tokens per second); own layers when prepacking
        never pays clearly (``pays``): then its copy of the weights is not worth keeping."""
        return PREPACKED if self.pays() and rate(PREPACKED) > rate(OWN) else OWN

    def pays(self) -> bool:
        """Whether prepacking is clearly faster (``PREPACK_MARGIN``) for some pass length."""
        return any(p < PREPACK_MARGIN * o for p, o in zip(self.seconds[PREPACKED], self.seconds[OWN]))

    def for_width(self, rows: int) -> str:
        """The kernels for passes over ``rows`` positions (plain decoding: 1; a draft of g: g + 1;
        past the measured passes: the longest one's)."""
        rows = max(1, min(rows, len(self.seconds[OWN])))
        return self._better(lambda option: 1.0 / self.seconds[option][rows - 1])

    def for_auto(self, acceptance: float = TYPICAL_ACCEPTANCE) -> str:
        """The kernels for a row whose draft length varies: the option whose best pass length gives
        the most expected tokens per second at ``acceptance`` (Leviathan et al. 2023, section 3.5)."""
        def rate(option: str) -> float:
            return max((1 - acceptance ** r) / (1 - acceptance) / t for r, t in enumerate(self.seconds[option], 1))

        return self._better(rate)

    def uses(self, option: str) -> bool:
        """Whether some row (a pass length, or a varying one) would run on ``option``."""
        return option == self.for_auto() or any(self.for_width(r) == option for r in range(1, len(self.seconds[OWN]) + 1))

    def row_costs(self, option: str) -> Tuple[float, ...]:
        """Relative pass costs under ``option`` (r = 1 costs 1), as ``measure_row_costs`` gives them."""
        first = self.seconds[option][0]
        return tuple(round(t / first, 3) for t in self.seconds[option])

    def line(self) -> str:
        """One line: the plain-decoding choice, the drafting rows' and both options' costs."""
        one = {option: times[0] * 1e3 for option, times in self.seconds.items()}
        costs = " · ".join(f"{option} {' '.join(f'{c:.2f}' for c in self.row_costs(option))}" for option in (PREPACKED, OWN))
        return (f"kernels by measurement: decoding {one[PREPACKED]:.1f} ms a pass prepacked, {one[OWN]:.1f} ms own; "
                f"decoding on {self.for_width(1)}, drafting rows on {self.for_auto()} "
                f"(costs by positions 1..{len(self.seconds[OWN])}: {costs})")


def apply_kernels(model: Module, choice: Optional[KernelChoice], rows: int = 1) -> str:
    """Give ``model`` the kernels ``choice`` picks for passes over ``rows`` positions; the option's
    name ("" when nothing can be prepacked). The prepacked copies are freed when no row would use them."""
    if choice is None:
        return ""
    option = choice.for_width(rows)
    if choice.uses(PREPACKED):
        set_prepack(model, option == PREPACKED)
    else:
        drop_prepacked(model)
    return option


def decide(model: Module, choice: Optional[KernelChoice], budget=None) -> Tuple[Optional[KernelChoice], str]:
    """``(choice, line)`` for a kernel measurement just made (``measure.timing.measure_kernels``
    within ``budget``, a ``measure.timing.Budget``): the model gets the faster kernels for plain
    decoding; None (nothing timed under both options) keeps its own linears, and the line says why."""
    if choice is None:
        drop_prepacked(model)
        return None, f"the model's own linears (fallback: {budget.reason})"
    apply_kernels(model, choice, 1)
    cut = f"; {budget.note}: {budget.reason}" if budget is not None and budget.stopped and budget.note else ""
    return choice, choice.line()[:-1] + cut + ")"


def reuse(model: Module, choice: Optional[KernelChoice]) -> None:
    """Give ``model`` what a saved kernel measurement chose (None: its own linears)."""
    if choice is None:
        drop_prepacked(model)
    else:
        apply_kernels(model, choice, 1)


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
    """What runs the model's passes besides its weights, for a measurement's key: prepacked linears
    and quantization (the caller adds whether its passes are compiled)."""
    return {"prepacked": prepacked(model), "quantization": model_quantization(model) or "none"}


@contextmanager
def under(model: Module, option: Optional[str]) -> Iterator[None]:
    """A block with ``model`` on ``option``'s kernels (None: as they are), as before after it."""
    with kernels(model, None if option is None else option == PREPACKED):
        yield
