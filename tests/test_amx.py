"""The AMX path of the bfloat16 C step (kernels/skinny_amx.c): where it runs (AMX-BF16 built, on the CPU,
granted by Linux; skipped with the reason elsewhere), a position's logits are the same bits in passes of
1, 5, 13, 64 and 200 positions, greedy drafting rows emit bfloat16 target AR's tokens on it, and its sums
stay within bfloat16's rounding of the exact ones; a build without it offers no such path and never
runs a tile instruction. (tests/test_c_step_bf16.py runs its tree, thread-count and variant checks.)"""
import ctypes

import pytest
import torch

import kernels.bf16 as bf16
from c_builds import load_for
from kernels import skinny
from kernels.blocked import pack
from runners import LeanRunner
from test_c_step_bf16 import bfloat16, built, drafting_rows_are_target_ar
from test_lean_runner import ids_for

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]


@pytest.fixture
def amx(monkeypatch):
    """The AMX path forced; skipped, with why, where this process has none."""
    library = skinny.library()
    if bf16.AMX not in bf16.paths(library):
        pytest.skip(f"no AMX path here: {bf16.amx_absent(library)}")
    monkeypatch.setattr(bf16, "FORCED", bf16.AMX)
    return bf16.AMX


def test_a_positions_logits_are_the_same_at_widths_1_5_13_16_64_and_200(amx):
    """200 positions after a 10-position prompt, fed in passes of 1, 5, 13, 16, 64 and 200 (decoding's loop,
    the many-row variant from 13, partial row tiles): every position's logits the same bits at every width."""
    model, ids = bfloat16("llama"), ids_for(210)
    runs = {}
    for width in (1, 5, 13, 16, 64, 200):
        runner = LeanRunner(model)
        runner(ids[:, :10], 1)
        got = [runner(ids[:, : min(a + width, 210)], min(width, 210 - a)) for a in range(10, 210, width)]
        assert runner.step_passes == runner.forward_passes and runner.step.dims.weights == bf16.AMX
        runs[width] = torch.cat(got)
    for width, logits in runs.items():
        assert logits.shape == (200, logits.shape[1]) and torch.equal(logits, runs[1]), width


def test_greedy_drafting_rows_emit_bfloat16_target_ar_tokens_on_amx(amx):
    """Speculative decoding, NASD, prompt lookup and an n-gram tree, every pass on the AMX path: target AR's tokens."""
    drafting_rows_are_target_ar("llama", amx)


def test_sums_are_the_exact_ones_within_float32_rounding_of_the_rounded_activations(amx):
    """K of 600 (a partial last chunk of 32), 40 outputs (a padded block), a bias: against the exact sums
    of x rounded to bfloat16 times the weights (float64), within float32 accumulation's error; against
    float32 x, within bfloat16's rounding of x (2^-8 of the sum of |x w|)."""
    g = torch.Generator().manual_seed(11)
    w, x, b = torch.randn(40, 600, generator=g).bfloat16(), torch.randn(37, 600, generator=g), torch.randn(40, generator=g)
    got = bf16.linear(x, pack(w), 40, b, amx).double()
    magnitude = x.abs().double() @ w.abs().double().t()
    exact_rounded = x.bfloat16().double() @ w.double().t() + b.double()
    assert ((got - exact_rounded).abs() <= 600 * 2.0 ** -24 * magnitude + 1e-6).all()
    exact = x.double() @ w.double().t() + b.double()
    assert ((got - exact).abs() <= 2.0 ** -8 * magnitude).all()


def test_prefetches_change_no_bit_of_either_variant(amx):
    """This CPU's build without prefetches (-DBF16_AHEAD_BYTES=0: speed only, bf16_tiles.h) gives the bits
    of the one with them, on both AMX variants, over 1..16 rows (verification's widths) and 40 (two row
    tiles of variant 1), K of 600 (a partial last chunk), 216 outputs (a padded block), 1 and 2 threads."""
    bare = load_for("native", [s for s in skinny.SOURCES if s.name.startswith("skinny")], ("BF16_AHEAD_BYTES=0",))
    g = torch.Generator().manual_seed(13)
    w, x, b = torch.randn(216, 600, generator=g).bfloat16(), torch.randn(40, 600, generator=g), torch.randn(216, generator=g)
    packed = pack(w)
    for tile in (0, 1):
        for threads in (1, 2):
            for m in (*range(1, 17), 40):
                got, want = torch.empty(m, 216), torch.empty(m, 216)
                for library, y in ((bare, got), (skinny.library(), want)):
                    library.skinny_linear_bf16(ctypes.c_int64(amx), ctypes.c_int64(tile), ctypes.c_void_p(x.data_ptr()),
                                               ctypes.c_void_p(packed.data_ptr()), ctypes.c_void_p(b.data_ptr()),
                                               ctypes.c_void_p(y.data_ptr()), *map(ctypes.c_int64, (m, 216, 600, threads)))
                assert torch.equal(got, want), (tile, threads, m)


def test_a_build_without_amx_offers_no_amx_path_and_runs_no_tile(tmp_path):
    """Built for AVX2 (haswell): no AMX path, the reason named (not built, or no AMX on this CPU); a linear
    asked of it anyway gives NaN, not an illegal instruction."""
    library = built(tmp_path, "haswell")
    library.amx_state.restype = ctypes.c_int
    assert bf16.AMX not in bf16.paths(library)
    assert bf16.amx_absent(library) in (bf16.AMX_ABSENT[1], bf16.AMX_ABSENT[2])
    x, y = torch.ones(3, 64), torch.zeros(3, 16)
    weight = pack(torch.ones(16, 64, dtype=torch.bfloat16))
    library.skinny_linear_bf16(bf16.AMX, 0, x.data_ptr(), weight.data_ptr(), None, y.data_ptr(), 3, 16, 64, 2)
    assert torch.isnan(y).all()


def test_the_header_names_the_amx_path(amx):
    """A bfloat16 model's header names the AMX tiles and the activations' rounding; forced, as asked."""
    from kernels.c_step import label, short_label

    model = bfloat16()
    assert short_label(model) == "C step, AMX tiles, forced"
    assert label(model).startswith("C step (bfloat16 weights read by the AMX tiles, activations rounded to bfloat16 for it, ")
