"""The many-row float32 GEMM a prompt pass runs on: which of the skinny kernel's variants
(``skinny_tiles.c``: a register tile of rows x blocks of 16 features, the weights' blocks shared among
the threads, optionally k-panels) and which chunk length (positions per C call) the C step takes for a
pass over more than ``MANY_ROWS`` positions.

Every variant computes every output by the same FMA chain (k = 0..K-1 in order, then the bias), so the
choice changes speed only, never a bit: a position's logits do not depend on the pass's width, its
chunking or its variant. Passes of 1..``MANY_ROWS`` positions (decoding, verification) always run
variant 0, skinny_gemm.c's own loop, which the kernel plan measured.

A model's plan is kept on the model (``set_plan``, ``plan_of``); the start-up chooses it by measurement
(``measure.prompt``) and the header names it (``describe``)."""
import ctypes
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.nn import Module

MANY_ROWS = 12  # a C call over more positions than this runs the plan's variant; up to it, variant 0
REFERENCE = 0  # skinny_gemm.c's own loop: decoding's, and the default
DEFAULT_CHUNK = 256  # positions per C call of a long pass (``kernels.c_step.CHUNK_ROWS``)
ROWS_MULTIPLE = 24  # a chunk's length a multiple of every many-row tile's rows (12, 8, 6; AVX2's 6, 3; plain 4)


def chunk_bounds(r: int, chunk: int) -> List[Tuple[int, int]]:
    """A pass of ``r`` positions cut into ``ceil(r / chunk)`` C calls ``(a, b)`` of near-equal length (each
    but the last a multiple of ``ROWS_MULTIPLE`` where that stays within ``chunk``): never a short tail
    (769 positions in chunks of 256: 216, 216, 216, 121, not 256, 256, 256, 1), whose call would read
    every weight again for a few rows. Speed only: a row's result never depends on its chunk."""
    count = -(-r // chunk)
    size = min(chunk, -(-(-(-r // count)) // ROWS_MULTIPLE) * ROWS_MULTIPLE)
    return [(a, min(a + size, r)) for a in range(0, r, size)]
CHUNKS = (128, 256, 512)  # the chunk lengths a measurement may choose among
_ATTRIBUTE = "_specdec_prompt_plan"  # the model's ``__dict__`` entry (a plain value: no submodule, no state)


@dataclass(frozen=True)
class Tile:
    """Variant ``index`` of this build's many-row kernel: a register tile of ``rows`` x ``blocks`` blocks
    of 16 output features, k-panels of ``kc`` input features (0: none)."""

    index: int
    rows: int
    blocks: int
    kc: int

    def name(self) -> str:
        """"12x2" (variant 0: "12x2 (decoding's)"), "8x3, k-panels of 128"."""
        shape = f"{self.rows}x{self.blocks}"
        if self.index == REFERENCE:
            return f"{shape} (decoding's)"
        return shape + (f", k-panels of {self.kc}" if self.kc else "")

    def short(self) -> str:
        """"12x2 (decoding's)", "8x3/k128": for a list of variants."""
        return self.name() if self.index == REFERENCE else f"{self.rows}x{self.blocks}" + (f"/k{self.kc}" if self.kc else "")


def tiles(library: ctypes.CDLL) -> Tuple[Tile, ...]:
    """The variants ``library`` was built with (``skinny_tile_shape``), variant 0 first."""
    shape = (ctypes.c_int64 * 3)()
    found = []
    for index in range(library.skinny_tiles()):
        library.skinny_tile_shape(index, shape)
        found.append(Tile(index, *shape))
    return tuple(found)


@dataclass(frozen=True)
class PromptPlan:
    """The variant (``tile``, an index of ``tiles``) and the chunk length (positions; None: the C step's
    ``CHUNK_ROWS``) of a float32 pass over more than ``MANY_ROWS`` positions."""

    tile: int = REFERENCE
    chunk: Optional[int] = None


DEFAULT = PromptPlan()


def plan_of(model: Optional[Module]) -> PromptPlan:
    """The plan given to ``model`` (``set_plan``), else ``DEFAULT``."""
    found = None if model is None else model.__dict__.get(_ATTRIBUTE)
    return found if isinstance(found, PromptPlan) else DEFAULT


def set_plan(model: Module, plan: PromptPlan) -> None:
    """Give ``model``'s C step ``plan`` for its long passes (read at each pass: the next one runs it)."""
    if plan.tile < 0 or (plan.chunk is not None and plan.chunk <= MANY_ROWS):
        raise ValueError(f"a prompt plan takes a variant >= 0 and chunks of more than {MANY_ROWS} positions; got {plan}")
    model.__dict__[_ATTRIBUTE] = plan


def describe(plan: PromptPlan, library: Optional[ctypes.CDLL], chunk: int = DEFAULT_CHUNK) -> str:
    """The header's words: "prompt GEMM: tile 8x3, k-panels of 128, chunks of 256 positions"."""
    found = {t.index: t for t in tiles(library)} if library is not None else {}
    tile = found.get(plan.tile)
    name = tile.name() if tile is not None else f"variant {plan.tile}"
    return f"prompt GEMM: tile {name}, chunks of {plan.chunk or chunk} positions"


def linear(x: Tensor, packed: Tensor, n: int, bias: Optional[Tensor], tile: int) -> Tensor:
    """``x`` ``[M, K]`` float32 times a float32 weight blocked (``kernels.blocked``: ``packed``
    ``[ceil(n/16), K, 16]``) -> ``[M, n]`` (+ ``bias`` ``[n]``) by variant ``tile``, on torch's threads."""
    from kernels.skinny import library

    if packed.dtype != torch.float32 or x.dtype != torch.float32 or x.dim() != 2 or x.shape[-1] != packed.shape[1]:
        raise ValueError(f"many-row linear: weight {packed.dtype} {tuple(packed.shape)}, rows {x.dtype} {tuple(x.shape)}")
    x, packed = x.contiguous(), packed.contiguous()
    bias = None if bias is None else bias.contiguous()
    out = torch.empty((x.shape[0], n), dtype=torch.float32)
    library().skinny_linear_tile(tile, x.data_ptr(), packed.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
                                 x.shape[0], n, x.shape[1], torch.get_num_threads())
    return out
