"""How far ahead decoding's tiles prefetch their weight streams (``skinny_ahead``, ``kernels/linears.h``), chosen
by a short measurement once per process, library and dtype.

A one-position pass reads every weight once, as a few sequential streams a thread. On a Sapphire Rapids Xeon
the tiles' software prefetch 4 KB ahead of each stream (the build's default) was what let a pass read at the
memory's speed; on a Zen 4 EPYC VM the hardware's prefetchers alone streamed faster, and the prefetch cost a
bfloat16 pass about a sixth of its time (``scripts/pass_read.py``). So ``settle`` races the two on the machine:
the model's own gate/up blocks (or copies of their shape), each layer's one-position linear in turn (a sample
streams 64 MB from memory, twice the largest L3 of the CPUs met), 4 KB ahead against no software prefetch, interleaved rounds,
each distance by its least sample (``bf16_choice.least``: another process only ever adds time to a sample; on the
busy 2-core Zen 4, in 8 races on one thread, the medians picked 4 KB in 3, where every race's least samples read none
12-16% faster, and a whole one-position pass ran 15-20% faster without, noisy); none only where clearly faster
(``bf16_choice.fastest``'s margin). On an AVX-512 build float32 races a third way (``L2``): one position on
``kernels/f32_few.h``'s few-row loop too, 1 row x 4 blocks, every stream prefetched 4 KB ahead into L2 (on the
same Zen 4 alone, a whole one-position pass 13.6 ms against 17.2 on decoding's loop, 2026-11-30, docs/runners.md).
Speed only: a prefetch or a register tile changes no bit, so every choice gives every pass the same logits.

The timer is given (``Timer``): the choice is a pure function of the seconds it returns."""
import ctypes
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

from kernels.bf16_choice import MEASURED, Measured, fastest, in_window, least

F32 = 0  # the weights' format (``c_step.c``'s Dims.weights): float32; a bfloat16 path otherwise
DEFAULT, NONE = 4096, 0  # bytes ahead: the build's default, and no software prefetch
L2 = -1  # float32 on an AVX-512 build: one position on the few-row loop, its streams prefetched into L2 (FEW_L2)
FEW_L2 = (2, 1, DEFAULT, 1)  # kernels/f32_few.h's f32_few for L2: one position too, its 1 x 4 tile, bytes ahead, from 1 row
Timer = Callable[[int], float]  # bytes ahead -> seconds of a sample
WORKING_SET = 64 << 20  # bytes a sample streams: the model's blocks (or copies) in turn, past the caches

UNTIMED = "the build's default, untimed (no blocked weights of the model's to time on)"  # a ``Measured.how``
_CHOSEN: Dict[Tuple[str, int], Measured] = {}  # (library's file, 0 float32 / 1 bfloat16) -> the choice


def kind(fmt: int) -> int:
    """``skinny_ahead``'s index for weights of format ``fmt``: 0 float32, 1 bfloat16 (every path)."""
    return 0 if fmt == F32 else 1


def candidates(library: ctypes.CDLL, fmt: int) -> Tuple[int, ...]:
    """The ways raced for format ``fmt``: DEFAULT and NONE; float32 on an AVX-512 build L2 too."""
    return (DEFAULT, NONE, L2) if fmt == F32 and library.skinny_simd() == 512 else (DEFAULT, NONE)


def apply(library: ctypes.CDLL, fmt: int, ahead: int) -> None:
    """Set ``library``'s tiles of format ``fmt`` to prefetch ``ahead`` bytes on (0: none; L2: float32's one position on
    the few-row loop, prefetched into L2, decoding's distance left as it is; else that loop as built)."""
    if fmt == F32:
        few, c = library.skinny_set_few32, ctypes.c_int64
        few.restype = c
        built = tuple(few(c(-1), c(-1), c(-1), c(-1), c(4 + i)) for i in range(4))  # the loop as built
        few(*(c(v) for v in (FEW_L2 if ahead == L2 else built)), c(0))
        if ahead == L2:
            return  # decoding's loop (past 12 rows) keeps the distance it had
    library.skinny_set_ahead(ctypes.c_int64(-1 if kind(fmt) else ahead), ctypes.c_int64(ahead if kind(fmt) else -1),
                             ctypes.c_int64(kind(fmt)))


def timer(library: ctypes.CDLL, fmt: int, shape: Tuple[int, int], weights: Optional[Sequence[Tensor]] = None) -> Timer:
    """A ``Timer``: ``library``'s one-position linear of ``shape`` (N, K) on each of the first WORKING_SET bytes of
    ``weights`` in turn (blocked [N/16, K, 16] in format ``fmt``'s dtype; None: copies made here, their values
    immaterial to speed), on torch's threads, prefetching the given bytes ahead."""
    n, k = shape
    dtype = torch.float32 if fmt == F32 else torch.bfloat16
    copies = max(2, min(16, -(-WORKING_SET // (((n + 15) // 16) * k * 16 * dtype.itemsize))))
    weights = list(weights[:copies]) if weights else [torch.full(((n + 15) // 16, k, 16), 1 / 64, dtype=dtype) for _ in range(copies)]
    x, y, threads, c = torch.randn(1, k, generator=torch.Generator().manual_seed(0)), torch.empty(1, n), torch.get_num_threads(), ctypes.c_int64

    def run(ahead: int) -> float:
        apply(library, fmt, ahead)
        start = time.perf_counter()
        for w in weights:
            if fmt == F32:
                library.skinny_linear(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(w.data_ptr()), None, ctypes.c_void_p(y.data_ptr()),
                                      c(1), c(n), c(k), c(threads))
            else:
                library.skinny_linear_bf16(c(fmt), c(0), ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(w.data_ptr()), None,
                                           ctypes.c_void_p(y.data_ptr()), c(1), c(n), c(k), c(threads))
        return time.perf_counter() - start

    return run


def choose(run: Timer, ways: Tuple[int, ...] = (DEFAULT, NONE)) -> Measured:
    """Of ``ways``, the one ``run`` times fastest, by each one's least sample: DEFAULT unless another is clearly faster."""
    seconds = least(ways, run)
    return Measured(fastest(seconds, DEFAULT), MEASURED, tuple(seconds.items()))


def settle(library: ctypes.CDLL, fmt: int, shape: Tuple[int, int], weights: Optional[Sequence[Tensor]] = None,
           run: Optional[Timer] = None) -> Measured:
    """Measure (the first time this process asks ``library`` for format ``fmt``'s kind) and set how far ahead its
    tiles prefetch; ``weights``: the model's blocks of ``shape`` to time on; ``run``: a given timer. With neither
    (a model whose layers are not released yet: the start-up's kernel measurement) the build's default is set and
    nothing is timed or kept: copies to time on would add up to WORKING_SET bytes to the start's peak, and the
    model's released blocks are timed when its step is made on them."""
    key = (getattr(library, "_name", str(id(library))), kind(fmt))
    found = _CHOSEN.get(key)
    if found is None and weights is None and run is None:
        apply(library, fmt, DEFAULT)
        return Measured(DEFAULT, UNTIMED)
    if found is None:
        found = _CHOSEN[key] = in_window(lambda: choose(run or timer(library, fmt, shape, weights), candidates(library, fmt)))
    apply(library, fmt, found.pick)
    return found


def words(library: ctypes.CDLL, fmt: int) -> str:
    """The headers' words for how far ahead ``library``'s tiles of format ``fmt``'s kind prefetch, and why."""
    found = _CHOSEN.get((getattr(library, "_name", str(id(library))), kind(fmt)))
    if found is None:
        return f"weights prefetched {DEFAULT // 1024} KB ahead (the build's default, untimed)"
    return _phrase(found)


def _phrase(found: Measured) -> str:
    how = f"{found.how}, {found.load}" if found.load else found.how
    if found.pick == L2:
        return f"weights prefetched {DEFAULT // 1024} KB ahead into L2 on the few-row loop {how}"
    if found.pick == NONE:
        return f"weights streamed without software prefetch {how}"
    return f"weights prefetched {found.pick // 1024} KB ahead {how}"


def raced() -> str:
    """Each dtype's distance as this process raced it, and the least samples: "bfloat16 weights streamed without
    software prefetch by measurement (3.87 ms against 4.63 ms 4 KB ahead)"; "" where none was raced. For the
    verbose header after the first passes: a model's own line is written before its step is made, on the
    layers' release, so it names the build's default where a start measured nothing (every cost saved)."""
    parts = []
    for (_, fmt), found in _CHOSEN.items():
        against = ", ".join(f"{s * 1e3:.3g} ms {_way(b)}" for b, s in found.others())
        parts.append(f"{'bfloat16' if fmt else 'float32'} {_phrase(found)} ({found.picked_seconds() * 1e3:.3g} ms against {against})")
    return "; ".join(parts)


def _way(ahead: int) -> str:
    return "none" if ahead == NONE else "the few-row loop into L2" if ahead == L2 else f"{ahead // 1024} KB ahead"


def forget() -> None:
    """Drop every choice: the next ``settle`` measures again."""
    _CHOSEN.clear()
