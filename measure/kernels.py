"""The model's kernels: ``KernelChoice`` (what a kernel measurement decides for each pass width: prepacked
or own float32 CPU linear layers), giving the model that plan, and what a measurement's key says of them.
The one module of ``measure`` that switches a model's kernels (``kernels.prepacking``); the timing that
feeds a ``KernelChoice`` is ``measure.timing.measure_kernels``."""
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from torch.nn import Module

from kernels.holding import hold
from kernels.plans import drop_blocked_copies, drop_packed_copies, label_plan, plan_label  # noqa: F401 (label_plan: importable from here)
from kernels.prepacking import OWN, PREPACKED, SKINNY, drop_prepacked, plan, prepackable, set_prepack
from kernels import skinny
from utils.quantization import model_quantization

PREPACK_MARGIN = 0.95  # prepacking costs a copy of the weights: made only where some pass runs at least 5% faster
OPTIONS = (OWN, PREPACKED, SKINNY)  # every kernel a plan may name, in the order labels and lines list them


@dataclass(frozen=True)
class KernelChoice:
    """Seconds of one cached pass of a model over r = 1..R new positions under each kernel option
    measured on this machine (``OWN``, ``PREPACKED``, and ``SKINNY`` where it builds): what decides,
    for each pass width, the kernels it runs on (``route``). Every row runs the same plan, so a
    drafting row's one-position passes cost what target AR's cost."""

    seconds: Dict[str, Tuple[float, ...]]

    def pays(self) -> bool:
        """Whether prepacking is clearly faster (``PREPACK_MARGIN``) for some pass length than the
        fastest other option: otherwise its copy of the weights is not worth keeping."""
        others = [o for o in self.seconds if o != PREPACKED]
        return PREPACKED in self.seconds and any(
            self.seconds[PREPACKED][i] < PREPACK_MARGIN * min(self.seconds[o][i] for o in others) for i in range(self.widths()))

    def widths(self) -> int:
        return len(self.seconds[OWN])

    def options(self) -> Tuple[str, ...]:
        """The options a plan may use: the measured ones, less prepacking where it does not pay."""
        return tuple(o for o in OPTIONS if o in self.seconds and (o != PREPACKED or self.pays()))

    def family(self) -> str:
        """The one kernel every measured width runs on: the option with the least one-position pass plus
        mean pass over 1..R (decoding and verification weighted alike). One family, not the faster
        option width by width: a position's product then does not depend on how many positions share
        its pass (the skinny kernel sums each row alone), so a drafting row verifies on what target AR
        decodes on, and noise between close options cannot make the plan alternate by width."""
        def score(option: str) -> float:
            times = self.seconds[option][: self.widths()]
            return times[0] + sum(times) / len(times)

        return min(self.options(), key=score)

    def for_width(self, rows: int) -> str:
        """The kernels of a pass over ``rows`` positions: ``family()`` up to the measured widths; past
        them (a prompt), the skinny kernel where it is the family (not measured there: its register
        tiles of 12 rows run near the core's arithmetic peak on many rows, ahead of MKL, and a prompt on
        the kernel decoding runs is exact by construction, docs/profile.md), else the faster at the
        longest measured width of the options made for any number of rows."""
        if rows <= self.widths() or self.family() == SKINNY:
            return self.family()
        options = [o for o in self.options() if o != SKINNY]
        return min(options, key=lambda o: self.seconds[o][self.widths() - 1])

    def route(self) -> Tuple[str, ...]:
        """The kernel by pass width 1..R, then one entry for longer passes (``set_prepack``'s route)."""
        return tuple(self.for_width(r) for r in range(1, self.widths() + 2))

    def uses(self, option: str) -> bool:
        """Whether some pass width runs on ``option``."""
        return option in self.route()

    def label(self) -> str:
        """What the passes run on: one option, or each by width ("own at 1, skinny at 2-12, prepacked at 13+ positions")."""
        return plan_label(self.route())

    def row_costs(self, option: Optional[str] = None) -> Tuple[float, ...]:
        """Relative pass costs (r = 1 costs 1), as ``measure_row_costs`` gives them: of the chosen plan
        (``family()`` at every measured width), or of one ``option`` throughout."""
        times = (self.seconds[option] if option is not None else
                 tuple(self.seconds[self.for_width(r)][r - 1] for r in range(1, self.widths() + 1)))
        return tuple(round(t / times[0], 3) for t in times)

    def line(self) -> str:
        """One line: each option's one-position pass, the plan, and the costs of the plan and of each option."""
        measured = [o for o in OPTIONS if o in self.seconds]
        one = ", ".join(f"{self.seconds[o][0] * 1e3:.1f} ms {o}" for o in measured)
        costs = " · ".join(f"{name} {' '.join(f'{c:.2f}' for c in self.row_costs(option))}"
                           for name, option in [("chosen", None)] + [(o, o) for o in measured])
        return (f"kernels by measurement: a one-position pass {one}; "
                f"every pass on {self.label()} (costs by positions 1..{self.widths()}: {costs})")


def model_label(model: Module) -> str:
    """``plan_label`` of what ``model``'s linear layers run now."""
    return plan_label(plan(model))


def apply_kernels(model: Module, choice: Optional[KernelChoice]) -> str:
    """Give ``model`` the plan ``choice`` measured (one family for the measured widths); its label.
    Its layers are its own again, and oneDNN's copies freed, when every width runs them; where some width
    runs oneDNN's, its copies are the weights' one copy (``kernels.holding``: the own weights parked, a
    width on the own kernel unpacking a layer's at a time)."""
    if choice is None:
        return ""
    if choice.uses(PREPACKED):  # oneDNN's copies made layer by layer, each own weight parked once its copy is (issue 71)
        hold(model, PREPACKED)
    set_prepack(model, True, choice.route())
    if not choice.uses(PREPACKED):
        drop_packed_copies(model)
    if not choice.uses(SKINNY):
        drop_blocked_copies(model)
    return choice.label()


def own_linears(model: Module) -> None:
    """The model's passes on its own linears, said explicitly (route ``(OWN,)``): a model with no plan
    runs the C step where it can (``kernels.c_step.step_for``), which a choice of "own" must not."""
    set_prepack(model, True, (OWN,))
    drop_packed_copies(model)
    drop_blocked_copies(model)


def decide(model: Module, choice: Optional[KernelChoice], budget=None) -> Tuple[Optional[KernelChoice], str]:
    """``(choice, line)`` for a kernel measurement just made (``measure.timing.measure_kernels``
    within ``budget``, a ``measure.timing.Budget``): the model gets the faster kernels for plain
    decoding; None (nothing timed under both options) keeps its own linears, and the line says why."""
    if choice is None:
        own_linears(model)
        return None, f"the model's own linears (fallback: {budget.reason})"
    apply_kernels(model, choice)
    cut = f"; {budget.note}: {budget.reason}" if budget is not None and budget.stopped and budget.note else ""
    missing = f"; {skinny.missing()}" if SKINNY not in choice.seconds and skinny.missing() else ""
    scaled = f"; {budget.scaled}" if budget is not None and budget.scaled else ""
    return choice, choice.line()[:-1] + cut + scaled + missing + ")"


def reuse(model: Module, choice: Optional[KernelChoice]) -> None:
    """Give ``model`` what a saved kernel measurement chose (None: its own linears)."""
    if choice is None:
        own_linears(model)
    else:
        apply_kernels(model, choice)


def measurable(model: Module) -> bool:
    """Whether ``model`` has float32 CPU linear layers that could be prepacked: a choice to measure."""
    return bool(prepackable(model))


def by_flag(model: Module, on: bool) -> None:
    """``--prepack on`` / ``off`` (or nothing to measure): the model's linears prepacked or its own."""
    if on:
        set_prepack(model, True)
    else:
        own_linears(model)


def as_loaded(model: Module) -> None:
    """``model``'s own linear layers back, as loaded (no plan, no blocked or oneDNN copy): a model whose
    passes were timed before the start's own measurements (``measure.pass_dtype``) starts as a loaded one
    does, its C step made again at its first pass (a bfloat16 model's kernels are the step's, given by no plan)."""
    drop_blocked_copies(model)  # in place, a chunk at a time: never the weights twice
    drop_prepacked(model)


def identity(model: Module) -> Dict[str, object]:
    """What runs the model's passes besides its weights, for a measurement's key: its kernel plan
    (``model_label``) and quantization (the caller adds whether its passes are compiled)."""
    return {"kernels": model_label(model), "quantization": model_quantization(model) or "none"}
