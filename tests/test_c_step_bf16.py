"""The C step on bfloat16 weights (kernels/skinny_bf16.c, kernels/skinny_amx.c, kernels/bf16.py): each path
this build has (the AMX tiles, the avx512_bf16 dot, the AVX-512, AVX2 and plain-C widening loads, forced
one at a time on this CPU)
gives a position's logits whatever the pass width or tree, so greedy drafting rows emit bfloat16
target AR's tokens (Llama, and the kin with the most features: Gemma 3 and OLMo 2, ``families.py``);
the widening paths are the float32 step on the widened weights bit for bit; the dot path computes the
sums it documents; all stay close to transformers' forward (tests/test_amx.py: the AMX path's own)."""
import copy
import ctypes

import pytest
import torch

from conftest import EOS_NEVER, PROMPT, VOCAB, llama
from invariance import widths_agree
from drafters import DraftContext, NGramTreeSpec, PromptLookupSpec
from families import FAMILY_MODELS
import kernels.bf16 as bf16
from kernels import bf16_choice, skinny
from kernels.blocked import fusable, pack
from kernels.c_step import CStep, label, short_label, step_unsupported
from kernels.step_one import OnePass
from kernels.prompt_gemm import MANY_ROWS
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
from runners import EAGER, LeanRunner
import runners.lean_lane as lean_lane
from sampling import autoregressive_generate, generate, speculative_generate
from test_kv_bf16 import on_cache
from test_lean_runner import MODELS, ids_for
from utils.models import truncated_drafter

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]

PATHS = (bf16.AMX, bf16.DOT, bf16.AVX512, bf16.AVX2, bf16.SCALAR)
WIDENING = PATHS[2:]


@pytest.fixture(params=PATHS, ids=lambda p: bf16.NAMES[p])
def path(request, monkeypatch):
    """Each bfloat16 path, forced (skipped where this build lacks it: no AMX, no avx512_bf16, no AVX-512)."""
    if request.param not in bf16.paths(skinny.library()):
        why = bf16.amx_absent(skinny.library()) if request.param == bf16.AMX else ""
        pytest.skip(f"this build has no {bf16.NAMES[request.param]}" + (f": {why}" if why else ""))
    monkeypatch.setattr(bf16, "FORCED", request.param)
    return request.param


FAMILIES = ["gemma3", "olmo2"]  # (1 + w) norms before and after, GELU-tanh, per-head q/k norms, a softcap, sliding layers; q/k norms over all heads


def bfloat16(name: str = "llama"):
    return {**MODELS, **FAMILY_MODELS}[name]().to(torch.bfloat16)


@pytest.mark.parametrize("name", ["llama", *FAMILIES])
def test_a_positions_logits_do_not_depend_on_the_pass_width_or_the_tree(path, name):
    """Positions 20..31 (past the families' window of 8) one at a time, in passes of 2..12, and in a
    branching draft tree (each node's logits those of its branch fed one position at a time): the
    same logits bit for bit."""
    model, ids = bfloat16(name), ids_for()
    runner = LeanRunner(model)
    alone = widths_agree(runner, ids)
    assert runner.step_passes == runner.forward_passes and runner.step.dims.weights == path
    nodes, parents = [5, 7, 9, 11, 13, 15], [-1, 0, 0, 1, 2, 4]
    runner.rollback(20)
    tree = runner.tree_pass(ids[:, :21], 21, nodes, parents)  # fed: position 20, then the six nodes
    assert runner.step_passes == runner.forward_passes
    assert torch.equal(tree[0], alone[0])
    for i in range(len(nodes)):
        branch = [i]
        while parents[branch[-1]] >= 0:
            branch.append(parents[branch[-1]])
        fed = torch.cat([ids[0, :21], torch.tensor([nodes[j] for j in reversed(branch)])])[None]
        runner.rollback(21)
        chain = torch.cat([runner(fed[:, : 22 + k], 1) for k in range(len(branch))])
        assert torch.equal(tree[1 + i], chain[-1]), i


def test_a_prompt_at_once_on_any_thread_count_is_the_prompt_position_by_position(path):
    """40 positions in one pass (four register blocks of rows) on 1, 2 and 3 threads, and one at a
    time: the same logits bit for bit."""
    model, ids = bfloat16("qwen2"), ids_for(40)
    alone = LeanRunner(model)
    expected = torch.cat([alone(ids[:, : i + 1], 1) for i in range(40)])
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            assert torch.equal(LeanRunner(model)(ids, 40), expected), threads
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("name", ["llama", "qwen2", "tied", *FAMILIES])
def test_the_widening_paths_are_the_float32_step_on_the_widened_weights(name, monkeypatch):
    """Prompt and decoding passes (Qwen2's biases, tied embeddings): the AVX-512, AVX2 and plain-C
    widening loads give the float32 step's logits on the same weights widened to float32, bit for bit (both
    over a bfloat16 cache, the bfloat16 model's own)."""
    model, ids = bfloat16(name), ids_for()
    wide = copy.deepcopy(model).float()
    expected = torch.cat([on_cache(LeanRunner(wide), torch.bfloat16)(ids[:, :18], 18), on_cache(LeanRunner(wide), torch.bfloat16)(ids[:, :19], 1)])
    for path in set(WIDENING) & set(bf16.paths(skinny.library())):
        monkeypatch.setattr(bf16, "FORCED", path)
        runner = LeanRunner(model)
        got = torch.cat([runner(ids[:, :18], 18), runner(ids[:, :19], 1)])
        assert runner.step_passes == 2 and runner.cache.layers[0].keys.dtype == torch.bfloat16
        assert torch.equal(got, expected), bf16.NAMES[path]


def dot_sums(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """What skinny_bf16.c documents for its dot path: x rounded to bfloat16, per pair of k the odd
    product added first, then the even one, each sum rounded to float32 (in float64, exact products,
    then one rounding: the same as float32's own for a sum of two floats), then + b."""
    xb, wd = x.bfloat16().double(), w.double()
    acc = torch.zeros(x.shape[0], w.shape[0])
    for q in range(w.shape[1] // 2):
        for k in (2 * q + 1, 2 * q):
            acc = (acc.double() + xb[:, k, None] * wd[None, :, k]).float()
    return acc + b


def _vendor() -> str:
    """The CPU's vendor line (/proc/cpuinfo's vendor_id), "" where it says none."""
    try:
        return next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("vendor_id")), "")
    except OSError:
        return ""


def test_the_dot_path_computes_the_sums_it_documents():
    """K of 200 (a partial chunk of 64), 40 outputs (a padded block), 1..13 rows: vdpbf16ps's sums as
    documented, bit for bit, and each row alone the same."""
    if bf16.DOT not in bf16.paths(skinny.library()):
        pytest.skip("this build has no avx512_bf16 dot")
    g = torch.Generator().manual_seed(5)
    w, x, b = torch.randn(40, 200, generator=g).bfloat16(), torch.randn(13, 200, generator=g), torch.randn(40, generator=g)
    got = bf16.linear(x, pack(w), 40, b, bf16.DOT)
    if _vendor() == "GenuineIntel":  # the documented sums are Intel's; other vendors' vdpbf16ps may round apart
        assert torch.equal(got, dot_sums(x, w, b))
    else:
        torch.testing.assert_close(got, dot_sums(x, w, b), rtol=1e-5, atol=1e-5)
    for m in range(1, 13):
        assert torch.equal(bf16.linear(x[:m], pack(w), 40, b, bf16.DOT), got[:m]), m


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_variant_gives_a_row_the_bits_it_gets_alone(path, threads):
    """K of 600 (two k-panels of 256 and a part; decoding's tiles round the dot path's rows in chunks of 128), 216 outputs (13
    whole blocks, shared 13 ways over the threads into full and partial tiles, and a padded one), a bias:
    every variant of the path (decoding's and the many-row tiles) over 1..16 rows (verification's widths:
    the AMX path's partial row tiles up to its 16, the others' 12 and a second row block) and over 100 (row
    blocks and a remainder) gives each row the bits it gets alone on decoding's loop; the widening paths
    give the plain-C path's bits. (The AMX path's variants take the whole of k: chunks of 32, a partial last; the
    dot path's too, on its rows rounded once a call: tests/test_bf16_dot.py.)"""
    g = torch.Generator().manual_seed(7)
    w, x, b = torch.randn(216, 600, generator=g).bfloat16(), torch.randn(100, 600, generator=g), torch.randn(216, generator=g)
    packed, variants = pack(w), bf16.tiles(skinny.library(), path)
    panels = {bf16.AMX: 0, bf16.DOT: 0}.get(path, 256)  # the AMX and dot paths' variants take the whole of k
    assert len(variants) >= 2 and variants[0][2] == 0 and all(kc == panels for _, _, kc in variants[1:])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        alone = torch.cat([bf16.linear(x[i: i + 1], packed, 216, b, path, 0) for i in range(100)])
        if path not in bf16.ROUNDING:
            assert torch.equal(alone, torch.cat([bf16.linear(x[i: i + 1], packed, 216, b, bf16.SCALAR, 0) for i in range(100)]))
        for tile in range(len(variants)):
            for m in (*range(1, 17), 100):
                assert torch.equal(bf16.linear(x[:m], packed, 216, b, path, tile), alone[:m]), (variants[tile], m)
    finally:
        torch.set_num_threads(before)


def test_one_position_on_any_share_of_the_blocks_gets_a_rows_bits(path):
    """Decoding's loop at one position deals the blocks evenly over the threads (groups of 4 from each thread's
    first block, its last group shorter; skinny_bf16_rows.c): 34 outputs and 216 (3 and 14 blocks, a padded
    one), 1-5 threads (shares of 0-14 blocks, groups of 1-4), a bias: each row the bits it gets in a pass of
    13 rows on one thread (the register block's tiles, never the one-position one)."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(13, 600, generator=g)
    before = torch.get_num_threads()
    try:
        for n in (34, 216):
            w, b = torch.randn(n, 600, generator=g).bfloat16(), torch.randn(n, generator=g)
            torch.set_num_threads(1)
            rows = bf16.linear(x, pack(w), n, b, path, 0)
            for threads in range(1, 6):
                torch.set_num_threads(threads)
                for i in (0, 5, 12):
                    assert torch.equal(bf16.linear(x[i: i + 1], pack(w), n, b, path, 0), rows[i: i + 1]), (n, threads, i)
    finally:
        torch.set_num_threads(before)


def test_a_long_pass_takes_the_paths_many_row_variant(path, monkeypatch):
    """The C step's chunks over 12 positions (over 16 on the AMX path: its decoding tile's rows,
    ``bf16.decoding_rows``) run the path's many-row variant (the one measured fastest here,
    ``bf16.prompt_tile``), up to them decoding's loop: the variant a prompt runs is one the test above
    holds to the same bits."""
    seen, shapes = [], set()
    real = CStep._run

    def recording(self, *args):
        seen.append((args[0][0].shape[0], self.dims.tile))
        shapes.add(self.shape)
        return real(self, *args)

    monkeypatch.setattr(CStep, "_run", recording)
    monkeypatch.setattr(lean_lane, "ON", False)  # the 10 positions through ``CStep.__call__`` too, not the decided lane
    model, ids = bfloat16("llama"), ids_for(56)
    runner = LeanRunner(model)
    runner(ids[:, :30], 1)
    runner(ids[:, :40], 10)
    runner(ids[:, :56], 16)
    (shape,) = shapes  # the model's own path and variant: another test's model in this process may differ
    many = bf16.prompt_tile(skinny.library(), path, MANY_ROWS + 1, shape)
    wide = 0 if path == bf16.AMX else many  # 16 positions: one AMX row tile, two of the others' 12
    assert bf16.decoding_rows(skinny.library(), path) == (16 if path == bf16.AMX else MANY_ROWS)
    assert seen == [(30, many), (10, 0), (16, wide)] and 1 <= many < len(bf16.tiles(skinny.library(), path))


def built(tmp_path, arch: str) -> ctypes.CDLL:
    """The two kernels (float32 and bfloat16) built for ``arch``, once per run (``c_builds``); skipped off
    x86-64 with AVX2."""
    from c_builds import load_for

    library = load_for(arch, [s for s in skinny.SOURCES if s.name.startswith("skinny")])
    library.skinny_linear_bf16.argtypes = [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4
    return library


def test_builds_without_avx512_have_only_the_widening_paths_and_round_alike(tmp_path, monkeypatch):
    """Built for AVX2 (haswell) and for plain x86-64, as on CPUs without AVX-512: only their widening
    paths, each library's own measured fastest chosen (given seconds: the plain-C one), and the same
    outputs as this build's bit for bit."""
    g = torch.Generator().manual_seed(6)
    w, x, b = torch.randn(72, 96, generator=g).bfloat16(), torch.randn(9, 96, generator=g), torch.randn(72, generator=g)
    packed = pack(w)
    expected = bf16.linear(x, packed, 72, b, bf16.SCALAR)
    for arch, have in (("haswell", [bf16.AVX2, bf16.SCALAR]), ("x86-64", [bf16.SCALAR])):
        library = built(tmp_path, arch)
        monkeypatch.setattr(bf16_choice, "linear_timer", lambda *_: lambda path, tile, rows: 1e-3 if path == bf16.SCALAR else 2e-3)
        assert bf16.paths(library) == have and bf16.chosen(library, (72, 96)) == bf16.SCALAR
        monkeypatch.setattr(skinny, "library", lambda: library)
        for path in have:
            assert torch.equal(bf16.linear(x, packed, 72, b, path), expected), (arch, path)
        monkeypatch.undo()


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral", *FAMILIES])
def test_logits_are_close_to_transformers_forward(name, path):
    """Against transformers' float32 forward on the widened weights: every path (its keys and values rounded to
    bfloat16 in the cache; the dot and AMX paths' activations too) within 1% of the logits' scale, no further than
    transformers' own bfloat16 forward is; all within 2% of that bfloat16 forward (the widening paths' bits: the
    float32 step's over the same cache, ``test_the_widening_paths_are_the_float32_step_on_the_widened_weights``)."""
    model, ids = bfloat16(name), ids_for()
    with torch.no_grad():  # before the step: its first pass makes the layers its own route's (``kernels.one_copy``)
        float32 = copy.deepcopy(model).float()(ids[:, :30]).logits[0]
        own = model(ids[:, :30]).logits[0].float()
    got = LeanRunner(model)(ids[:, :30], 30)
    scale = float32.abs().max()
    assert (got - float32).abs().max() <= min(0.01 * scale, (own - float32).abs().max())
    assert (got - own).abs().max() <= 0.02 * scale


@pytest.mark.parametrize("name", ["llama", *FAMILIES])
def test_greedy_drafting_rows_emit_bfloat16_target_ar_tokens(path, name):
    """Prompt lookup, NASD, a drafter model and an n-gram tree verify on the bfloat16 step what target AR
    decodes on it, past the families' sliding window, and drafts were accepted now and then."""
    drafting_rows_are_target_ar(name, path)


def drafting_rows_are_target_ar(name: str, path: int) -> None:
    """``test_greedy_drafting_rows_emit_bfloat16_target_ar_tokens``'s run: every pass of every row on ``path``."""
    target = llama(layers=3).to(torch.bfloat16) if name == "llama" else bfloat16(name)
    drafter = truncated_drafter(target, 1)
    calls = [0]
    real, one = CStep.__call__, OnePass.one  # a pass's whole call, and decoding's decided one (``runners.lean_lane``)

    def counting(self, *args, **kwargs):
        calls[0] += 1
        assert self.dims.weights == path
        return real(self, *args, **kwargs)

    def counting_one(self, *args):
        calls[0] += 1
        assert self.step.dims.weights == path
        return one(self, *args)

    CStep.__call__, OnePass.one = counting, counting_one
    try:
        reference = autoregressive_generate(PROMPT, target, 40, eos_tokens_id=EOS_NEVER, use_cache=True)
        decoded = calls[0]
        out, rate = speculative_generate(PROMPT, drafter, target, gamma=4, max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=True)
        nasd, _ = ngram_assisted_speculative_generate(PROMPT, NGramStorage(2, VOCAB), target, gamma=4, max_gen_len=40,
                                                      eos_tokens_id=EOS_NEVER, use_cache=True)
        common = dict(max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=True)
        pld, pld_rate = generate(PROMPT, target, PromptLookupSpec(), common)
        tree, tree_rate = generate(PROMPT, target, NGramTreeSpec(tree_size=4), common, DraftContext(storage=NGramStorage(2, VOCAB)))
    finally:
        CStep.__call__, OnePass.one = real, one
    assert decoded >= 39 and calls[0] > decoded  # every row ran on the step
    assert out == reference and nasd == reference and pld == reference and tree == reference
    assert max(rate, pld_rate, tree_rate) > 0.0


def test_the_header_names_the_path_that_ran(path):
    model = bfloat16()
    assert short_label(model) == f"C step, {bf16.NAMES[path]}, forced"
    assert label(model).startswith(f"C step (bfloat16 weights read by the {bf16.NAMES[path]}, ")
    assert "sums, forced; prompt tile " in label(model)
    described = EAGER.describe(model)
    assert f"on the C step (bfloat16 weights read by the {bf16.NAMES[path]}" in described, described
    assert ("activations rounded to bfloat16" in described) == (path in bf16.ROUNDING)
    assert short_label(model.float()) == "C step" and "bfloat16" not in label(model)


def test_what_the_bfloat16_step_refuses_and_a_hooked_pass_after_it():
    """Mixed dtypes and odd input sizes are refused; a hook on a model the step ran gives transformers'
    forward the cache as it is (bfloat16, the step's too), and once the hook is gone the step runs again."""
    mixed = bfloat16()
    mixed.lm_head.float()
    assert step_unsupported(mixed) == "the step runs float32 or bfloat16 weights on CPU"
    assert not fusable([torch.zeros(16, 7, dtype=torch.bfloat16)]) and fusable([torch.zeros(16, 8, dtype=torch.bfloat16)])
    model, ids = bfloat16(), ids_for()
    runner, reference = LeanRunner(model), LeanRunner(copy.deepcopy(model))
    runner(ids[:, :10], 1)
    keys = runner.cache.layers[0].keys
    hook = model.model.layers[0].mlp.up_proj.register_forward_hook(lambda *a: None)
    got = runner(ids[:, :12], 2)
    assert runner.hooked_passes == 1 and runner.cache.layers[0].keys is keys and keys.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), reference(ids[:, :12], 2), rtol=0, atol=0.02 * got.abs().max().item())
    hook.remove()
    passes = runner.step_passes
    runner(ids[:, :13], 1)
    assert runner.step_passes == passes + 1
