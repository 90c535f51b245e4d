"""A dtype by one matmul of a model's layer shape, bfloat16 only where it runs clearly faster than the
float32 one (prepacked for oneDNN when it would be): EAGLE training's (``eagle.train``), a head trained
in it. Not the programs' ``--dtype auto``: one matrix can fit in a CPU's cache and hide the bytes a
whole pass reads from memory; that rule times the model's own pass (``measure.pass_dtype``)."""
import time
from typing import TYPE_CHECKING, Callable, Optional, Tuple

import torch

if TYPE_CHECKING:
    from measure.timing import Budget

CLEARLY_FASTER = 0.8  # bfloat16 must take at most this share of float32's time
Seconds = Callable[[torch.dtype, int, int, int, bool], float]


def matmul_seconds(dtype: torch.dtype, rows: int, inner: int, outer: int, prepacked: bool = False, repeats: int = 5) -> float:
    """Best time of a ``rows x inner`` by ``inner x outer`` product in ``dtype`` (one layer's shape);
    ``prepacked``: float32 from a weight reordered once for oneDNN, as ``kernels.prepacking.PrepackedLinear``."""
    x = torch.randn(rows, inner).to(dtype)
    w = torch.randn(outer, inner).to(dtype)
    if prepacked and dtype == torch.float32:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
        run = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")  # noqa: E731
    else:
        run = lambda: torch.nn.functional.linear(x, w)  # noqa: E731
    run()  # warm-up: the kernel's first call pays its set-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def choose_cpu_dtype(inner: int, outer: int, rows: int = 4, prepacked: bool = False,
                     seconds: Seconds = matmul_seconds, budget: Optional["Budget"] = None) -> Tuple[str, str]:
    """``(dtype name, reason)``: bfloat16 when its matmul of the model's shape (a few rows, as decoding
    and verification run) takes at most ``CLEARLY_FASTER`` of float32's, else float32. ``prepacked``:
    float32 layers could be prepacked, and each row of a comparison gets the faster of the two
    kernels (``measure.kernels.KernelChoice``), so float32 is timed both ways and the faster counts.
    A ``budget`` spent after the float32 timing: float32, the safe default, and the reason says it fell back."""
    own = seconds(torch.float32, rows, inner, outer, False)
    packed = seconds(torch.float32, rows, inner, outer, True) if prepacked else float("inf")
    fp32 = min(own, packed)
    if budget is not None and budget.exhausted():
        return "float32", f"float32 (fallback: {budget.reason})"
    bf16 = seconds(torch.bfloat16, rows, inner, outer, False)
    ratio = bf16 / fp32 if fp32 > 0 else float("inf")
    chosen = "bfloat16" if ratio <= CLEARLY_FASTER else "float32"
    verdict = "clearly faster" if chosen == "bfloat16" else "not clearly faster"
    versus = "the faster float32 kernel's (prepacked)" if packed < own else "the faster float32 kernel's (own)" if prepacked else "float32's"
    return chosen, (f"{chosen} by measurement: a bfloat16 matmul of the model's shape ({rows}x{inner}x{outer}) "
                    f"took {ratio:.2f} of {versus} time ({verdict})")
