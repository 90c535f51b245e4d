"""The prompt pass's GEMM chosen on this machine (``kernels.prompt_gemm``): each many-row variant of the
skinny kernel this build has, timed on the model's own linears (one decoder layer's q/k/v, o, gate/up and
down as its C step reads them, a layer per sample taken in turn, so that each sample reads its weights
from memory as a prompt pass does) over ``ROWS`` positions, in interleaved rounds; then the chunk
lengths (``CHUNKS``) on the fastest variant. Seconds per position decide; the default (variant 0, chunks
of ``DEFAULT_CHUNK``) stays unless another is at least ``1 - MARGIN`` faster. Only speed depends on
it: every variant and chunking gives the same bits."""
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
from torch.nn import Module

from kernels.prompt_gemm import CHUNKS, DEFAULT_CHUNK, MANY_ROWS, REFERENCE, PromptPlan, Tile, describe
from measure.timing import MIN_ROUNDS, Budget, samples

MARGIN = 0.97  # another variant or chunk length replaces the default where it takes at most this share of its time
ROWS = DEFAULT_CHUNK  # positions the variants are timed over: one chunk of a long prompt
REPEATS = 3  # timed rounds (after one warm-up round)
Seconds = Callable[[int, int], float]  # (variant, rows) -> seconds of one sample (a layer's linears)


def fastest(seconds: Dict[int, float], default: int) -> int:
    """The key of the least ``seconds``, or ``default`` where that is not under ``MARGIN`` of its own."""
    best = min(seconds, key=lambda key: (seconds[key], key != default))
    return default if default in seconds and not seconds[best] < MARGIN * seconds[default] else best


@dataclass(frozen=True)
class PromptChoice:
    """Seconds per position of a sample: by variant (``tiles``, over ``ROWS`` positions) and by chunk
    length (``chunks``, on the fastest variant; only ``ROWS`` where the budget cut the rest); ``flops``:
    a sample's floating-point operations per position (2 x one layer's linear parameters)."""

    tiles: Tuple[Tuple[int, float], ...]
    chunks: Tuple[Tuple[int, float], ...]
    flops: float

    def plan(self) -> PromptPlan:
        """The variant and the chunk length that ran fastest (``fastest``: the defaults where nothing beats them)."""
        return PromptPlan(fastest(dict(self.tiles), REFERENCE), fastest(dict(self.chunks), DEFAULT_CHUNK))

    def line(self, names: Dict[int, str], library=None) -> str:
        """The header's words: the plan, then each variant's and each chunk length's GFLOP/s."""
        rate = lambda seconds: f"{self.flops / seconds / 1e9:.0f}"  # noqa: E731
        tiles = ", ".join(f"{names.get(v, f'variant {v}')} {rate(s)}" for v, s in self.tiles)
        chunks = "/".join(str(c) for c, _ in self.chunks)
        rates = "/".join(rate(s) for _, s in self.chunks)
        return (f"{describe(self.plan(), library).replace('prompt GEMM: ', 'prompt GEMM by measurement: ')} (a layer's linears over "
                f"{ROWS} positions: {tiles} GFLOP/s; chunks of {chunks}: {rates} GFLOP/s)")

    def as_result(self) -> dict:
        """What is saved (``measure.saved``): lists, JSON's own shapes."""
        return {"tiles": [list(p) for p in self.tiles], "chunks": [list(p) for p in self.chunks], "flops": self.flops}

    @staticmethod
    def from_result(result: dict) -> "PromptChoice":
        """``as_result`` read back (``measure.saved`` checked its shape)."""
        return PromptChoice(tuple((int(v), float(s)) for v, s in result["tiles"]),
                            tuple((int(c), float(s)) for c, s in result["chunks"]), float(result["flops"]))


class _Candidate:
    """One variant's samples, as ``measure.timing.samples`` takes a timer: ``seconds(rows)``."""

    def __init__(self, run: Seconds, tile: int):
        self.run, self.tile = run, tile

    def seconds(self, rows: int) -> float:
        return self.run(self.tile, rows)


def measure_prompt(run: Seconds, variants: Sequence[int], flops: float, budget: Optional[Budget] = None,
                   repeats: int = REPEATS, chunks: Sequence[int] = CHUNKS) -> Optional[PromptChoice]:
    """Time ``variants`` over ``ROWS`` positions (``run(variant, rows)``: one sample's seconds), then the
    other ``chunks`` on the fastest, each in ``repeats`` interleaved rounds after a warm-up (medians).
    None where the budget left fewer than ``MIN_ROUNDS`` rounds of the variants; the chunk lengths
    left out where it cut theirs (the default chunk length kept)."""
    enough = min(MIN_ROUNDS, repeats)
    timed = samples([(_Candidate(run, v), ROWS) for v in variants], repeats, budget)
    if min(len(t) for t in timed) < enough:
        return None
    per_row = {v: statistics.median(t) / ROWS for v, t in zip(variants, timed)}
    best = fastest(per_row, REFERENCE)
    others = [c for c in chunks if c != ROWS]
    timed = samples([(_Candidate(run, best), c) for c in others], repeats, budget) if others else []
    lengths = {ROWS: per_row[best]}
    if all(len(t) >= enough for t in timed):
        lengths.update({c: statistics.median(t) / c for c, t in zip(others, timed)})
    return PromptChoice(tuple(per_row.items()), tuple(sorted(lengths.items())), flops)


def layer_seconds(step, library, threads: int) -> Tuple[Seconds, float]:
    """``(run, flops)``: ``run(variant, rows)`` times one decoder layer's four linears (``step``, a
    ``kernels.c_step.CStep`` on float32 weights) by that variant over ``rows`` positions on ``threads``
    threads, the next layer at each call; ``flops`` per position of one layer's linears."""
    if step.dims.weights != 0:  # kernels.bf16.F32: the variants read float32 blocks
        raise ValueError("the prompt GEMM's variants run float32 weights")
    layers = [step.linears(i) for i in range(len(step.layers))]
    shapes = [shape for layer in layers for shape in layer]
    x = torch.randn(max(CHUNKS) * max(k for _, _, k in shapes), generator=torch.Generator().manual_seed(0))
    y = torch.empty(max(CHUNKS) * max(n for _, n, _ in shapes))
    turn, holds = [0], step  # the step holds the copies the addresses point into: kept while ``run`` is

    def run(tile: int, rows: int) -> float:
        if rows > max(CHUNKS) or holds is None:
            raise ValueError(f"at most {max(CHUNKS)} rows")
        shapes, turn[0] = layers[turn[0] % len(layers)], turn[0] + 1
        start = time.perf_counter()
        for address, n, k in shapes:
            library.skinny_linear_tile(tile, x.data_ptr(), address, None, y.data_ptr(), rows, n, k, threads)
        return time.perf_counter() - start

    return run, 2.0 * sum(n * k for _, n, k in layers[0])


def measurable(model: Module, eager_lean: bool) -> bool:
    """Whether ``model``'s long passes run the C step on float32 weights, where its runner runs the lean
    forward eager (``eager_lean``, the caller's to ask of its runner): the only passes a prompt plan changes."""
    from kernels.c_step import step_for

    weight = next(model.parameters(), None)
    return weight is not None and weight.dtype == torch.float32 and eager_lean and step_for(model, MANY_ROWS + 1)


@torch.no_grad()
def measure_model(model: Module, budget: Optional[Budget] = None) -> Tuple[Optional[PromptChoice], Dict[int, str]]:
    """``measure_prompt`` on ``model``'s own linears (its C step made, as its first pass would: one copy
    of the weights) on torch's threads; with the short names of this build's variants."""
    from kernels import skinny
    from kernels.c_step import CStep
    from kernels.prompt_gemm import tiles

    library = skinny.library()
    variants: Sequence[Tile] = tiles(library)
    run, flops = layer_seconds(CStep(model), library, torch.get_num_threads())
    return measure_prompt(run, [t.index for t in variants], flops, budget), {t.index: t.short() for t in variants}


@torch.no_grad()
def choose_prompt(model: Module, budget: Optional[Budget] = None) -> Optional[str]:
    """``measure_model`` on ``model`` and its plan given to it (``set_plan``), as the start-up does for the
    REPL and the benchmark (``measure.steps.prompt_step``, unsaved here): the line saying what was measured
    and chosen, or None where its long passes do not run the float32 C step under the default runner."""
    from kernels import skinny
    from kernels.prompt_gemm import DEFAULT, set_plan
    from runners.config import RunnerConfig

    runner = RunnerConfig()
    if not measurable(model, runner.lean_for(model) and not runner.compiled_for(model)):
        return None
    choice, names = measure_model(model, budget)
    if choice is None:
        set_plan(model, DEFAULT)
        return f"{describe(DEFAULT, skinny.library())} (fallback: {budget.reason if budget is not None else 'not timed'})"
    set_plan(model, choice.plan())
    return choice.line(names, skinny.library())
