"""Measured costs for a ``DraftPolicy``: what a target pass over r positions costs against one
position, and what a drafter model's pass costs against a target's. Timing only; the policy
that reads the costs lives in ``sampling.draft_policy``."""
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch.nn import Module

from runners.limits import context_window, output_vocab_size
from sampling.draft_policy import DraftPolicy
from runners import DEFAULT_CPU_CACHE, KVCacheModel, drop_prepacked, kernels, make_runner, prepackable, runner_cache, set_prepack, synchronize
from runners.config import EAGER, RunnerConfig
from utils.measurements import Budget

# Cost-aware pausing threshold of the calibrated policy: drafting pauses while a drafting step
# emits fewer tokens than its verification pass costs in single-token passes (1.0 = break-even).
DEFAULT_MIN_GAIN = 1.0
MIN_ROUNDS = 2  # timed rounds a comparison needs before its budget may cut it short
_PREFILL_STEP = 32  # positions a budgeted timer feeds its context in, between checks of its budget


class _Timer:
    """A cached runner of ``model`` that has read ``context`` random tokens, and times passes after them.

    The tokens are drawn from the model's own vocabulary, and the context is cut to leave
    ``room`` positions inside the model's window: both asked of the model, never assumed."""

    def __init__(self, model: Module, context: int, room: int, vocab: int | None = None, budget: Optional[Budget] = None,
                 runner: RunnerConfig = EAGER):
        window = context_window(model)
        self.context = max(1, min(context, window - room)) if window else context
        vocab = vocab or output_vocab_size(model)
        self.ids = torch.randint(vocab, (1, self.context + room), generator=torch.Generator().manual_seed(0))
        encoder = self.ids[0, : self.context].tolist() if getattr(model.config, "is_encoder_decoder", False) else None
        self.model, self.runner = model, make_runner(model, True, encoder, runner)
        _prefill(self, budget)

    def seconds(self, rows: int) -> float:
        """Seconds of one cached pass over ``rows`` new positions (the device synchronised around it)."""
        synchronize(self.model)
        start = time.perf_counter()
        self.runner(self.ids[:, : self.context + rows], rows)
        synchronize(self.model)
        self.runner.rollback(self.context)
        return time.perf_counter() - start


def _prefill(timer: "_Timer", budget: Optional[Budget]) -> None:
    """Feed the timer's context. With a ``budget``: in passes of ``_PREFILL_STEP`` positions, asked
    before each, so that a busy machine stops after one short pass rather than a long one (a timer
    left unfed is never timed: the budget stays spent)."""
    step = timer.context if budget is None else _PREFILL_STEP
    for end in range(min(step, timer.context), timer.context + step, step):
        if budget is not None and budget.exhausted():
            return
        timer.runner(timer.ids[:, : min(end, timer.context)], 1)


def _samples(passes: List[Tuple["_Timer", int]], repeats: int, budget: Optional[Budget] = None) -> List[List[float]]:
    """Seconds of each ``(timer, rows)`` pass in ``repeats`` interleaved rounds, each pass warmed up
    once just before its first timing. With a ``budget``, asked before every pass: once it is spent
    the rounds stop there, so the passes timed are a prefix of the last round (fewer samples, never
    a pass cut short; a busy machine still gets the first passes of the first round)."""
    samples: List[List[float]] = [[] for _ in passes]
    total, done = len(passes) * (repeats + 1), 0
    for round_ in range(repeats):
        for (timer, rows), times in zip(passes, samples):
            for warm_up in (True, False) if round_ == 0 else (False,):
                if budget is not None and budget.exhausted():
                    return samples
                seconds = timer.seconds(rows)
                if not warm_up:
                    times.append(seconds)
                done += 1
                if budget is not None:
                    budget.tick(done, total)
    return samples


def _medians(passes: List[Tuple["_Timer", int]], repeats: int) -> List[float]:
    """Median seconds of each ``(timer, rows)`` pass over ``repeats`` interleaved rounds, after one warm-up round."""
    return [statistics.median(times) for times in _samples(passes, repeats)]


def _compared(passes: List[Tuple["_Timer", int]], repeats: int, budget: Optional[Budget]) -> Tuple[Optional[List[float]], str]:
    """``_medians`` within ``budget``: ``(medians, "")``, ``(medians, "k of n rounds")`` from the
    complete rounds when the budget ran out after ``MIN_ROUNDS`` of them, or ``(None, "")`` before."""
    samples = _samples(passes, repeats, budget)
    rounds = min(len(times) for times in samples)
    if rounds < min(MIN_ROUNDS, repeats):
        return None, ""
    return [statistics.median(times[:rounds]) for times in samples], "" if rounds == repeats else f"{rounds} of {repeats} rounds"


def _extrapolated(costs: List[float], max_rows: int) -> List[float]:
    """``costs`` of positions 1..n continued to ``max_rows`` along their least-squares line."""
    n = len(costs)
    mean_r, mean_c = (n + 1) / 2, sum(costs) / n
    slope = sum((r - mean_r) * (c - mean_c) for r, c in enumerate(costs, 1)) / sum((r - mean_r) ** 2 for r in range(1, n + 1))
    return costs + [max(costs[-1], mean_c + slope * (r - mean_r)) for r in range(n + 1, max_rows + 1)]


@torch.no_grad()
def measure_row_costs(model: Module, max_rows: int = 12, context: int = 128, repeats: int = 5,
                      budget: Optional[Budget] = None, runner: RunnerConfig = EAGER) -> Tuple[float, ...]:
    """Time of one cached target pass over r new positions (r = 1..max_rows) after ``context``
    positions, relative to r = 1: the cost of verifying r - 1 drafts in single-token steps.

    Medians of ``repeats`` interleaved rounds, the device synchronised around each pass. About
    ``max_rows * (repeats + 1)`` passes: ~3 s for SmolLM2-135M on a 2-core CPU.

    With a ``budget`` that runs out: the positions timed at least once (1..n, n >= 2) from the
    samples they have, the rest extrapolated along their line, and ``budget.note`` says which;
    () when fewer than 2 positions were timed (not plausible: the caller's fallback). ``runner``:
    the runner configuration the passes run under (the rows' own).
    """
    timer = _Timer(model, context, max_rows, budget=budget, runner=runner)
    samples = _samples([(timer, rows) for rows in range(1, max_rows + 1)], repeats, budget)
    timed = [statistics.median(times) for times in samples if times]
    if len(timed) < 2:
        return ()
    costs = [m / timed[0] for m in timed]
    if budget is not None and len(timed) < max_rows:
        budget.note = f"positions 1-{len(timed)} measured, {len(timed) + 1}-{max_rows} extrapolated"
        costs = _extrapolated(costs, max_rows)
    elif budget is not None and budget.stopped:
        budget.note = f"{min(len(t) for t in samples)} of {repeats} rounds"
    return tuple(round(c, 3) for c in costs)


@torch.no_grad()
def measure_draft_cost(drafter: Module, target: Module, context: int = 128, repeats: int = 7,
                       budget: Optional[Budget] = None, runner: RunnerConfig = EAGER,
                       drafter_runner: Optional[RunnerConfig] = None) -> Optional[float]:
    """Time of one cached one-position pass of ``drafter`` relative to one of ``target`` (medians
    of ``repeats`` interleaved passes after one warm-up each): the ``draft_cost`` of a drafter model.
    With a ``budget``: from the rounds that fit (``budget.note``), None when fewer than 2 did."""
    vocab = min(output_vocab_size(drafter), output_vocab_size(target))
    timers = [_Timer(drafter, context, 1, vocab, budget, drafter_runner or runner), _Timer(target, context, 1, vocab, budget, runner)]
    medians, rounds = _compared([(timer, 1) for timer in timers], repeats, budget)
    if medians is None:
        return None
    if budget is not None:
        budget.note = rounds
    return round(medians[0] / medians[1], 3)


def plausible_row_costs(costs: Tuple[float, ...]) -> bool:
    """Whether measured relative pass costs can be real: a pass over more positions does the
    work of a shorter one and more, so no cost may fall well below one position's (0.8 allows
    for noise), and none may exceed the positions' count twice over (a busy machine)."""
    return bool(costs) and all(0.8 <= c <= 2.0 * rows for rows, c in enumerate(costs, start=1))


def calibrated_policy(target: Module, min_gain: float = DEFAULT_MIN_GAIN, drafter: Optional[Module] = None,
                      row_costs: Optional[Tuple[float, ...]] = None, draft_cost: Optional[float] = None,
                      source: str = "given, not measured", kernel_choice: Optional["KernelChoice"] = None,
                      runner: RunnerConfig = EAGER, drafter_runner: Optional[RunnerConfig] = None, **policy) -> DraftPolicy:
    """The REPL's and the benchmark's default policy: verification costs measured on ``target``
    where it runs (``measure_row_costs``, a few seconds), the cost of a ``drafter`` pass
    (``measure_draft_cost``), cheaper padded passes, cost-aware pausing.

    A measurement that cannot be real (``plausible_row_costs``) is taken again once; if it still
    is not plausible the policy has no ``row_costs`` (constant length, no padding) and its
    ``calibration`` says why. ``calibration`` holds the costs measured, for the record. ``row_costs``
    given (costs measured before, ``--row-costs``) are used as they are, checked but not measured, and
    named with ``source`` (none when ""). ``draft_cost`` given: not measured either.
    ``kernel_choice`` (``choose_kernels``, measured just before) and no ``row_costs``: the costs of
    the kernels that drafting rows run on are taken from it, not measured again. ``runner`` and
    ``drafter_runner``: the configurations the rows run the models under, measured as they run."""
    if row_costs is None and kernel_choice is not None and plausible_row_costs(kernel_choice.row_costs(kernel_choice.for_auto())):
        option = kernel_choice.for_auto()
        row_costs, source = kernel_choice.row_costs(option), f"{option} linears, from the kernel measurement"
    if row_costs is not None:
        costs = tuple(float(c) for c in row_costs)
        if not plausible_row_costs(costs):
            raise ValueError(f"row costs {costs} are not plausible: r = 1 costs 1, each r costs 0.8 to 2r")
    for _ in range(2 if row_costs is None else 0):
        costs = measure_row_costs(target, runner=runner)
        if plausible_row_costs(costs):
            break
    if draft_cost is None:
        draft_cost = measure_draft_cost(drafter, target, runner=runner, drafter_runner=drafter_runner) if drafter is not None else 0.0
    shown = " ".join(f"{c:.2f}" for c in costs)
    if not plausible_row_costs(costs):
        note = f"Verification costs measured twice and not plausible ({shown}): not used, constant draft length"
        return DraftPolicy(min_gain=min_gain, draft_cost=draft_cost, calibration=note, **policy)
    note = f"Verification cost by positions 1..{len(costs)}: {shown}" + (f" ({source})" if row_costs is not None and source else "")
    return DraftPolicy(min_gain=min_gain, row_costs=costs, draft_cost=draft_cost, calibration=note, **policy)


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


class _UnderKernels:
    """A timer's passes under one kernel option (the swap outside the clock)."""

    def __init__(self, timer: "_Timer", option: str):
        self.timer, self.option = timer, option

    def seconds(self, rows: int) -> float:
        with kernels(self.timer.model, self.option == PREPACKED):
            return self.timer.seconds(rows)


@torch.no_grad()
def measure_kernels(model: Module, max_rows: int = 12, context: int = 64, repeats: int = 3,
                    budget: Optional[Budget] = None) -> Optional[KernelChoice]:
    """Time cached passes over 1..``max_rows`` positions with the model's float32 CPU linear layers
    prepacked and with its own (interleaved, each pair of passes back to back; medians). None when
    nothing can be prepacked (other dtypes, devices, no oneDNN), or a ``budget`` ran out before both
    options had a pass timed; cut short later, the positions timed under both (``budget.note``).
    The model's kernels are as before."""
    if not prepackable(model):
        return None
    timer = _Timer(model, context, max_rows, budget=budget)
    passes = [(_UnderKernels(timer, option), rows) for rows in range(1, max_rows + 1) for option in (PREPACKED, OWN)]
    samples = _samples(passes, repeats, budget)
    widths = next((i for i in range(max_rows) if not (samples[2 * i] and samples[2 * i + 1])), max_rows)
    if widths == 0:
        return None
    if budget is not None and budget.stopped:
        rounds = min(len(samples[i]) for i in range(2 * widths))
        budget.note = f"positions 1-{widths} of 1-{max_rows}" if widths < max_rows else f"{rounds} of {repeats} rounds"
    return KernelChoice({option: tuple(statistics.median(samples[2 * i + k]) for i in range(widths))
                         for k, option in enumerate((PREPACKED, OWN))})


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


@torch.no_grad()
def choose_kernels(model: Module, budget: Optional[Budget] = None) -> Tuple[Optional[KernelChoice], str]:
    """Measure the kernel options of ``model`` (``measure_kernels``), give it the faster for plain
    decoding, and return the measurement with one line saying what was measured and chosen (None
    and the model's own linears when nothing could be measured). A notebook calls this once per
    model to run what the REPL and the benchmark run; ``strategies.run_strategy`` then gives each
    row its own option."""
    if not prepackable(model):
        return None, "no float32 CPU linear layers to prepack"
    choice = measure_kernels(model, budget=budget)
    if choice is None:
        drop_prepacked(model)
        return None, f"the model's own linears (fallback: {budget.reason})"
    apply_kernels(model, choice, 1)
    cut = f"; {budget.note}: {budget.reason}" if budget is not None and budget.stopped and budget.note else ""
    return choice, choice.line()[:-1] + cut + ")"


@torch.no_grad()
def choose_prepack(model: Module, budget: Optional[Budget] = None) -> str:
    """``choose_kernels``' line only: the model gets the kernels that decode fastest."""
    return choose_kernels(model, budget)[1]


class _EagerTimer(_Timer):
    """A ``_Timer`` over an eager runner with the given cache kind."""

    def __init__(self, model: Module, context: int, cache: Optional[str] = None, budget: Optional[Budget] = None):
        self.model, self.context = model, context
        self.ids = torch.randint(output_vocab_size(model), (1, context + 1), generator=torch.Generator().manual_seed(0))
        encoder = self.ids[0, :context].tolist() if getattr(model.config, "is_encoder_decoder", False) else None
        self.runner = KVCacheModel(model, True, encoder_input_ids=encoder, cache=cache)
        _prefill(self, budget)


@torch.no_grad()
def choose_cache(model: Module, context: int = 256, repeats: int = 7, budget: Optional[Budget] = None) -> Tuple[str, str]:
    """Measure one-position cached passes of ``model`` after ``context`` positions with the static KV
    cache and with the model's dynamic one; returns ``(cache, line)``: the faster (static only when
    at least 5% faster) and one line saying what was measured. A model that cannot take the
    static cache keeps the dynamic one, and says so. A ``budget`` spent before 2 rounds: the CPU
    default (``DEFAULT_CPU_CACHE``), and the line says it fell back."""
    if runner_cache(model, "static") != "static":
        return "dynamic", "the model's dynamic KV cache (it cannot take the static one)"
    medians, rounds = _compared([(_EagerTimer(model, context, cache="static", budget=budget), 1),
                                 (_EagerTimer(model, context, cache="dynamic", budget=budget), 1)], repeats, budget)
    if medians is None:
        return DEFAULT_CPU_CACHE, f"{DEFAULT_CPU_CACHE} KV cache (fallback: {budget.reason})"
    static, dynamic = medians
    chosen = "static" if static < 0.95 * dynamic else "dynamic"
    return chosen, f"{chosen} KV cache (measured {static * 1e3:.1f} ms a pass static, {dynamic * 1e3:.1f} ms dynamic{_cut(rounds, budget)})"


def _cut(rounds: str, budget: Optional[Budget]) -> str:
    """What a comparison's line adds when its budget cut it short: ``; 3 of 7 rounds: <reason>``."""
    return f"; {rounds}: {budget.reason}" if rounds else ""
