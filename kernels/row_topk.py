"""Each logits row's few largest values and their indices in one C pass over the row (``row_topk.c``): what NASD's
filler top-k reads from every verified position of every step (``drafters.ngram``). numpy's partition of a
49,152-wide row took about a hundred microseconds a step, a hundredth of a pass; this reads the row once. Its own small
library, built at first use as the skinny kernel's is (``kernels.skinny``: cached by a hash of source, compiler and
CPU), so the big library is neither rebuilt nor touched; where it cannot be built, ``row_topk`` answers None and the
caller keeps its numpy path."""
import ctypes
import functools
import subprocess
from pathlib import Path
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("row_topk.c")


@functools.lru_cache(maxsize=1)
def _function() -> Optional[Callable[..., int]]:
    """The library's ``row_topk``, built or loaded once a process; None where no C compiler builds it."""
    from kernels.skinny import _build
    from utils.models import cache_dir
    from utils.toolchain import c_compiler

    compiler = c_compiler()
    if compiler is None:
        return None
    try:
        function = ctypes.CDLL(str(_build(compiler, cache_dir() / "kernels", (SOURCE,), "row_topk"))).row_topk
    except (OSError, AttributeError, RuntimeError, subprocess.SubprocessError):
        return None
    function.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 2
    function.restype = ctypes.c_int64
    return function


def available() -> bool:
    """Whether ``row_topk`` reads rows in C here (else it always answers None)."""
    return _function() is not None


def row_topk(logits: Tensor, count: int) -> Optional[Tuple[Tensor, Tensor]]:
    """``logits.topk(count, dim=-1)`` of float32 CPU logits ``[n, V]``, contiguous: values ``[n, count]`` (the same
    numbers) and indices ``[n, count]`` int64 (the same wherever a row's ``count`` largest values are distinct and
    above the rest; among equal values the lower index first; a slot no value above -inf filled holds -inf and -1).
    None where the row holds a NaN, the tensor is of another kind, or the library is not built here."""
    function = _function()
    if function is None or logits.dtype != torch.float32 or logits.device.type != "cpu" or logits.dim() != 2 \
            or not logits.is_contiguous() or not 0 < count <= logits.shape[1]:
        return None
    n, width = logits.shape
    values, indices = torch.empty((n, count), dtype=torch.float32), torch.empty((n, count), dtype=torch.int64)
    if function(logits.data_ptr(), n, width, count, values.data_ptr(), indices.data_ptr()):
        return None  # a NaN: torch's topk ranks it first, the caller's path decides
    return values, indices
