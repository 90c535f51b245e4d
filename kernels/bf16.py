"""bfloat16 weights on CPU (``skinny_bf16.c``): which of its paths read them here, and a linear on one.

The C step on a bfloat16 model reads the weights blocked in bfloat16 (``kernels.blocked``) and computes
everything else in float32. One path per machine, the best this build has (``chosen``): the
``avx512_bf16`` dot (vdpbf16ps, the activations rounded to bfloat16 for it) where the compiler targets
it, else a widening load (bfloat16 to float32 by a shift) on AVX-512, on AVX2, or in plain C. Each is
row-invariant, and every pass of a run takes the same one, so verification gives decoding's logits bit
for bit. The widening paths agree with one another bit for bit, and with the float32 step on the
weights widened to float32; the dot path rounds apart from them (``skinny_bf16.c`` says how).
"""
import ctypes
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from kernels.prompt_gemm import MANY_ROWS  # a linear over more rows than this takes its path's many-row variant

F32 = 0  # skinny_bf16.c's format of float32 weights
SCALAR, AVX2, AVX512, DOT = 1, 2, 3, 4  # its bfloat16 paths
NAMES = {DOT: "avx512_bf16 dot", AVX512: "AVX-512 widening load", AVX2: "AVX2 widening load", SCALAR: "widening load in plain C"}
FORCED: Optional[int] = None  # a path to take instead of the best (tests: each path this build has, on this CPU)
# each path's many-row variant (``skinny_bf16_rows.c``'s SHAPES): speed only, every variant gives the same bits
PROMPT_TILE = {DOT: 2, AVX512: 2, AVX2: 1, SCALAR: 1}


def paths(library: ctypes.CDLL) -> List[int]:
    """The bfloat16 paths ``library`` was built with, best first."""
    have = library.skinny_bf16_paths()
    return [p for p in (DOT, AVX512, AVX2, SCALAR) if have & (1 << p)]


def chosen(library: ctypes.CDLL) -> int:
    """The path the C step takes here: ``FORCED`` where set (it must be built), else the best."""
    built = paths(library)
    if FORCED is not None:
        if FORCED not in built:
            raise ValueError(f"the bfloat16 path {NAMES.get(FORCED, FORCED)} is not built here (built: {[NAMES[p] for p in built]})")
        return FORCED
    return built[0]


def tiles(library: ctypes.CDLL, path: int) -> List[Tuple[int, int, int]]:
    """``path``'s variants (``skinny_bf16_rows.c``), each (rows, blocks, kc): 0 decoding's, then the many-row ones."""
    shape = (ctypes.c_int64 * 3)()
    found = []
    for index in range(library.skinny_bf16_tiles(path)):
        library.skinny_bf16_tile_shape(path, index, shape)
        found.append(tuple(shape))
    return found


def prompt_tile(path: int, rows: int) -> int:
    """The variant a linear of ``path`` over ``rows`` rows takes: decoding's (0) up to ``MANY_ROWS``, else
    the path's many-row one (``PROMPT_TILE``)."""
    return PROMPT_TILE.get(path, 0) if rows > MANY_ROWS else 0


def describe(path: int) -> str:
    """The header's words for ``path``: "bfloat16 weights read by the avx512_bf16 dot, activations rounded
    to bfloat16 for it, float32 sums" or "... by the AVX2 widening load, float32 activations and sums"."""
    done = "activations rounded to bfloat16 for it, float32 sums" if path == DOT else "float32 activations and sums"
    return f"bfloat16 weights read by the {NAMES[path]}, {done}"


def linear(x: Tensor, packed: Tensor, n: int, bias: Optional[Tensor], path: Optional[int] = None,
           tile: Optional[int] = None) -> Tensor:
    """``x`` ``[M, K]`` float32 times a bfloat16 weight blocked (``kernels.blocked.blocked``: ``packed``
    ``[ceil(n/16), K, 16]``) -> ``[M, n]`` float32 (+ ``bias`` ``[n]`` float32), by ``path`` (None:
    ``chosen``) and its variant ``tile`` (None: ``prompt_tile``), on torch's thread count."""
    from kernels.skinny import library

    loaded = library()
    path = chosen(loaded) if path is None else path
    if path not in paths(loaded) or packed.dtype != torch.bfloat16 or x.dtype != torch.float32 or x.shape[-1] != packed.shape[1]:
        raise ValueError(f"bfloat16 linear: path {path}, weight {packed.dtype}, rows {x.dtype} {tuple(x.shape)}")
    x, packed = x.contiguous(), packed.contiguous()
    bias = None if bias is None else bias.to(torch.float32).contiguous()
    out = torch.empty((x.shape[0], n), dtype=torch.float32)
    tile = prompt_tile(path, x.shape[0]) if tile is None else tile
    loaded.skinny_linear_bf16(path, tile, x.data_ptr(), packed.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
                              x.shape[0], n, x.shape[1], torch.get_num_threads())
    return out


def layer_rows(x: Tensor, packed: Tensor, n: int, bias: Optional[Tensor]) -> Tensor:
    """A bfloat16 layer on the skinny route (``kernels.prepacking.PrepackedLinear``): ``x`` ``[..., K]``
    bfloat16 CPU times its weight blocked in bfloat16 (``packed``) -> ``[..., n]`` bfloat16: the rows
    widened to float32 (exactly), ``linear``'s float32 sums (+ ``bias``), rounded to bfloat16 once, each
    row alone. Rows of another dtype or device raise, in one line, as ``F.linear``'s mismatch would."""
    if x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.shape[-1] != packed.shape[1]:
        raise RuntimeError(f"a bfloat16 layer takes bfloat16 CPU rows of {packed.shape[1]} features, got {x.dtype} {x.device} {tuple(x.shape)}")
    rows = x.reshape(-1, x.shape[-1]).float()
    return linear(rows, packed, n, bias).to(torch.bfloat16).reshape(*x.shape[:-1], n)
