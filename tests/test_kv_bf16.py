"""A bfloat16 model's C step keeps its KV cache in bfloat16 (kernels/attention.h, c_step.c's ``Dims.kv``): keys
and values rounded once where a pass writes them, as torch's ``.to(torch.bfloat16)`` rounds, and widened where
attention reads them, so attention's chains take the rounded keys and values as their inputs, on every build
(AVX-512, AVX2, plain C); a position's logits do not depend on the pass's width, the kept key blocks or a
rollback or a regrown cache; greedy drafting rows emit bfloat16 target AR's tokens. A float32 model's cache stays float32."""
import ctypes

import numpy as np
import pytest
import torch

from conftest import EOS_NEVER, PROMPT, VOCAB, llama
import kernels.c_step as c_step
from kernels.c_step import CStep
from kernels.step_one import OnePass
import kernels.kept_keys as kept_keys
from kernels import skinny
from models.llama import new_cache
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
from drafters import PromptLookupSpec
from runners import LeanRunner
import runners.static as static
from sampling import autoregressive_generate, generate
from test_attention_kernel import split_cases
from test_c_step import built
from test_lean_runner import ids_for

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]

ARCHES = ("native", "haswell", "x86-64")


@pytest.fixture(scope="module")
def libraries():
    return {arch: built(None, arch) for arch in ARCHES}


def on_cache(runner: LeanRunner, dtype: torch.dtype, capacity: int = 64) -> LeanRunner:
    """``runner``, before its first pass, given a fresh cache of ``dtype`` holding ``capacity`` slots (the step
    reads either element: ``Dims.kv`` follows the cache)."""
    runner._reserve(capacity)
    runner.cache = new_cache(runner.model, runner.capacity, dtype, torch.device("cpu"))
    return runner


def pointer(x) -> ctypes.c_void_p:
    return ctypes.c_void_p(None if x is None else x.data_ptr())


def attend(library, q, keys, values, seen, lengths, together: bool) -> torch.Tensor:
    """c_attend_kv: q [P, g, D] over keys, values [L, D] (float32, or bfloat16: read as such) into [P, g, D]."""
    out, (L, D) = torch.empty(q.shape), keys.shape
    kv = int(keys.dtype == torch.bfloat16)
    assert 0 == library.c_attend_kv(pointer(q), ctypes.c_int64(q.shape[0]), ctypes.c_int64(q.shape[1]), pointer(keys), pointer(values),
                                    pointer(seen), pointer(lengths), ctypes.c_int64(L), ctypes.c_int64(D), ctypes.c_float(D ** -0.5),
                                    pointer(out), ctypes.c_int64(int(together)), ctypes.c_int64(kv))
    return out


def attend_split(library, q, keys, values, seen, lengths, threads: int, parts: int, qg: int) -> torch.Tensor:
    """c_attend_split_kv: q [P, Hq, D] over keys, values [Hkv, L, D] (float32 or bfloat16) into [P, Hq, D]."""
    (P, Hq, D), (Hkv, L, _) = q.shape, keys.shape
    out, shape = torch.empty(q.shape), torch.tensor([P, Hq, Hkv, L, D, threads, parts, qg], dtype=torch.int64)
    assert 0 == library.c_attend_split_kv(*(pointer(x) for x in (q, keys, values, seen, lengths, shape)), ctypes.c_float(D ** -0.5),
                                          pointer(out), ctypes.c_int64(int(keys.dtype == torch.bfloat16)))
    return out


def test_the_cache_rounds_as_torch_does(libraries):
    """bf16_round (what a bfloat16 cache holds of a key the step writes) on every build: torch's bits for random
    floats of every scale, ties to even both ways, the largest floats (rounding to infinity or not), infinities,
    signed zeros and subnormals; a NaN stays a NaN."""
    g = torch.Generator().manual_seed(21)
    edges = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x7F7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x7F800000, 0xFF800000,
                      0x00000000, 0x80000000, 0x00000001, 0x00008000, 0x00018000, 0x807FFFFF, 0x7FC00000], dtype=np.uint32)
    random = torch.randint(-2**31, 2**31, (20000,), generator=g, dtype=torch.int64).to(torch.int32)
    x = torch.cat([random, torch.from_numpy(edges.view(np.int32))]).view(torch.float32)
    nan = torch.isnan(x)
    expected = x.to(torch.bfloat16).view(torch.int16)
    for arch, library in libraries.items():
        out = torch.empty(x.shape, dtype=torch.int16)
        library.c_bf16_round(pointer(x), ctypes.c_int64(x.numel()), pointer(out))
        assert torch.equal(out[~nan], expected[~nan]), arch
        assert torch.isnan(out.view(torch.bfloat16)[nan]).all(), arch


def cases():
    """(q [8, 4, D], keys, values [L, D] bfloat16, seen [8, L] uint8 or None, lengths [8]): head sizes with and
    without a tail of dimensions, slot counts on and off the lanes' edges, a chain (no mask) and a tree's mask."""
    g = torch.Generator().manual_seed(22)
    for D in (16, 24, 64, 72):
        for L in (7, 17, 100, 257):
            keys, values = (torch.randn(L, D, generator=g) * 3).bfloat16(), torch.randn(L, D, generator=g).bfloat16()
            lengths = torch.tensor([max(1, L - 7 + p) for p in range(8)])
            seen = (torch.rand(8, L, generator=g) < 0.5)
            seen[torch.arange(8), lengths - 1] = True
            for mask in (None, seen.to(torch.uint8)):
                yield torch.randn(8, 4, D, generator=g) * 2, keys, values, mask, lengths


def test_attention_on_bfloat16_keys_is_the_chains_over_the_rounded_keys(libraries):
    """Every build, 1 to 8 positions x 1 to 4 heads, alone and together: attention over bfloat16 keys and values
    gives the bits of the float32 chains over the same keys and values widened (the contract's chains, their
    inputs the rounded keys), and the builds the same bits."""
    outputs = {arch: [] for arch in ARCHES}
    for q, keys, values, seen, lengths in cases():
        for arch, library in libraries.items():
            for positions, heads in ((1, 1), (3, 4), (8, 3)):
                queries, mask = q[:positions, :heads].contiguous(), None if seen is None else seen[:positions].contiguous()
                for together in (False, True):
                    got = attend(library, queries, keys, values, mask, lengths[:positions], together)
                    wide = attend(library, queries, keys.float(), values.float(), mask, lengths[:positions], together)
                    assert torch.equal(got, wide), (arch, tuple(keys.shape), positions, heads, together)
                    outputs[arch].append(got)
    for arch in ARCHES[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outputs[ARCHES[0]], outputs[arch])), arch


def test_split_attention_on_bfloat16_keys_is_the_chains_over_the_rounded_keys(libraries):
    """attend_split (few positions split across threads by bytes) over bfloat16 keys and values: the float32
    split's bits over them widened, on every build, thread count, part count and grouping of the heads."""
    for q, keys, values, seen, lengths in split_cases():
        keys, values = keys.bfloat16(), values.bfloat16()
        (_, Hq, D), Hkv = q.shape, keys.shape[0]
        per = Hq // Hkv
        for arch, library in libraries.items():
            most = D // library.c_attention_lanes() if D % library.c_attention_lanes() == 0 else D
            for threads, parts, qg in {(1, 1, min(per, 4)), (2, 2, 1), (3, min(3, most), 2), (2, most, min(per, 4))}:
                got = attend_split(library, q, keys, values, seen, lengths, threads, parts, min(qg, per))
                wide = attend_split(library, q, keys.float(), values.float(), seen, lengths, threads, parts, min(qg, per))
                assert torch.equal(got, wide), (arch, tuple(q.shape), tuple(keys.shape), threads, parts, qg)


def test_a_bfloat16_models_step_writes_its_cache_rounded_once():
    """A bfloat16 model's runner keeps a bfloat16 cache and bfloat16 kept key blocks (a float32 model's: float32);
    a prompt's first layer's keys and values (read from no cache) are the float32 cache's rounded, bit for bit."""
    model, ids = llama().to(torch.bfloat16), ids_for(40, seed=23)
    runner, wide = LeanRunner(model), on_cache(LeanRunner(model), torch.float32)
    with torch.no_grad():
        runner(ids, 1), wide(ids, 1)
    assert runner.step_passes == wide.step_passes == 1
    cache, kept = runner.cache.layers[0], runner.cache.kept_keys
    assert cache.keys.dtype == cache.values.dtype == kept.blocks.dtype == torch.bfloat16 and kept.upto == 40
    assert torch.equal(cache.keys[:, :, :40], wide.cache.layers[0].keys[:, :, :40].bfloat16())
    assert torch.equal(cache.values[:, :, :40], wide.cache.layers[0].values[:, :, :40].bfloat16())
    float32 = LeanRunner(llama().to(torch.float32))
    with torch.no_grad():
        float32(ids, 1)
    assert float32.cache.layers[0].keys.dtype == float32.cache.kept_keys.blocks.dtype == torch.float32


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "not_kept"])
def test_a_positions_logits_do_not_depend_on_the_width_nor_the_kept_blocks(keep, monkeypatch):
    """Positions 20..31 (block 1's end, block 2's start) one at a time, in passes of 2, 5 and 12, and in a prompt
    of 32 cut in chunks of 7: the same logits bit for bit, with the key blocks kept beside the cache or made
    each pass (and those two alike)."""
    monkeypatch.setattr(kept_keys, "KEEP", keep)
    model, ids = llama().to(torch.bfloat16), ids_for(40, seed=24)
    runner = LeanRunner(model)
    with torch.no_grad():
        runner(ids[:, :20], 1)
        alone = torch.cat([runner(ids[:, : 21 + i], 1) for i in range(12)])
        for width in (2, 5, 12):
            runner.rollback(20)
            got = torch.cat([runner(ids[:, : min(20 + w0 + width, 32)], min(width, 12 - w0)) for w0 in range(0, 12, width)])
            assert torch.equal(got, alone), width
        monkeypatch.setattr(c_step, "CHUNK_ROWS", 7)
        chunked = LeanRunner(model)
        assert torch.equal(chunked(ids[:, :32], 12), alone)
    assert runner.cache.layers[0].keys.dtype == torch.bfloat16 and (runner.cache.kept_keys is not None) == keep
    assert runner.step_passes == runner.forward_passes
    other = LeanRunner(model)
    monkeypatch.setattr(kept_keys, "KEEP", not keep)
    with torch.no_grad():
        other(ids[:, :20], 1)
        assert torch.equal(other(ids[:, :32], 12), alone)


def test_a_rollback_then_a_pass_reads_no_stale_block():
    """Drafts verified into a new block, rejected back across a block's edge, other tokens fed there: each
    position's logits are a fresh runner's over the sequence it sees (the blocks past the rollback rewritten)."""
    model, ids, other = llama().to(torch.bfloat16), ids_for(60, seed=25), ids_for(60, seed=26)
    mixed = torch.cat([ids[:, :30], other[:, 30:]], 1)
    runner, fresh = LeanRunner(model), LeanRunner(model)
    with torch.no_grad():
        runner(ids[:, :28], 1)
        runner(ids[:, :40], 12)  # slots 28..39: blocks 1 and 2
        runner.rollback(30)  # back into block 1
        got = torch.cat([runner(mixed[:, :31], 1), runner(mixed[:, :35], 4), runner(mixed[:, :36], 1)])
        fresh(mixed[:, :30], 1)
        expected = torch.cat([fresh(mixed[:, :31], 1), fresh(mixed[:, :35], 4), fresh(mixed[:, :36], 1)])
    assert runner.cache.kept_keys is not None and runner.cache.kept_keys.upto == 36
    assert torch.equal(got, expected)


def test_a_regrown_cache_holds_the_same_bfloat16_keys(monkeypatch):
    """A cache that regrows mid-decoding (its keys and values copied, its kept blocks made again for the new
    tensors) gives the logits of one that never did, and stays bfloat16."""
    model, ids = llama().to(torch.bfloat16), ids_for(60, seed=27)
    roomy = LeanRunner(model)
    with torch.no_grad():
        roomy(ids[:, :28], 1)
        expected = torch.cat([roomy(ids[:, :n], 1) for n in range(29, 45)])
        monkeypatch.setattr(static, "STATIC_SLACK", 0)
        monkeypatch.setattr(static, "STATIC_ROUND", 16)
        tight = LeanRunner(model)
        tight(ids[:, :28], 1)
        assert tight.capacity == 32
        got = torch.cat([tight(ids[:, :n], 1) for n in range(29, 45)])
    assert tight.capacity == 64 and tight.cache.layers[0].values.dtype == tight.cache.kept_keys.blocks.dtype == torch.bfloat16
    assert torch.equal(got, expected)


def test_greedy_prompt_lookup_and_nasd_emit_bfloat16_target_ar_tokens(monkeypatch):
    """On the bfloat16 step and its bfloat16 cache, prompt lookup's and NASD's rows verify what target AR
    decodes, token for token, with drafts accepted now and then."""
    target, calls = llama(layers=3).to(torch.bfloat16), []
    real, one = CStep.__call__, OnePass.one  # a pass's whole call, and decoding's decided one (``runners.lean_lane``)

    def counting(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        calls.append(self.dims.kv)
        return out

    def counting_one(self, *args):
        out = one(self, *args)
        calls.append(self.step.dims.kv)
        return out

    monkeypatch.setattr(CStep, "__call__", counting)
    monkeypatch.setattr(OnePass, "one", counting_one)
    reference = autoregressive_generate(PROMPT, target, 40, eos_tokens_id=EOS_NEVER, use_cache=True)
    decoded = len(calls)
    nasd, _ = ngram_assisted_speculative_generate(PROMPT, NGramStorage(2, VOCAB), target, gamma=4, max_gen_len=40,
                                                  eos_tokens_id=EOS_NEVER, use_cache=True)
    pld, rate = generate(PROMPT, target, PromptLookupSpec(), dict(max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=True))
    assert decoded >= 39 and len(calls) > decoded and set(calls) == {1}  # every pass on the step, over a bfloat16 cache
    assert nasd == reference and pld == reference and rate > 0.0
