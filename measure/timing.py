"""Timing: the ``Budget`` a start-up measurement runs under, the timers (a cached runner fed a context,
timing passes after it), interleaved rounds, and every timed model pass of the start-up: the kernel
options' curve (``measure_kernels``), the KV cache kinds (``choose_cache``), the verification costs
by positions (``measure_row_costs``), a drafter's cost (``measure_draft_cost``) and a model's two dtypes' passes (``dtype_race``).

The kernel options are timed one copy of the weights at a time (``kernels.holding``, issue 71): the
rounds are interleaved by option (each runs its passes in turn), not pass by pass.

Seconds are ``time.perf_counter`` seconds, the device synchronised around each pass; costs are
relative to a one-position pass. A budget is asked between passes, never inside one. What the figures
decide lives above: ``measure.kernels`` (which kernels each row runs on), ``measure.costs`` (which
costs can be real)."""
import statistics
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch
from torch.nn import Module

from measure.kernels import OWN, PREPACKED, SKINNY, KernelChoice
from measure.record import Clock, Progress
from runners import DEFAULT_CPU_CACHE, KVCacheModel, make_runner, prepackable, runner_cache, synchronize
from kernels import skinny
from kernels.holding import drop_step, hold
from runners.config import EAGER, RunnerConfig
from runners.limits import context_window, output_vocab_size

MIN_ROUNDS = 2  # timed rounds a comparison needs before its budget may cut it short
# the kernel measurement's budget may grow to this many times itself so that all its rounds run on a
# slower machine (a probe pass tells what they cost there); slower still, the full rounds that fit in it
MOST_SCALED = 4.0
_PREFILL_STEP = 32  # positions a budgeted timer feeds its context in, between checks of its budget


@dataclass
class Budget:
    """``seconds`` of ``clock`` for one measurement, started when made. ``exhausted()`` is asked
    between passes; once true the measurement stops and ``stopped`` stays true. ``note``: what was
    measured when the budget cut it short; ``reason``: the budget named for a fallback's line."""

    seconds: float
    clock: Clock = time.perf_counter
    progress: Optional[Progress] = None
    stopped: bool = field(default=False, init=False)
    note: str = field(default="", init=False)
    reason: str = field(default="", init=False)
    scaled: str = field(default="", init=False)  # "" or how ``scale_rounds`` lengthened it

    def __post_init__(self) -> None:
        self.started = self.clock()
        self.reason = f"measurement over its {self.seconds:g} s budget"

    def exhausted(self) -> bool:
        if not self.stopped and self.clock() - self.started > self.seconds:
            self.stopped = True
        return self.stopped

    def scale_rounds(self, per_round: float, repeats: int, most: float) -> int:
        """How many of ``repeats`` timed rounds (after one warm-up round, each about ``per_round``
        seconds) the measurement runs from now: all when they fit in the budget or in ``most`` times it;
        else as many full rounds as fit in ``most`` times it, at least one. The budget grows to fit the
        rounds chosen, said in ``scaled`` (with the clamp, when it cut rounds)."""
        spent = self.clock() - self.started
        if per_round <= 0:
            return repeats
        fit = int((most * self.seconds - spent) // per_round) - 1
        timed = repeats if fit >= repeats else max(1, fit)
        seconds = spent + per_round * (timed + 1)
        if seconds > self.seconds:
            clamp = "" if timed == repeats else f" (at most {most:g}x: {timed} of {repeats} rounds)"
            self.scaled = f"budget scaled from {self.seconds:g} s to {seconds:.3g} s for this machine's passes{clamp}"
            self.seconds = seconds
            self.reason = f"measurement over its {self.seconds:.3g} s budget"
        return timed

    def tick(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)

    def finish(self) -> None:
        """The measurement is over: its progress line, if any, is cleared."""
        if self.progress is not None:
            self.progress(0, 0)


class PassTimer:
    """A cached runner of ``model`` that has read ``context`` random tokens, and times passes after them.

    The tokens are drawn from the model's own vocabulary (or the first ``vocab``), and the context is
    cut to leave ``room`` positions inside the model's window: both asked of the model, never assumed.
    ``runner``: the configuration the passes run under (the rows' own). ``head``: a drafter's output rows
    (``RunnerConfig.drafter_head``; 0: all), asked of this timer's own runner before its context is fed, as a
    drafting run asks before its prompt; ``rows``: those its passes compute before any token (None: every row)."""

    def __init__(self, model: Module, context: int, room: int, vocab: int | None = None, budget: Optional[Budget] = None,
                 runner: RunnerConfig = EAGER, head: int = 0):
        window = context_window(model)
        self.context = max(1, min(context, window - room)) if window else context
        vocab = vocab or output_vocab_size(model)
        self.ids = torch.randint(vocab, (1, self.context + room), generator=torch.Generator().manual_seed(0))
        encoder = self.ids[0, : self.context].tolist() if getattr(model.config, "is_encoder_decoder", False) else None
        self.model, self.runner = model, make_runner(model, True, encoder, runner)
        # the runner's own rows (``runners.lean.LeanRunner.output_rows``): nothing of the model's changes, nothing to restore
        ask = getattr(self.runner, "output_rows", None) if head else None
        self.rows: Optional[int] = ask(head) if ask is not None else None
        _prefill(self, budget)

    def seconds(self, rows: int) -> float:
        """Seconds of one cached pass over ``rows`` new positions (the device synchronised around it)."""
        synchronize(self.model)
        start = time.perf_counter()
        self.runner(self.ids[:, : self.context + rows], rows)
        synchronize(self.model)
        self.runner.rollback(self.context)
        return time.perf_counter() - start


class _EagerTimer(PassTimer):
    """A ``PassTimer`` over an eager runner with the given cache kind."""

    def __init__(self, model: Module, context: int, cache: Optional[str] = None, budget: Optional[Budget] = None):
        self.model, self.context = model, context
        self.ids = torch.randint(output_vocab_size(model), (1, context + 1), generator=torch.Generator().manual_seed(0))
        encoder = self.ids[0, :context].tolist() if getattr(model.config, "is_encoder_decoder", False) else None
        self.runner = KVCacheModel(model, True, encoder_input_ids=encoder, cache=cache)
        _prefill(self, budget)


def _prefill(timer: PassTimer, budget: Optional[Budget]) -> None:
    """Feed the timer's context. With a ``budget``: in passes of ``_PREFILL_STEP`` positions, asked
    before each, so that a busy machine stops after one short pass rather than a long one (a timer
    left unfed is never timed: the budget stays spent)."""
    step = timer.context if budget is None else _PREFILL_STEP
    for end in range(min(step, timer.context), timer.context + step, step):
        if budget is not None and budget.exhausted():
            return
        timer.runner(timer.ids[:, : min(end, timer.context)], 1)


def samples(passes: List[Tuple[PassTimer, int]], repeats: int, budget: Optional[Budget] = None) -> List[List[float]]:
    """Seconds of each ``(timer, rows)`` pass in ``repeats`` interleaved rounds, each pass warmed up
    once just before its first timing. With a ``budget``, asked before every pass: once it is spent
    the rounds stop there, so the passes timed are a prefix of the last round (fewer samples, never
    a pass cut short; a busy machine still gets the first passes of the first round). A timer is
    anything with ``seconds(rows)`` (``eagle.cost.HeadTimer`` too)."""
    timed: List[List[float]] = [[] for _ in passes]
    total, done = len(passes) * (repeats + 1), 0
    for round_ in range(repeats):
        for (timer, rows), times in zip(passes, timed):
            for warm_up in (True, False) if round_ == 0 else (False,):
                if budget is not None and budget.exhausted():
                    return timed
                seconds = timer.seconds(rows)
                if not warm_up:
                    times.append(seconds)
                done += 1
                if budget is not None:
                    budget.tick(done, total)
    return timed


def compared(passes: List[Tuple[PassTimer, int]], repeats: int, budget: Optional[Budget] = None) -> Tuple[Optional[List[float]], str]:
    """Median seconds of each ``(timer, rows)`` pass over ``repeats`` interleaved rounds (``samples``),
    within ``budget``: ``(medians, "")``, ``(medians, "k of n rounds")`` from the complete rounds when
    the budget ran out after ``MIN_ROUNDS`` of them, or ``(None, "")`` before."""
    timed = samples(passes, repeats, budget)
    rounds = min(len(times) for times in timed)
    if rounds < min(MIN_ROUNDS, repeats):
        return None, ""
    return [statistics.median(times[:rounds]) for times in timed], "" if rounds == repeats else f"{rounds} of {repeats} rounds"


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
    timer = PassTimer(model, context, max_rows, budget=budget, runner=runner)
    timed_passes = samples([(timer, rows) for rows in range(1, max_rows + 1)], repeats, budget)
    timed = [statistics.median(times) for times in timed_passes if times]
    if len(timed) < 2:
        return ()
    costs = [m / timed[0] for m in timed]
    if budget is not None and len(timed) < max_rows:
        budget.note = f"positions 1-{len(timed)} measured, {len(timed) + 1}-{max_rows} extrapolated"
        costs = _extrapolated(costs, max_rows)
    elif budget is not None and budget.stopped:
        budget.note = f"{min(len(t) for t in timed_passes)} of {repeats} rounds"
    return tuple(round(c, 3) for c in costs)


@torch.no_grad()
def drafting_cost(drafter: Module, target: Module, context: int = 128, repeats: int = 7, budget: Optional[Budget] = None,
                  runner: RunnerConfig = EAGER, drafter_runner: Optional[RunnerConfig] = None) -> Tuple[Optional[float], Optional[int]]:
    """``(cost, rows)``: the time of one cached one-position pass of ``drafter`` as it drafts, under ``drafter_runner``
    (default ``runner``) with the output rows its ``drafter_head`` asks for, relative to one of ``target`` (medians of
    ``repeats`` interleaved passes after one warm-up each): the ``draft_cost`` of a drafter model. ``rows``: the rows
    its passes computed before any token (None: every row; a cut head's pass costs less, 0.26 of a target pass
    against 0.33 on the bfloat16 pair). With a ``budget``: from the rounds that fit (``budget.note``); cost None when
    fewer than 2 did."""
    vocab = min(output_vocab_size(drafter), output_vocab_size(target))
    drafting = drafter_runner or runner
    drafts = PassTimer(drafter, context, 1, vocab, budget, drafting, head=drafting.drafter_head)
    medians, rounds = compared([(drafts, 1), (PassTimer(target, context, 1, vocab, budget, runner), 1)], repeats, budget)
    if medians is None:
        return None, drafts.rows
    if budget is not None:
        budget.note = rounds
    return round(medians[0] / medians[1], 3), drafts.rows


def measure_draft_cost(drafter: Module, target: Module, context: int = 128, repeats: int = 7,
                       budget: Optional[Budget] = None, runner: RunnerConfig = EAGER,
                       drafter_runner: Optional[RunnerConfig] = None) -> Optional[float]:
    """``drafting_cost``'s cost alone: a drafter pass (its rows as ``drafter_runner.drafter_head`` asks) against a target pass."""
    return drafting_cost(drafter, target, context, repeats, budget, runner, drafter_runner)[0]


def kernel_options() -> Tuple[str, ...]:
    """The kernel options a measurement times here: prepacked, own, and skinny where it is built."""
    return (PREPACKED, OWN) + ((SKINNY,) if skinny.available()[0] else ())


def kernel_options_text() -> str:
    """What a kernel measurement times here, for its announcement: "own, prepacked and skinny linears",
    or the options without skinny and why it is missing."""
    options = kernel_options()
    names = [o for o in (OWN, PREPACKED, SKINNY) if o in options]
    text = ", ".join(names[:-1]) + " and " + names[-1] + " linears"
    return text if SKINNY in options else f"{text}; {skinny.missing()}"


class _Holder:
    """The model behind ``timer`` holding one kernel option's copy of its weights at a time
    (``kernels.holding.hold``: the others freed first), never the three at once (issue 71: a first
    start within memory); ``spent`` the seconds each switch took by ``clock`` (None: not counted)."""

    def __init__(self, timer: PassTimer, clock: Optional[Clock]):
        self.timer, self.clock, self.current, self.spent = timer, clock, None, []

    def switch(self, option: str) -> None:
        """Hold ``option``'s copy, the timer's C step (its copies) dropped first, then one untimed pass
        on it (a C step made): outside the timed passes."""
        if option == self.current:
            return
        started = self.clock() if self.clock is not None else 0.0
        drop_step(self.timer.runner)
        hold(self.timer.model, option)
        self.current = option
        self.timer.runner(self.timer.ids[:, : self.timer.context + 1], 1)
        self.timer.runner.rollback(self.timer.context)
        if self.clock is not None:
            self.spent.append(self.clock() - started)

    def cycle(self, options: Tuple[str, ...]) -> List[str]:
        """``options`` in their order from the one held: a round switches ``len(options) - 1`` times."""
        start = options.index(self.current) if self.current in options else 0
        return list(options[start:] + options[:start])


@torch.no_grad()
def measure_kernels(model: Module, max_rows: int = 12, context: int = 64, repeats: int = 3,
                    budget: Optional[Budget] = None, runner: RunnerConfig = EAGER) -> Optional[KernelChoice]:
    """Time cached passes over 1..``max_rows`` positions with the model's float32 CPU linear layers on
    each kernel option: prepacked, its own, and the skinny kernel where it builds here (medians of
    ``repeats`` rounds; the model holds one option's copy of its weights at a time, ``_Holder``, so
    in each round every option in turn runs its passes). None when nothing can be prepacked (other
    dtypes, devices, no oneDNN), or a ``budget`` ran out before every option had a pass timed; cut
    short later, the positions timed under all (``budget.note``). The model is left holding what the
    family chosen runs on (the blocked copies for skinny, oneDNN's for prepacked, else its own weights), on that option at
    every width: ``measure.kernels.decide`` gives it its plan. ``runner``: what the passes run under."""
    if not prepackable(model):
        return None
    hold(model, OWN)  # the own weights, as the passes before the first switch read them
    holder = _Holder(PassTimer(model, context, max_rows, budget=budget, runner=runner), None if budget is None else budget.clock)
    holder.current = OWN  # the rounds start on it (a model read from a file is first released, its pages given back)
    choice = None
    try:
        choice = _measured_kernels(holder, max_rows, repeats, budget)
    finally:  # an interruption too: never left with its weights parked
        drop_step(holder.timer.runner)
        hold(model, choice.family() if choice is not None else OWN)  # a prepacked family: its copies, the own weights parked
    return choice


def _measured_kernels(holder: _Holder, max_rows: int, repeats: int, budget: Optional[Budget]) -> Optional[KernelChoice]:
    """``measure_kernels``' rounds, the ``KernelChoice`` from their medians."""
    options = kernel_options()
    n = len(options)
    if budget is not None and not budget.exhausted():
        # a one-position pass on each option (switching to it) tells what a round costs here (passes
        # grow with width: 1.3x on average over 1-12 measured; a round switches n - 1 times); the budget
        # grows to fit every round where that is within MOST_SCALED of it (a plan from one noisy round
        # zig-zagged), else to fit the full rounds that fit in MOST_SCALED of it: never a partial plan
        probe = 0.0
        for option in holder.cycle(options):
            holder.switch(option)
            probe += holder.timer.seconds(1)
        switch = statistics.mean(holder.spent) if holder.spent else 0.0
        repeats = budget.scale_rounds(1.3 * probe * max_rows + switch * (n - 1), repeats, MOST_SCALED)
    timed = _timed_rounds(holder, options, max_rows, repeats, budget)
    widths = next((i for i in range(max_rows) if not all(timed[n * i + k] for k in range(n))), max_rows)
    if widths == 0:
        return None
    if budget is not None and budget.stopped:
        done = min(len(timed[i]) for i in range(n * widths))
        budget.note = f"positions 1-{widths} of 1-{max_rows}" if widths < max_rows else f"{done} of {repeats} rounds"
    return KernelChoice({option: tuple(statistics.median(timed[n * i + k]) for i in range(widths))
                         for k, option in enumerate(options)})


def _timed_rounds(holder: _Holder, options: Tuple[str, ...], max_rows: int, repeats: int,
                  budget: Optional[Budget]) -> List[List[float]]:
    """Seconds of the passes over 1..``max_rows`` positions under each option, at ``n * (rows - 1) + k``
    for ``options[k]``, in ``repeats`` rounds; in each, every option in turn (``_Holder.cycle``) runs
    its passes, each warmed up once just before its first timing. With a ``budget``, asked before
    every pass (and switch): once spent the rounds stop there (an option not yet reached: no samples)."""
    n = len(options)
    timed: List[List[float]] = [[] for _ in range(n * max_rows)]
    total, done = n * max_rows * (repeats + 1), 0
    for round_ in range(repeats):
        for option in holder.cycle(options):
            if budget is not None and budget.exhausted():
                return timed
            holder.switch(option)
            for rows, warm_up in [(r, w) for r in range(1, max_rows + 1) for w in ((True, False) if round_ == 0 else (False,))]:
                if budget is not None and budget.exhausted():
                    return timed
                seconds = holder.timer.seconds(rows)
                if not warm_up:
                    timed[n * (rows - 1) + options.index(option)].append(seconds)
                done += 1
                if budget is not None:
                    budget.tick(done, total)
    return timed


@torch.no_grad()
def choose_cache(model: Module, context: int = 256, repeats: int = 7, budget: Optional[Budget] = None) -> Tuple[str, str]:
    """Measure one-position cached passes of ``model`` after ``context`` positions with the static KV
    cache and with the model's dynamic one; returns ``(cache, line)``: the faster (static only when
    at least 5% faster) and one line saying what was measured. A model that cannot take the
    static cache keeps the dynamic one, and says so. A ``budget`` spent before 2 rounds: the CPU
    default (``DEFAULT_CPU_CACHE``), and the line says it fell back."""
    if runner_cache(model, "static") != "static":
        return "dynamic", "the model's dynamic KV cache (it cannot take the static one)"
    medians, rounds = compared([(_EagerTimer(model, context, cache="static", budget=budget), 1),
                                (_EagerTimer(model, context, cache="dynamic", budget=budget), 1)], repeats, budget)
    if medians is None:
        return DEFAULT_CPU_CACHE, f"{DEFAULT_CPU_CACHE} KV cache (fallback: {budget.reason})"
    static, dynamic = medians
    chosen = "static" if static < 0.95 * dynamic else "dynamic"
    cut = f"; {rounds}: {budget.reason}" if rounds else ""
    return chosen, f"{chosen} KV cache (measured {static * 1e3:.1f} ms a pass static, {dynamic * 1e3:.1f} ms dynamic{cut})"


def dtype_race(models: Sequence[Module], budget: Budget, rounds: int, context: int = 64) -> Tuple[List[List[float]], Tuple[str, ...]]:
    """Seconds of each model's one-position pass after ``context`` positions (its own runner, ``EAGER``: the
    C step where it takes the model, as its rows will), alternating model by model: one untimed round (each
    path's set-up), then up to ``rounds`` timed, the budget asked before each. Also what ran each model's passes."""
    timers = [PassTimer(model, context, 1) for model in models]
    for timer in timers:
        timer.seconds(1)
    seconds: List[List[float]] = [[] for _ in timers]
    for done in range(rounds):
        if budget.exhausted():
            break
        for timer, times in zip(timers, seconds):
            times.append(timer.seconds(1))
        budget.tick(done + 1, rounds)
    return seconds, tuple("C step" if getattr(t.runner, "step_passes", 0) else "torch forward" for t in timers)
