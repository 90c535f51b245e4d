"""bfloat16 weights on CPU (``skinny_bf16.c``): which of its paths read them here, and a linear on one.

The C step on a bfloat16 model reads the weights blocked in bfloat16 (``kernels.blocked``) and computes
everything else in float32. Its paths: the ``avx512_bf16`` dot (vdpbf16ps, the activations rounded to
bfloat16 for it) where the compiler targets it, and a widening load (bfloat16 to float32 by a shift) on
AVX-512, on AVX2, or in plain C; and Intel's AMX tiles (``skinny_amx.c``: TDPBF16PS, the activations
rounded to bfloat16) where the compiler targets them, the CPU has them and Linux grants them
(``amx_absent`` says which is missing). One path per model in a process, keyed by the shape of its
gate/up (``chosen``): ``FORCED_FOR`` or ``FORCED`` where set, else the fastest on a run of one-position
and many-row linears of that shape, read from the model's own blocks, measured here once
(``kernels.bf16_choice``); then that path's many-row variant for long passes the same way
(``prompt_tile``). So a pair's target and drafter each take the path fastest on their own shapes. Each
path is row-invariant, and every pass of a model takes the same one (a model's logits never mix with
another's), so verification gives decoding's logits bit for bit. The widening paths agree with one another bit for
bit, and with the float32 step on the weights widened to float32; the dot and AMX paths round apart
from them and from each other (``skinny_bf16.c``, ``skinny_amx.c`` say how). ``describe`` and ``short_words`` name the choice and its measurement.
"""
import ctypes
import functools
import weakref
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

import kernels.bf16_choice as choice
from kernels.prompt_gemm import MANY_ROWS  # a linear over more rows than this takes its path's many-row variant

F32 = 0  # skinny_bf16.c's format of float32 weights
SCALAR, AVX2, AVX512, DOT, AMX = 1, 2, 3, 4, 5  # its bfloat16 paths
ROUNDING = (DOT, AMX)  # the paths that round the activations to bfloat16 (the others widen the weights)
NAMES = {AMX: "AMX tiles", DOT: "avx512_bf16 dot", AVX512: "AVX-512 widening load", AVX2: "AVX2 widening load", SCALAR: "widening load in plain C"}
FORCED: Optional[int] = None  # a path to take instead of the measured one (scripts' --path; tests: each path built)
FORCED_FOR: Dict[Tuple[int, int], int] = {}  # a path forced for the models whose gate/up has that shape (N, K): before FORCED
FORCED_TILE: Optional[int] = None  # a many-row variant to take instead of the measured one (scripts/prompt_pass.py)
# each path's many-row variant (``skinny_bf16_rows.c``'s SHAPES) where no other measures clearly faster: speed only
PROMPT_TILE = {AMX: 1, DOT: 2, AVX512: 2, AVX2: 1, SCALAR: 1}
DEFAULT_SHAPE = (3072, 576)  # the linear measured where a caller names none: the embedded model's gate/up (N, K)


@dataclass
class _Decided:
    """A library's choices in this process: the measured path (None until needed), each path's
    many-row variant, and the linear's shape (N, K) they were measured on. Holds no library."""

    shape: Tuple[int, int]
    path: Optional[choice.Measured] = None
    tiles: Dict[int, choice.Measured] = field(default_factory=dict)


# per library, the choices made for each gate/up shape (N, K), in the order first asked
_DECIDED: "weakref.WeakKeyDictionary[ctypes.CDLL, Dict[Tuple[int, int], _Decided]]" = weakref.WeakKeyDictionary()


def paths(library: ctypes.CDLL) -> List[int]:
    """The bfloat16 paths ``library`` was built with, best first."""
    have = library.skinny_bf16_paths()
    return [p for p in (AMX, DOT, AVX512, AVX2, SCALAR) if have & (1 << p)]


AMX_ABSENT = {1: "not built (the compiler does not target AMX-BF16 here)", 2: "this CPU has no AMX-BF16",
              3: "Linux refused the tile data state (arch_prctl)"}


def amx_absent(library: ctypes.CDLL) -> str:
    """"" where the AMX path runs here, else why not in a few words (``skinny_amx.c``'s ``amx_state``)."""
    return AMX_ABSENT.get(library.amx_state(), "")


def _shape(library: ctypes.CDLL, shape: Optional[Tuple[int, int]]) -> Tuple[int, int]:
    """``shape``, or where a caller names none (a layer's own skinny route, ``linear``), the first shape
    ``library`` decided for in this process (its first model's), else ``DEFAULT_SHAPE``."""
    if shape is not None:
        return (int(shape[0]), int(shape[1]))
    return next(iter(_DECIDED.get(library, {})), DEFAULT_SHAPE)


def _decided(library: ctypes.CDLL, shape: Optional[Tuple[int, int]]) -> _Decided:
    table = _DECIDED.get(library)
    if table is None:
        table = _DECIDED[library] = {}
    shape = _shape(library, shape)
    found = table.get(shape)
    if found is None:
        found = table[shape] = _Decided(shape)
    return found


def forced(shape: Tuple[int, int]) -> Optional[int]:
    """The path forced for models of gate/up ``shape``: ``FORCED_FOR``'s, else ``FORCED`` (None: measured)."""
    return FORCED_FOR.get(tuple(shape), FORCED)


def _timer(library: ctypes.CDLL, decided: _Decided, weights: Optional[Sequence[Tensor]]) -> choice.Timer:
    mine = weights if weights and all(tuple(w.shape) == ((decided.shape[0] + 15) // 16, decided.shape[1], 16) and
                                      w.dtype == torch.bfloat16 and w.is_contiguous() for w in weights) else None
    return choice.linear_timer(library, decided.shape, torch.get_num_threads(), mine)


def chosen(library: ctypes.CDLL, shape: Optional[Tuple[int, int]] = None, weights: Optional[Sequence[Tensor]] = None) -> int:
    """The path the C step takes here for a model whose gate/up is ``shape`` (N, K; None: the first
    shape asked, ``_shape``): ``forced`` where set (it must be built), else the one measured fastest
    (``bf16_choice.choose_path``: a run of one-position and many-row linears, weighed) the first time
    this process asked ``library`` for that shape, read from ``weights`` (the model's blocks of that
    shape, taken in turn; None: copies made for it), the dot or AMX path only where clearly faster than
    the best widening one; a model of the same shape takes the same path (``forget`` asks again).
    The path's many-row variant is chosen with it (``prompt_tile``), so no pass measures."""
    shape = _shape(library, shape)
    path = forced(shape)
    if path is not None:
        built = paths(library)
        if path not in built:
            raise ValueError(f"the bfloat16 path {NAMES.get(path, path)} is not built here (built: {[NAMES[p] for p in built]})")
    else:
        decided = _decided(library, shape)
        if decided.path is None:
            built = paths(library)
            # the default a path must beat clearly: a widening one (they all give the same bits, so a close
            # race between them changes no output from run to run; the dot and AMX paths round apart)
            default = next((p for p in built if p not in ROUNDING), built[0])
            decided.path = choice.in_window(lambda: choice.choose_path(built, _timer(library, decided, weights), default, PROMPT_TILE, ROUNDING))
        path = decided.path.pick
    _tile(library, path, shape, weights)
    return path


def _tile(library: ctypes.CDLL, path: int, shape: Optional[Tuple[int, int]] = None,
          weights: Optional[Sequence[Tensor]] = None) -> choice.Measured:
    """``path``'s many-row variant, measured the first time it is asked (``FORCED_TILE`` aside)."""
    decided = _decided(library, shape)
    found = decided.tiles.get(path)
    if found is None:
        many = list(range(1, library.skinny_bf16_tiles(path)))
        found = decided.tiles[path] = choice.in_window(lambda: choice.choose_tile(path, many, PROMPT_TILE.get(path, 1), _timer(library, decided, weights)))
    return found


def forget(library: Optional[ctypes.CDLL] = None) -> None:
    """Drop the choices made for ``library`` (None: every library): the next ``chosen`` measures again."""
    if library is None:
        _DECIDED.clear()
    else:
        _DECIDED.pop(library, None)


def tiles(library: ctypes.CDLL, path: int) -> List[Tuple[int, int, int]]:
    """``path``'s variants (``skinny_bf16_rows.c``), each (rows, blocks, kc): 0 decoding's, then the many-row ones."""
    shape = (ctypes.c_int64 * 3)()
    found = []
    for index in range(library.skinny_bf16_tiles(path)):
        library.skinny_bf16_tile_shape(path, index, shape)
        found.append(tuple(shape))
    return found


def prompt_tile(library: ctypes.CDLL, path: int, rows: int, shape: Optional[Tuple[int, int]] = None) -> int:
    """The variant a linear of ``path`` over ``rows`` rows takes in a model of gate/up ``shape`` (``_shape``):
    decoding's (0) up to ``MANY_ROWS``, else ``FORCED_TILE`` where set, else the path's many-row one
    measured fastest (``chosen``)."""
    if rows <= MANY_ROWS:
        return 0
    return FORCED_TILE if FORCED_TILE is not None else _tile(library, path, shape).pick


@functools.lru_cache(maxsize=None)  # asked once a pass; a library is loaded once a process and kept
def decoding_rows(library: ctypes.CDLL, path: int) -> int:
    """The most positions a C step chunk on ``path`` runs on decoding's loop (variant 0): ``MANY_ROWS``, or
    its register tile's rows where more (the AMX path's 16: passes of 13-16 positions then read each weight
    once in one row tile, with the prefetches and three weight streams of 1-12 positions). Speed only: every
    variant of a path gives a row the same bits."""
    if path == F32:
        return MANY_ROWS
    return max(MANY_ROWS, tiles(library, path)[0][0])


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _why(library: ctypes.CDLL, path: int, shape: Optional[Tuple[int, int]] = None) -> str:
    """Why ``path`` runs here, and which many-row variant: "by measurement (3072x576 linears, 1, 8 and 64 rows
    weighed 64:16:8, 0.2 + 0.205 + 0.586 ms against 0.17 + 0.755 + 5.29 ms avx512_bf16 dot, 0.224 ms at one position AVX2
    widening load, ...); prompt tile 32x2, the only one built", or, where no path rounds apart, "by
    measurement (a one-position 3072x576 linear 0.41 ms against ...)"."""
    decided = _decided(library, shape)
    if path == forced(decided.shape):
        why = "forced"
    elif decided.path is None or decided.path.pick != path:
        why = "as asked"  # a caller's own path (``linear``'s argument)
    elif decided.path.how != choice.MEASURED:
        why = f"{decided.path.how} here"
    elif not decided.path.parts:  # the widening paths alone: their one-position race
        n, k = decided.shape
        others = ", ".join(f"{_ms(s)} {NAMES[p]}" for p, s in decided.path.others())
        why = f"by measurement (a one-position {n}x{k} linear {_ms(decided.path.picked_seconds())} against {others})"
    else:
        n, k = decided.shape
        parts = {p: f"{one * 1e3:.3g} + {verify * 1e3:.3g} + {many * 1e3:.3g} ms" if many == many else f"{one * 1e3:.3g} ms at one position"
                 for p, one, verify, many in decided.path.parts}
        others = ", ".join(f"{parts[p]} {NAMES[p]}" for p, *_ in decided.path.parts if p != path)
        weights = f"{choice.DECODED}:{choice.VERIFIED}:{choice.PROMPT // choice.ROWS}"
        why = f"by measurement ({n}x{k} linears, 1, {choice.VERIFY_ROWS} and {choice.ROWS} rows weighed {weights}, {parts[path]} against {others})"
    if decided.path is not None and decided.path.pick == path and decided.path.load:
        why = f"{why}, {decided.path.load}"
    shapes = tiles(library, path)
    name = lambda t: f"{shapes[t][0]}x{shapes[t][1]}"  # noqa: E731 (register tile: rows x blocks of 16 features)
    if FORCED_TILE is not None:
        return f"{why}; prompt tile {name(FORCED_TILE)} forced"
    tile = _tile(library, path, decided.shape)
    if tile.how != choice.MEASURED:
        return f"{why}; prompt tile {name(tile.pick)}, {tile.how}"
    others = ", ".join(f"{_ms(s)} {name(t)}" for t, s in tile.others())
    load = f", {tile.load}" if tile.load else ""
    return f"{why}; prompt tile {name(tile.pick)} by measurement ({choice.ROWS} rows {_ms(tile.picked_seconds())} against {others}){load}"


def short_words(library: ctypes.CDLL, path: int, shape: Optional[Tuple[int, int]] = None) -> str:
    """The path in a few words: "AVX-512 widening load by measurement", "AVX2 widening load, forced" (for
    a model of gate/up ``shape``, ``_shape``)."""
    why = _why(library, path, shape).split(" (", 1)[0].split(";", 1)[0]
    measured = _decided(library, shape).path
    if measured is not None and measured.pick == path and measured.load and forced(_shape(library, shape)) != path:
        why += ", raced under load"  # the cores are in the full words (``describe``)
    return f"{NAMES[path]} {why}" if why.startswith("by ") else f"{NAMES[path]}, {why}"


def describe(library: ctypes.CDLL, path: int, shape: Optional[Tuple[int, int]] = None) -> str:
    """The header's words for ``path``: "bfloat16 weights read by the avx512_bf16 dot, activations rounded
    to bfloat16 for it, float32 sums, ..." or "... by the AVX2 widening load, float32 activations and sums,
    ...", then why it runs and its many-row variant (``_why``), and why there is no AMX path where the
    CPU has AMX but it is missing (``amx_absent``); ``shape``: the model's gate/up, as ``chosen``'s."""
    done = "activations rounded to bfloat16 for it, float32 sums" if path in ROUNDING else "float32 activations and sums"
    absent = amx_absent(library)
    missing = f"; no AMX path: {absent}" if absent and absent != AMX_ABSENT[2] else ""
    return f"bfloat16 weights read by the {NAMES[path]}, {done}, {_why(library, path, shape)}{missing}"


def linear(x: Tensor, packed: Tensor, n: int, bias: Optional[Tensor], path: Optional[int] = None,
           tile: Optional[int] = None, shape: Optional[Tuple[int, int]] = None) -> Tensor:
    """``x`` ``[M, K]`` float32 times a bfloat16 weight blocked (``kernels.blocked.blocked``: ``packed``
    ``[ceil(n/16), K, 16]``) -> ``[M, n]`` float32 (+ ``bias`` ``[n]`` float32), by ``path`` (None:
    ``chosen`` for its model's gate/up ``shape``; None: the first model's) and its variant ``tile`` (None:
    ``prompt_tile``), on torch's thread count."""
    from kernels.skinny import library

    loaded = library()
    path = chosen(loaded, shape) if path is None else path
    if path not in paths(loaded) or packed.dtype != torch.bfloat16 or x.dtype != torch.float32 or x.shape[-1] != packed.shape[1]:
        raise ValueError(f"bfloat16 linear: path {path}, weight {packed.dtype}, rows {x.dtype} {tuple(x.shape)}")
    x, packed = x.contiguous(), packed.contiguous()
    bias = None if bias is None else bias.to(torch.float32).contiguous()
    out = torch.empty((x.shape[0], n), dtype=torch.float32)
    tile = prompt_tile(loaded, path, x.shape[0], shape) if tile is None else tile
    loaded.skinny_linear_bf16(path, tile, x.data_ptr(), packed.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
                              x.shape[0], n, x.shape[1], torch.get_num_threads())
    return out


def layer_rows(x: Tensor, packed: Tensor, n: int, bias: Optional[Tensor], shape: Optional[Tuple[int, int]] = None) -> Tensor:
    """A bfloat16 layer on the skinny route (``kernels.prepacking.PrepackedLinear``): ``x`` ``[..., K]``
    bfloat16 CPU times its weight blocked in bfloat16 (``packed``) -> ``[..., n]`` bfloat16: the rows
    widened to float32 (exactly), ``linear``'s float32 sums (+ ``bias``) on the path of its model's ``shape``
    (so a layer route and the model's C step take one path), rounded to bfloat16 once, each row alone. Rows of another dtype or device raise, in one line, as ``F.linear``'s mismatch would."""
    if x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.shape[-1] != packed.shape[1]:
        raise RuntimeError(f"a bfloat16 layer takes bfloat16 CPU rows of {packed.shape[1]} features, got {x.dtype} {x.device} {tuple(x.shape)}")
    rows = x.reshape(-1, x.shape[-1]).float()
    return linear(rows, packed, n, bias, shape=shape).to(torch.bfloat16).reshape(*x.shape[:-1], n)
