"""The avx512_bf16 dot path's many-row loop (kernels/skinny_bf16_dot.c: a chunk's rows rounded to bfloat16
once a call, whole-k register tiles of 12x2, 8x3 and 6x4): every variant gives each row the bits
decoding's tiles give it alone, whatever the rows, the outputs or the threads, and so does the loop
that never rounds ahead (built with -DBF16_DOT_ROUNDED_BYTES=0: what runs where the memory is refused); and
passes of a few positions (kernels/bf16_few.h, and the AVX-512 widening path's wider groups) give the bits of
decoding's register block. Skipped where this build has no dot path. (tests/test_c_step_bf16.py runs every path's variants on the
C step and a position's logits at every width.)"""
import ctypes

import pytest
import torch

import kernels.bf16 as bf16
from c_builds import load_for
from kernels import skinny
from kernels.blocked import pack

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]


@pytest.fixture(scope="module")
def dot():
    """The dot path's id; skipped where this build lacks it."""
    if bf16.DOT not in bf16.paths(skinny.library()):
        pytest.skip("this build has no avx512_bf16 dot")
    return bf16.DOT


def run(library: ctypes.CDLL, tile: int, x: torch.Tensor, packed: torch.Tensor, n: int, b: torch.Tensor, threads: int) -> torch.Tensor:
    """``skinny_linear_bf16`` on the dot path by variant ``tile``: ``x`` ``[m, K]`` -> ``[m, n]``."""
    y = torch.empty(x.shape[0], n)
    library.skinny_linear_bf16(ctypes.c_int64(bf16.DOT), ctypes.c_int64(tile), ctypes.c_void_p(x.data_ptr()),
                               ctypes.c_void_p(packed.data_ptr()), ctypes.c_void_p(b.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                               *map(ctypes.c_int64, (x.shape[0], n, x.shape[1], threads)))
    return y


@pytest.mark.parametrize("n, k", [(408, 96), (216, 600)])
def test_every_many_row_variant_gives_a_row_decodings_bits(dot, n, k):
    """408 outputs (25 whole blocks and a padded one) over K of 96, and 216 (13 and a padded one) over 600:
    each many-row variant over 1..16, 61 and 216 rows (a chunk of a 769-position prompt; full row tiles,
    a partial last one, each thread's partial last group) on 1, 2 and 3 threads gives each row the bits
    decoding's loop gives it alone."""
    g = torch.Generator().manual_seed(11)
    w, x, b = torch.randn(n, k, generator=g).bfloat16(), torch.randn(216, k, generator=g), torch.randn(n, generator=g)
    packed, library = pack(w), skinny.library()
    alone = torch.cat([run(library, 0, x[i: i + 1], packed, n, b, 1) for i in range(216)])
    variants = bf16.tiles(library, dot)
    assert [shape for shape in variants[1:]] == [(12, 2, 0), (8, 3, 0), (6, 4, 0)]
    for tile in range(1, len(variants)):
        for threads in (1, 2, 3):
            for m in (*range(1, 17), 61, 216):
                assert torch.equal(run(library, tile, x[:m].contiguous(), packed, n, b, threads), alone[:m]), (variants[tile], threads, m)


def test_the_loop_without_rounded_rows_gives_the_same_bits(dot):
    """Built with -DBF16_DOT_ROUNDED_BYTES=0 (every call on decoding's tiles, over the same share of
    blocks a thread takes): the bits of this build's loop, for every variant, over 1..13 and 100 rows,
    216 outputs (a padded block) and K of 600, on 1, 2 and 3 threads."""
    bare = load_for("native", [s for s in skinny.SOURCES if s.name.startswith("skinny")], ("BF16_DOT_ROUNDED_BYTES=0",))
    g = torch.Generator().manual_seed(12)
    w, x, b = torch.randn(216, 600, generator=g).bfloat16(), torch.randn(100, 600, generator=g), torch.randn(216, generator=g)
    packed = pack(w)
    for tile in range(1, len(bf16.tiles(skinny.library(), dot))):
        for threads in (1, 2, 3):
            for m in (*range(1, 14), 100):
                rows = x[:m].contiguous()
                assert torch.equal(run(bare, tile, rows, packed, 216, b, threads),
                                   run(skinny.library(), tile, rows, packed, 216, b, threads)), (tile, threads, m)


@pytest.mark.parametrize("path", [bf16.DOT, bf16.AVX512])
def test_a_few_positions_take_wider_tiles_and_keep_the_register_blocks_bits(path):
    """Passes of 2..12 positions (kernels/bf16_few.h on the dot path, bf16_few_wide on the AVX-512 widening one:
    4, 3 or 2 blocks a group by width, an even share of the blocks, an L2 prefetch from 4 rows): each row the
    bits of a build with -DBF16_FEW=0 (decoding's 12 x 2 register block), over 216 outputs (13 whole blocks,
    each thread's shorter last group, a padded one) and K of 600 (a partial panel), on 1, 2 and 3 threads, at
    every prefetch distance into L2 (none, a line, 4 and 12 KB: speed only)."""
    library = skinny.library()
    if path not in bf16.paths(library):
        pytest.skip(f"this build has no {bf16.NAMES[path]}")
    old = load_for("native", [s for s in skinny.SOURCES if s.name.startswith("skinny")], ("BF16_FEW=0",))
    g = torch.Generator().manual_seed(13)
    w, x, b = torch.randn(216, 600, generator=g).bfloat16(), torch.randn(12, 600, generator=g), torch.randn(216, generator=g)
    packed, before = pack(w), library.skinny_set_few_ahead(-1)

    def linear(lib: ctypes.CDLL, rows: torch.Tensor, threads: int) -> torch.Tensor:
        y = torch.empty(rows.shape[0], 216)
        lib.skinny_linear_bf16(*map(ctypes.c_int64, (path, 0)), *(ctypes.c_void_p(t.data_ptr()) for t in (rows, packed, b, y)),
                               *map(ctypes.c_int64, (rows.shape[0], 216, 600, threads)))
        return y

    try:
        for ahead in (0, 64, 4096, 12288):
            assert library.skinny_set_few_ahead(ahead) == ahead
            for threads in (1, 2, 3):
                for m in range(2, 13):
                    rows = x[:m].contiguous()
                    assert torch.equal(linear(library, rows, threads), linear(old, rows, threads)), (ahead, threads, m)
    finally:
        library.skinny_set_few_ahead(before)


def test_rows_rounded_once_a_call_give_the_bits_of_rounding_per_group(dot):
    """One position on the dot path rounds its row once a call (kernels/bf16_few.h's one_dot), and so do 2..12
    positions where M K fits (FEW_ROUNDED_FEATURES), where a build with -DBF16_ONE_ROUNDED=0 -DBF16_FEW_ROUNDED=0
    rounds them per 128 features of every group: the same bits over K of 600 (a partial 32-feature line and
    128-feature panel), of 2100 (12 rows past FEW_ROUNDED_FEATURES, 11 within) and of 20482 (one row past
    ONE_ROUNDED_MOST: decoding's tiles in both), 216 outputs (13 whole blocks, shares ending in shorter groups, a
    padded one) and 34, a bias and none, on 1, 2 and 3 threads."""
    per_group = load_for("native", [s for s in skinny.SOURCES if s.name.startswith("skinny")],
                         ("BF16_ONE_ROUNDED=0", "BF16_FEW_ROUNDED=0"))
    g = torch.Generator().manual_seed(14)
    for k, widths in ((600, (1, 2, 3, 5, 8, 12)), (2100, (1, 11, 12)), (20482, (1,))):
        x = torch.randn(12, k, generator=g)
        for n in (216, 34):
            packed = pack(torch.randn(n, k, generator=g).bfloat16())
            for b in (torch.randn(n, generator=g), torch.zeros(n)):
                for threads in (1, 2, 3):
                    for m in widths:
                        rows = x[12 - m:].contiguous()
                        assert torch.equal(run(skinny.library(), 0, rows, packed, n, b, threads),
                                           run(per_group, 0, rows, packed, n, b, threads)), (k, n, threads, m)
