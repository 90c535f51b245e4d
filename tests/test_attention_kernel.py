"""attention.h's vector tiles (attention_tiles.h) on each build: AVX-512's 16 lanes (this CPU's build, where
it has them), AVX2's 8 and the plain loops give every query the same bits, alone or with other positions and
heads of its key-value head (up to 8 positions x 4 heads: 32 rows, two 16-row transposes of totals, tiles
of 5 and 6 rows cut short), on the shapes at the tiles' edges: slot counts off the 8- and 16-lane
boundaries, head sizes with a tail of dimensions or none, a chain's staircase, positions seeing very
different counts of slots (a row's weights 0 past its own), a tree's scattered mask, a window's gap."""
import ctypes

import pytest
import torch

from kernels import skinny
from test_c_step import built

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]

ARCHES = ("native", "haswell", "x86-64")


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    folder = tmp_path_factory.mktemp("builds")
    return {arch: built(folder, arch) for arch in ARCHES}


def attention(library, q: torch.Tensor, keys, values, seen, lengths, together: bool) -> torch.Tensor:
    """c_attend: q [P, g, D] over keys, values [L, D], seen [P, L] (None: every slot below a position's length),
    lengths [P] into [P, g, D]."""
    out, (L, D) = torch.empty(q.shape), keys.shape
    pointers = [ctypes.c_void_p(None if x is None else x.data_ptr()) for x in (q, keys, values, seen, lengths)]
    assert 0 == library.c_attend(pointers[0], ctypes.c_int64(q.shape[0]), ctypes.c_int64(q.shape[1]), *pointers[1:],
                                 ctypes.c_int64(L), ctypes.c_int64(D), ctypes.c_float(D ** -0.5), ctypes.c_void_p(out.data_ptr()),
                                 ctypes.c_int64(int(together)))
    return out


def cases():
    """(q [8, 4, D], keys, values [L, D], seen [8, L] uint8, lengths [8]) over head sizes and slot counts at the
    lanes' edges and four patterns of what the eight positions see."""
    g = torch.Generator().manual_seed(11)
    for D in (8, 16, 24, 64, 72):
        for L in (7, 9, 17, 31, 100, 257):
            keys, values = torch.randn(L, D, generator=g), torch.randn(L, D, generator=g)
            staircase = torch.tensor([max(1, L - 7 + p) for p in range(8)])
            spread = torch.tensor([max(1, L * (p + 1) // 8) for p in (5, 0, 7, 2, 6, 1, 4, 3)])  # 1/8 to all of the slots
            patterns = [(torch.ones(8, L, dtype=torch.bool), staircase), (torch.ones(8, L, dtype=torch.bool), spread),
                        (torch.rand(8, L, generator=g) < 0.5, spread), ((torch.arange(L) >= L // 2).expand(8, L), staircase)]
            for seen, lengths in patterns:
                seen = seen.clone()
                seen[torch.arange(8), lengths - 1] = True  # the position itself
                yield torch.randn(8, 4, D, generator=g) * 2, keys, values, seen.to(torch.uint8), lengths


def test_each_build_runs_attention_on_its_own_lanes(libraries):
    """The AVX2 build takes the 8-lane tiles, the plain x86-64 build the plain loops, this CPU's build its widest
    (so that the bit comparisons below compare the vector paths)."""
    lanes = {arch: library.c_attention_lanes() for arch, library in libraries.items()}
    assert lanes["haswell"] == 8 and lanes["x86-64"] == 1
    assert lanes["native"] == (16 if "avx512f" in open("/proc/cpuinfo").read() else 8)


def test_every_build_gives_every_query_the_bits_of_one_query_alone(libraries):
    """Every build: 1, 2, 3, 5 or 8 positions x 1 to 4 heads together (score tiles of two positions' heads, an odd
    position's alone; a pair's first seeing fewer slots than its second, or more) give each query the bits it gets
    alone, close to softmax(q k^T / sqrt(D)) v; the three builds the same bits."""
    outputs = {arch: [] for arch in ARCHES}
    for q, keys, values, seen, lengths in cases():
        L = keys.shape[0]
        visible = seen.bool() & (torch.arange(L) < lengths[:, None])
        expected = torch.softmax((q @ keys.T * keys.shape[1] ** -0.5).masked_fill(~visible[:, None], -float("inf")), -1) @ values
        for arch, library in libraries.items():
            for positions, heads in ((1, 1), (2, 3), (3, 4), (5, 2), (8, 1), (8, 3), (8, 4)):
                queries = q[:positions, :heads].contiguous()
                alone = attention(library, queries, keys, values, seen[:positions].contiguous(), lengths[:positions], False)
                together = attention(library, queries, keys, values, seen[:positions].contiguous(), lengths[:positions], True)
                assert torch.equal(together, alone), (arch, keys.shape, positions, heads)
                torch.testing.assert_close(alone, expected[:positions, :heads], rtol=1e-4, atol=1e-5)
                outputs[arch].append(alone)
    for arch in ARCHES[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outputs[ARCHES[0]], outputs[arch])), arch


def test_a_chain_without_a_mask_gives_the_bits_of_one_seeing_every_slot(libraries):
    """Every build: a chain's unit, no mask (every slot below each position's length seen: the C step's causal
    prompt pass, whose soften reads no mask bytes and leaves whole vectors unmasked), gives the bits of the same
    positions with an all-ones mask, alone and 1, 3 or 8 positions x 1, 3 or 4 heads together, over slot counts
    below, on and past the lanes' edges (tails of 1 to 15 slots, four running maxima and their remainder); and
    the three builds the same bits, with scores spread wide enough (queries x 40) that weights reach exp's
    clamp at -87 (AVX-512's soften scales by scalef, the others by the exponent bits)."""
    g = torch.Generator().manual_seed(12)
    outputs = {arch: [] for arch in ARCHES}
    for D in (16, 64, 72):
        for L in (1, 7, 16, 17, 63, 64, 65, 100, 257):
            keys, values = torch.randn(L, D, generator=g), torch.randn(L, D, generator=g)
            lengths = torch.tensor([max(1, L - 7 + p) for p in range(8)])
            ones = torch.ones(8, L, dtype=torch.uint8)
            for spread in (3.0, 40.0):
                q = torch.randn(8, 4, D, generator=g) * spread
                for arch, library in libraries.items():
                    for positions, heads in ((1, 1), (3, 3), (8, 4)):
                        queries = q[:positions, :heads].contiguous()
                        masked = attention(library, queries, keys, values, ones[:positions].contiguous(), lengths[:positions], False)
                        for together in (False, True):
                            chain = attention(library, queries, keys, values, None, lengths[:positions], together)
                            assert torch.equal(chain, masked), (arch, D, L, positions, heads, together)
                        outputs[arch].append(masked)
    for arch in ARCHES[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outputs[ARCHES[0]], outputs[arch])), arch


def split(library, q: torch.Tensor, keys, values, seen, lengths, threads: int, parts: int, qg: int) -> torch.Tensor:
    """c_attend_split: q [P, Hq, D] over keys, values [Hkv, L, D], seen [P, L], lengths [P] into [P, Hq, D], on
    ``threads`` threads, the dimensions in ``parts``, the heads in groups of ``qg``."""
    (P, Hq, D), (Hkv, L, _) = q.shape, keys.shape
    out, shape = torch.empty(q.shape), torch.tensor([P, Hq, Hkv, L, D, threads, parts, qg], dtype=torch.int64)
    pointers = [ctypes.c_void_p(x.data_ptr()) for x in (q, keys, values, seen, lengths, shape)]
    assert 0 == library.c_attend_split(*pointers, ctypes.c_float(D ** -0.5), ctypes.c_void_p(out.data_ptr()))
    return out


def split_cases():
    """(q [P, Hkv per, D], keys, values [Hkv, L, D], seen [P, L], lengths [P]): 1, 5 and 8 positions (decoding,
    verification) of 1-3 key-value heads of 1-5 query heads each, over slot counts a thread's span of blocks cuts
    anywhere (a block's tail, a span of none), head sizes with and without whole vectors, the seen patterns of
    ``cases``: a chain's staircase, a tree's scattered mask, a window's gap."""
    g = torch.Generator().manual_seed(13)
    for D, L, Hkv, per, P in ((64, 700, 3, 3, 1), (64, 257, 3, 3, 5), (64, 33, 2, 5, 8), (24, 100, 3, 3, 8), (72, 31, 1, 4, 5),
                              (8, 9, 3, 2, 1), (16, 160, 4, 1, 8), (64, 5, 3, 3, 5)):
        keys, values = torch.randn(Hkv, L, D, generator=g), torch.randn(Hkv, L, D, generator=g)
        staircase = torch.tensor([max(1, L - P + 1 + p) for p in range(P)])
        for seen in (torch.ones(P, L, dtype=torch.bool), torch.rand(P, L, generator=g) < 0.5, (torch.arange(L) >= L // 2).expand(P, L)):
            seen = seen.clone()
            seen[torch.arange(P), staircase - 1] = True
            yield torch.randn(P, Hkv * per, D, generator=g) * 2, keys, values, seen.to(torch.uint8), staircase


def test_attention_split_across_threads_gives_every_query_the_bits_of_one_query_alone(libraries):
    """attend_split (a pass of few positions, its scores split by spans of slots and its outputs by parts of the
    dimensions across the threads): on every build, 1-3 threads, every count of parts up to a vector each and
    every grouping of the query heads, each query's bits of attend_positions on that query alone; the builds
    alike."""
    outputs = {arch: [] for arch in ARCHES}
    for q, keys, values, seen, lengths in split_cases():
        (P, Hq, D), Hkv = q.shape, keys.shape[0]
        per = Hq // Hkv
        for arch, library in libraries.items():
            lanes = library.c_attention_lanes()
            alone = torch.stack([torch.cat([attention(library, q[:, kv * per + c][:, None].contiguous(), keys[kv], values[kv], seen,
                                                      lengths, False) for kv in range(Hkv) for c in range(per)], 1)])[0]
            most = D // lanes if D % lanes == 0 else D
            for threads, parts, qg in {(1, 1, min(per, 4)), (2, 1, min(per, 4)), (2, 2, 1), (3, min(3, most), 2), (2, most, min(per, 4)),
                                       (3, 1, 3)}:
                got = split(library, q, keys, values, seen, lengths, threads, parts, min(qg, per))
                assert torch.equal(got, alone), (arch, tuple(q.shape), keys.shape, threads, parts, qg)
            outputs[arch].append(alone)
    for arch in ARCHES[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outputs[ARCHES[0]], outputs[arch])), arch


def test_a_threads_consecutive_parts_in_one_sweep_give_the_bits_of_one_query_alone(libraries):
    """attend_split's outputs step takes a thread's consecutive parts of one group of heads in one sweep over the
    values' rows: at every width it takes (1-8 positions), a long context that is no multiple of 16 (SmolLM2's
    3 key-value heads of 3 query heads, D 64), 1-3 threads and the parts that give a thread several of one group,
    under a chain's staircase, a tree's scattered mask and a window's gap, each query's bits of it alone."""
    g = torch.Generator().manual_seed(17)
    D, L, Hkv, per = 64, 803, 3, 3
    keys, values = torch.randn(Hkv, L, D, generator=g), torch.randn(Hkv, L, D, generator=g)
    for P in range(1, 9):
        staircase = torch.tensor([L - P + 1 + p for p in range(P)])
        q = torch.randn(P, Hkv * per, D, generator=g) * 2
        for seen in (torch.ones(P, L, dtype=torch.bool), torch.rand(P, L, generator=g) < 0.5, (torch.arange(L) >= L - 300).expand(P, L)):
            seen = seen.clone()
            seen[torch.arange(P), staircase - 1] = True
            seen = seen.to(torch.uint8)
            for arch, library in libraries.items():
                alone = torch.cat([attention(library, q[:, kv * per + c][:, None].contiguous(), keys[kv], values[kv], seen,
                                             staircase, False) for kv in range(Hkv) for c in range(per)], 1)
                most = D // library.c_attention_lanes()
                for threads, parts in ((1, 2), (2, 2), (2, most), (3, 2), (3, most)):
                    got = split(library, q, keys, values, seen, staircase, threads, parts, per)
                    assert torch.equal(got, alone), (arch, P, threads, parts)
