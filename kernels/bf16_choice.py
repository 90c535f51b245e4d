"""The bfloat16 path, and that path's many-row variant, chosen by a short measurement (``kernels.bf16``'s
``chosen`` and ``prompt_tile`` keep the results, once per process, library and model shape).

A linear of the model's shape (its gate/up, blocked in bfloat16) is timed on each path built over one
position (and, racing on the weighed run, over ``ROWS`` rows on its default many-row variant), then over ``ROWS`` rows on each
many-row variant of the path kept: interleaved rounds after ``WARMUP`` untimed ones, each key by its least sample
(``least``: the keys differ in speed only, and another process only ever adds time to a sample; on the busy 2-core
Zen 4, medians over 7 rounds took the widening load in plain C in one start, where most of the dot path's samples
had lost a time slice, and the AVX-512 widening load in another: its prompt pass costs float32's CPU time, the dot
path's 0.54x it, ~0.8 ms more a bfloat16 token of ``scripts/bf16_step.py``, noisy: docs/runners.md). Speed is
all that depends on it: a process takes one path for every pass of every row (so a position's logits
never depend on the pass's width), and every variant of a path gives a row the same bits.

The rule for the path (``choose_path``): the widening paths race at one position (they give the same
bits and rank alike at any width); where paths that round the activations are built (the avx512_bf16
dot, the AMX tiles), they and the fastest widening one race on a weighed run (``weighed``): the least
seconds of ``DECODED`` one-position linears and ``VERIFIED`` of ``VERIFY_ROWS`` rows (a drafting row's
verification passes) after a prompt of ``PROMPT`` positions (``PROMPT / ROWS`` linears of ``ROWS`` rows).
Decoding is most of a run's passes, but the prompt pass is where the paths differ most: the AMX tiles
run a many-row linear several times faster than the widening load and decode at about its speed, so a
run weighs both, as a user's first token and tokens/s do; and the dot products, compute-bound from a
few rows on where each costs several fused multiply-adds, could win both and still lose every drafting
row's verification, so a run weighs those passes too.

The timer is given (``Timer``): the decisions are pure functions of the seconds it returns, and the
budget counts those seconds, so a test's fixed seconds decide as a clock's would.
"""
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch

import kernels.once as once
from utils.load import Meter, over_busy, start_up_meter

Timer = Callable[[int, int, int], float]  # (path, variant, rows) -> seconds of one linear
WARMUP, REPEATS, MIN_REPEATS = 2, 7, 3  # untimed rounds, timed rounds, timed rounds before the budget may cut
BUDGET = 0.15  # seconds of timed linears (their own sum, warm-up included) past which no further round starts
ROWS = 64  # rows the many-row variants are timed over: half a prompt chunk, past MANY_ROWS
DECODED, PROMPT = 64, 512  # the run a path is weighed on: 64 tokens after a 512-position prompt (grounded prompts run 200-770)
VERIFY_ROWS, VERIFIED = 8, 16  # and a drafting row's verification: 64 tokens at about 4 a pass, up to 8 positions each
MARGIN = 0.97  # another path or variant replaces the default only where it takes at most this share of its time
WORKING_SET = 32 << 20  # bytes of weight copies taken in turn: a sample reads its weights from memory, as a pass does
MOST_COPIES = 8
MEASURED, FORCED, ONLY = "by measurement", "forced", "the only one built"  # a choice's ``how``


@dataclass(frozen=True)
class Measured:
    """One choice: ``pick`` (a path, or a variant of one), ``how`` it was made, and the median seconds
    of each key timed (``seconds``, in timing order; empty where nothing was timed)."""

    pick: int
    how: str
    seconds: Tuple[Tuple[int, float], ...] = ()
    parts: Tuple[Tuple[int, float, float, float], ...] = ()  # each path's (path, one-position, ``VERIFY_ROWS``-row, ``ROWS``-row seconds: NaN untimed)
    load: str = ""  # "raced under load (other processes used 1.20 cores)" where its window was busy (``in_window``), else ""

    def others(self) -> Tuple[Tuple[int, float], ...]:
        return tuple((key, s) for key, s in self.seconds if key != self.pick)

    def picked_seconds(self) -> float:
        return dict(self.seconds)[self.pick]


def medians(keys: Sequence, run: Callable[[Any], float], repeats: int = REPEATS, budget: float = BUDGET) -> Dict[Any, float]:
    """Median seconds of ``run(key)`` for each key: interleaved rounds, ``WARMUP`` untimed then up to
    ``repeats`` timed; past ``MIN_REPEATS`` timed rounds, none starts once ``budget`` seconds were spent."""
    return {key: statistics.median(values) for key, values in samples(keys, run, repeats, budget).items()}


def least(keys: Sequence, run: Callable[[Any], float], repeats: int = REPEATS, budget: float = BUDGET) -> Dict[Any, float]:
    """The least seconds of ``run(key)`` for each key, in ``medians``' rounds: for a race whose keys differ in speed
    only, where another process only ever adds time to a sample, so a key's least sample is its least disturbed."""
    return {key: min(values) for key, values in samples(keys, run, repeats, budget).items()}


def samples(keys: Sequence, run: Callable[[Any], float], repeats: int = REPEATS, budget: float = BUDGET) -> Dict[Any, list]:
    """The timed seconds of ``run(key)`` for each key, in ``medians``' interleaved rounds."""
    timed: Dict[Any, list] = {key: [] for key in keys}
    spent = 0.0
    for round_ in range(WARMUP + repeats):
        if round_ >= WARMUP + MIN_REPEATS and spent > budget:
            break
        for key in keys:
            seconds = run(key)
            spent += seconds
            if round_ >= WARMUP:
                timed[key].append(seconds)
    return timed


def fastest(seconds: Dict[int, float], default: int) -> int:
    """The key of the least ``seconds``; ``default`` where that is not under ``MARGIN`` of its own (noise
    between close keys cannot make a machine's choice flip from run to run)."""
    best = min(seconds, key=lambda key: (seconds[key], key != default))
    return default if default in seconds and not seconds[best] < MARGIN * seconds[default] else best


def weighed(one: float, verify: float, many: float) -> float:
    """Seconds of the run a path is chosen on: ``DECODED`` linears of one position, ``VERIFIED`` of
    ``VERIFY_ROWS`` rows, and ``PROMPT / ROWS`` of ``ROWS`` rows (``one``, ``verify``, ``many``: the least samples of each)."""
    return DECODED * one + VERIFIED * verify + PROMPT / ROWS * many


def in_window(race: Callable[[], Measured], meter: Optional[Callable[[], Meter]] = None) -> Measured:
    """``race()`` inside a load window (``meter``, default ``utils.load.start_up_meter``: the one a start-up
    measurement is taken in), its result with ``load`` set where other processes used more than ``BUSY`` cores over
    it (``utils.load.over_busy``). Least samples resist a neighbour, not a neighbour on every sample (docs/results.md: a loaded start's bfloat16
    path race took plain C), so the header says the race ran under load; these races are per process, never saved."""
    window = (meter or start_up_meter)()
    started = time.perf_counter()
    window.start()
    found = race()
    cores = over_busy(window.stop())
    once.note("race", f"{found.how}: {found.pick} of {[key for key, _ in found.seconds] or [found.pick]}", started)
    # nothing raced (the only one built): no load to name
    return found if cores is None or found.how != MEASURED else replace(found, load=f"raced under load (other processes used {cores:.2f} cores)")


def choose_path(built: Sequence[int], timer: Timer, default: Optional[int] = None,
                tiles: Optional[Dict[int, int]] = None, rounding: Sequence[int] = ()) -> Measured:
    """The path ``built`` runs: each timed at one position (every time below: its least sample, ``least``); the fastest of the widening ones (not in
    ``rounding``: they give the same bits, and rank alike at any width), ``default`` (None: the first)
    unless another is clearly faster; then, where ``rounding`` paths are built, those and that one timed
    over ``VERIFY_ROWS`` rows (decoding's variant 0, which runs a verification pass) and over ``ROWS`` rows
    (each on its variant ``tiles[path]``, default 1) and the least ``weighed`` run taken, the widening one
    unless another is clearly faster."""
    if len(built) == 1:
        return Measured(built[0], ONLY)
    one = least(built, lambda path: timer(path, 0, 1))
    widening = [p for p in built if p not in rounding]
    best = fastest({p: one[p] for p in widening}, default if default in widening else widening[0]) if widening else None
    racing = [p for p in built if p in rounding or p == best]
    if len(racing) == 1:  # nothing rounds apart: the one-position race decides, as it did
        return Measured(best, MEASURED, tuple(one.items()))
    tiles = tiles or {}
    verify = least(racing, lambda path: timer(path, 0, VERIFY_ROWS))
    many = least(racing, lambda path: timer(path, tiles.get(path, 1), ROWS))
    seconds = {p: weighed(one[p], verify[p], many[p]) for p in racing}
    parts = tuple((p, one[p], verify.get(p, float("nan")), many.get(p, float("nan"))) for p in built)
    return Measured(fastest(seconds, racing[0] if best is None else best), MEASURED, tuple(seconds.items()), parts)


def choose_tile(path: int, variants: Sequence[int], default: int, timer: Timer) -> Measured:
    """The many-row variant of ``path`` (of ``variants``; ``default`` the build's) fastest over ``ROWS`` rows (least samples)."""
    if len(variants) == 1:
        return Measured(variants[0], ONLY)
    seconds = least(variants, lambda tile: timer(path, tile, ROWS))
    return Measured(fastest(seconds, default), MEASURED, tuple(seconds.items()))


def linear_timer(library, shape: Tuple[int, int], threads: int, weights: Optional[Sequence[torch.Tensor]] = None) -> Timer:
    """A ``Timer`` of ``library``'s ``skinny_linear_bf16`` on a bfloat16 weight of ``shape`` (N outputs, K
    inputs, blocked) over up to ``ROWS`` rows on ``threads`` threads, the next of ``weights`` at each call:
    the model's own blocks of that shape (its layers' gate/up: nothing allocated, a start holds its
    weights once), else a few constant copies made here (``WORKING_SET``; speed does not depend on the
    values), so that each sample reads its weights from memory, as a pass does."""
    n, k = shape
    blocks = (n + 15) // 16
    if weights:
        copies = len(weights)
    else:
        copies = max(1, min(MOST_COPIES, -(-WORKING_SET // (blocks * k * 16 * 2))))
        weights = [torch.full((blocks, k, 16), 1 / 64, dtype=torch.bfloat16) for _ in range(copies)]
    x, y = torch.randn(ROWS, k, generator=torch.Generator().manual_seed(0)), torch.empty(ROWS, n)
    turn = [0]

    def run(path: int, tile: int, rows: int) -> float:
        weight, turn[0] = weights[turn[0] % copies], turn[0] + 1
        start = time.perf_counter()
        library.skinny_linear_bf16(path, tile, x.data_ptr(), weight.data_ptr(), None, y.data_ptr(), rows, n, k, threads)
        return time.perf_counter() - start

    return run
