"""``--dtype auto`` on CPU for a model that is too big to keep in float32 without asking: bfloat16
only where this CPU runs bfloat16 matmuls clearly faster than float32 ones, measured at start-up."""
import time
from typing import Callable, Tuple

import torch

CLEARLY_FASTER = 0.8  # bfloat16 must take at most this share of float32's time


def matmul_seconds(dtype: torch.dtype, rows: int, inner: int, outer: int, repeats: int = 5) -> float:
    """Best time of a ``rows x inner`` by ``inner x outer`` product in ``dtype`` (one layer's shape)."""
    x = torch.randn(rows, inner).to(dtype)
    w = torch.randn(outer, inner).to(dtype)
    torch.nn.functional.linear(x, w)  # warm-up: the kernel's first call pays its set-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.nn.functional.linear(x, w)
        best = min(best, time.perf_counter() - start)
    return best


def choose_cpu_dtype(inner: int, outer: int, rows: int = 4,
                     seconds: Callable[[torch.dtype, int, int, int], float] = matmul_seconds) -> Tuple[str, str]:
    """``(dtype name, reason)``: bfloat16 when its matmul of the model's shape (a few rows, as decoding
    and verification run) takes at most ``CLEARLY_FASTER`` of float32's, else float32."""
    fp32 = seconds(torch.float32, rows, inner, outer)
    bf16 = seconds(torch.bfloat16, rows, inner, outer)
    ratio = bf16 / fp32 if fp32 > 0 else float("inf")
    chosen = "bfloat16" if ratio <= CLEARLY_FASTER else "float32"
    verdict = "clearly faster" if chosen == "bfloat16" else "not clearly faster"
    return chosen, (f"{chosen} by measurement: a bfloat16 matmul of the model's shape ({rows}x{inner}x{outer}) "
                    f"took {ratio:.2f} of float32's time ({verdict})")


def model_shape(folder) -> Tuple[int, int]:
    """(hidden size, intermediate size) from a model folder's config, for ``choose_cpu_dtype``."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    hidden = config.hidden_size
    return hidden, getattr(config, "intermediate_size", None) or 4 * hidden
