"""The many-row GEMM's variants (``kernels/skinny_tiles.c``, ``kernels.prompt_gemm``): every variant
gives every output the bits of the one-row path (the row-invariance contract: the same FMA chain over
k = 0..K-1 whatever the tile, the k-panels, the rows, the threads or the instruction set), so a
prompt's logits do not depend on the plan its pass runs; and the plan is the model's until changed."""
import ctypes

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from conftest import VOCAB
from kernels import prompt_gemm, skinny
from kernels.blocked import pack
from kernels.prompt_gemm import PromptPlan, plan_of, set_plan, tiles
from runners import LeanRunner

pytestmark = [pytest.mark.needs_cc, pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]

# (N, K): a padded last block, K past several k-panels and not a multiple of one, the embedded model's q/k/v and down
SHAPES = [(48, 64), (200, 576), (40, 300), (7, 13), (960, 576), (576, 1536)]
WIDTHS = [13, 24, 37, 100]


def one_row_at_a_time(x: torch.Tensor, packed: torch.Tensor, n: int, bias) -> torch.Tensor:
    """Each row alone through decoding's path (variant 0, one row, one thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return torch.cat([prompt_gemm.linear(x[i : i + 1], packed, n, bias, prompt_gemm.REFERENCE) for i in range(x.shape[0])])
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("n,k", SHAPES)
def test_every_variant_gives_each_row_the_bits_of_the_one_row_path(n, k):
    """Every variant this build has, over 13-100 rows (a tile's rows and a remainder), with and without
    a bias, on 1 and 2 threads (another share of the blocks): each row bit for bit the one-row path's."""
    g = torch.Generator().manual_seed(n * 1000 + k)
    w, x, b = torch.randn(n, k, generator=g), torch.randn(max(WIDTHS), k, generator=g), torch.randn(n, generator=g)
    packed = pack(w)
    before = torch.get_num_threads()
    try:
        for bias in (b, None):
            expected = one_row_at_a_time(x, packed, n, bias)
            torch.testing.assert_close(expected, torch.nn.functional.linear(x, w, bias), rtol=1e-5, atol=5e-4)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                for tile in tiles(skinny.library()):
                    for m in WIDTHS:
                        got = prompt_gemm.linear(x[:m], packed, n, bias, tile.index)
                        assert torch.equal(got, expected[:m]), (tile, m, threads, bias is None)
    finally:
        torch.set_num_threads(before)


def test_this_build_lists_decodings_loop_first_and_other_tiles_after():
    found = tiles(skinny.library())
    assert found[0].index == prompt_gemm.REFERENCE and "decoding's" in found[0].name()
    assert len(found) >= 3 and [t.index for t in found] == list(range(len(found)))
    assert all(t.rows >= 1 and t.blocks >= 1 and t.kc >= 0 for t in found)
    assert len({(t.rows, t.blocks, t.kc) for t in found[1:]}) == len(found) - 1  # no variant twice
    assert found[0].short() == found[0].name() and all("," not in t.short() for t in found)


def built(tmp_path, arch: str) -> ctypes.CDLL:
    """The float32 kernels (with their variants) built for ``arch``, once per run (``c_builds``); skipped
    off x86-64 with AVX2."""
    from c_builds import load_for

    library = load_for(arch, [s for s in skinny.SOURCES if s.name in ("skinny_gemm.c", "skinny_tiles.c")])
    library.skinny_tile_shape.argtypes = [ctypes.c_int64, ctypes.c_void_p]
    library.skinny_linear_tile.argtypes = [ctypes.c_int64] + [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4
    return library


def test_the_avx2_and_plain_builds_variants_round_as_this_builds_one_row_path(tmp_path):
    """Built for AVX2 (haswell: 16 registers, its own tiles) and for plain x86-64: every variant of each
    gives this machine's one-row bits, over 37 rows, a padded block and K past the k-panels."""
    g = torch.Generator().manual_seed(5)
    n, k, m = 200, 576, 37
    w, x, b = torch.randn(n, k, generator=g), torch.randn(m, k, generator=g), torch.randn(n, generator=g)
    packed = pack(w)
    expected = one_row_at_a_time(x, packed, n, b)
    for arch in ("haswell", "x86-64"):
        library = built(tmp_path, arch)
        variants = tiles(library)
        assert len(variants) >= 3, arch
        for tile in variants:
            y = torch.empty(m, n)
            library.skinny_linear_tile(tile.index, x.data_ptr(), packed.data_ptr(), b.data_ptr(), y.data_ptr(), m, n, k, 2)
            assert torch.equal(y, expected), (arch, tile)


def wide_model() -> LlamaForCausalLM:
    """A float32 Llama whose linears pass several k-panels (hidden 288, intermediate 320), with biases on
    attention, and a vocabulary that is no multiple of 16."""
    torch.manual_seed(11)
    config = LlamaConfig(vocab_size=VOCAB if VOCAB % 16 else VOCAB + 3, hidden_size=288, intermediate_size=320, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attention_bias=True)
    return LlamaForCausalLM(config).to(torch.float32).eval()


def test_a_prompts_logits_are_the_same_on_every_plan():
    """A prompt of 70 positions on every variant, in one chunk and in chunks of 16 (the last 6 on
    decoding's loop): every position's logits bit for bit those of the default plan and of one-position
    passes; the pass ran on the step."""
    model = wide_model()
    ids = torch.randint(model.config.vocab_size, (1, 70), generator=torch.Generator().manual_seed(2))
    alone = LeanRunner(model)
    expected = torch.cat([alone(ids[:, : i + 1], 1) for i in range(70)])
    assert torch.equal(LeanRunner(model)(ids, 70), expected)
    for tile in tiles(skinny.library()):
        for chunk in (None, 16):
            set_plan(model, PromptPlan(tile.index, chunk))
            runner = LeanRunner(model)
            assert torch.equal(runner(ids, 70), expected), (tile, chunk)
            assert runner.step_passes == 1


def test_a_pass_asking_its_last_logits_gives_their_bits_and_every_positions_keys_and_values():
    """A pass asking the logits of its last 1, 3 or 20 positions (the last layer computes the others' keys
    and values only), in one chunk and in chunks of 16 (the asked rows across a chunk's edge): those
    positions' logits bit for bit the one-position passes' (and so the whole pass's last rows), and the
    next position's logits after it the same too (the last layer's keys and values were written for every
    position: a skipped one would change what the next position attends to)."""
    model = wide_model()
    ids = torch.randint(model.config.vocab_size, (1, 71), generator=torch.Generator().manual_seed(5))
    alone = LeanRunner(model)
    expected = torch.cat([alone(ids[:, : i + 1], 1) for i in range(71)])
    for tile in (prompt_gemm.REFERENCE, tiles(skinny.library())[-1].index):
        for chunk in (None, 16):
            set_plan(model, PromptPlan(tile, chunk))
            for n_last in (1, 3, 20):
                runner = LeanRunner(model)
                assert torch.equal(runner(ids[:, :70], n_last), expected[70 - n_last : 70]), (tile, chunk, n_last)
                assert torch.equal(runner(ids, 1), expected[70:]), (tile, chunk, n_last)
                assert runner.step_passes == 2


def test_a_long_pass_is_cut_into_as_few_chunks_of_near_equal_length_never_a_short_tail():
    """``c_step.chunk_bounds``: ceil(r / chunk) contiguous calls covering every position once, each at most
    ``chunk`` long and, but the last, a multiple of every tile's rows where that fits; no tail of a few
    rows reading every weight again (769 positions: 216 x 3 + 121, not 256 x 3 + 1)."""
    from kernels.c_step import ROWS_MULTIPLE, chunk_bounds

    assert chunk_bounds(769, 256) == [(0, 216), (216, 432), (432, 648), (648, 769)]
    assert chunk_bounds(210, 256) == [(0, 210)] and chunk_bounds(5, 128) == [(0, 5)]
    for chunk in (16, 24, 48, 128, 256, 512):
        for r in range(1, 1100, 7):
            bounds = chunk_bounds(r, chunk)
            assert bounds[0][0] == 0 and bounds[-1][1] == r and all(b[1] == c[0] for b, c in zip(bounds, bounds[1:]))
            assert len(bounds) == -(-r // chunk) and all(0 < b - a <= chunk for a, b in bounds)
            assert all((b - a) % ROWS_MULTIPLE == 0 or b - a == chunk for a, b in bounds[:-1]), (r, chunk)


def test_a_plan_is_the_models_until_changed_and_refuses_what_it_cannot_run():
    model = wide_model()
    assert plan_of(model) == prompt_gemm.DEFAULT and plan_of(None) == prompt_gemm.DEFAULT
    set_plan(model, PromptPlan(2, 128))
    assert plan_of(model) == PromptPlan(2, 128)
    for wrong in (PromptPlan(-1), PromptPlan(0, prompt_gemm.MANY_ROWS)):
        with pytest.raises(ValueError):
            set_plan(model, wrong)
    assert plan_of(model) == PromptPlan(2, 128)
    words = prompt_gemm.describe(PromptPlan(0, None), skinny.library())
    assert words.startswith("prompt GEMM: tile ") and "decoding's" in words and "chunks of 256 positions" in words
