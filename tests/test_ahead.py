"""How far ahead decoding's tiles prefetch their weights, chosen by measurement (kernels/ahead.py): the choice is a
pure function of the seconds the timer gives (fixed here, no clock), made once per process, library and dtype and
set in the library; and it is speed only: every pass of either dtype, on every bfloat16 path, gives the same
logits whichever distance the tiles prefetch (none, the default 4 KB, another)."""
import ctypes

import pytest
import torch

import kernels.ahead as ahead
import kernels.bf16 as bf16
from kernels import skinny
from runners import LeanRunner
from test_lean_runner import MODELS, PASSES, ids_for

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]


@pytest.fixture
def fresh(monkeypatch):
    """No choice made yet in this test; the library's distances put back after it."""
    monkeypatch.setattr(ahead, "_CHOSEN", {})
    library = skinny.library()
    library.skinny_set_few32.restype = ctypes.c_int64
    before, few = [library.skinny_set_ahead(-1, -1, k) for k in (0, 1)], [library.skinny_set_few32(-1, -1, -1, -1, i) for i in range(4)]
    yield library
    library.skinny_set_ahead(*before, 0)
    library.skinny_set_few32(*few, 0)


def few32(library) -> tuple:
    """The library's f32_few now (kernels/f32_few.h: on, tile shape, bytes ahead into L2, from rows)."""
    return tuple(library.skinny_set_few32(-1, -1, -1, -1, i) for i in range(4))


def test_no_prefetch_is_chosen_only_where_clearly_faster():
    """NONE wins where its median is under ``MARGIN`` of the default's; within it, or slower, the default stays."""
    assert ahead.choose({ahead.DEFAULT: 1.0e-3, ahead.NONE: 0.8e-3}.__getitem__) == \
        ahead.Measured(ahead.NONE, ahead.MEASURED, ((ahead.DEFAULT, 1.0e-3), (ahead.NONE, 0.8e-3)))
    assert ahead.choose({ahead.DEFAULT: 1.0e-3, ahead.NONE: 0.99e-3}.__getitem__).pick == ahead.DEFAULT
    assert ahead.choose({ahead.DEFAULT: 1.0e-3, ahead.NONE: 1.3e-3}.__getitem__).pick == ahead.DEFAULT


def test_the_race_reads_each_distances_least_sample_so_a_neighbours_bursts_do_not_flip_it():
    """Samples as a busy machine gave them (one thread, 2026-11-30): no prefetch about 4 ms undisturbed, 4 KB about
    4.7 ms, and a neighbour doubling half of each's samples. By medians 4 KB would win (none's disturbed more often);
    by each distance's least sample, none wins, and it still wins only where clearly faster (``MARGIN``)."""
    from itertools import cycle

    from kernels.bf16_choice import MIN_REPEATS, WARMUP, fastest, medians

    def given(none, default):
        seconds = {ahead.NONE: cycle(none), ahead.DEFAULT: cycle(default)}
        return lambda bytes_ahead: next(seconds[bytes_ahead]) * 1e-3

    none, default = [8.15, 8.36, 8.04, 3.93, 3.87, 7.91, 8.03], [8.94, 5.8, 5.06, 8.87, 10.05, 4.63, 4.78]
    rounds = WARMUP + len(none)
    by_medians = medians((ahead.DEFAULT, ahead.NONE), given([9.0] * WARMUP + none, [9.0] * WARMUP + default))
    assert len(none) > MIN_REPEATS and fastest(by_medians, ahead.DEFAULT) == ahead.DEFAULT, by_medians
    found = ahead.choose(given([9.0] * WARMUP + none, [9.0] * WARMUP + default))
    assert found.pick == ahead.NONE and dict(found.seconds) == {ahead.DEFAULT: 4.63e-3, ahead.NONE: 3.87e-3}, found
    close = [4.5] * rounds  # none's least within MARGIN of 4 KB's: the default stays
    assert ahead.choose(given([9.0] * WARMUP + none, [9.0] * WARMUP + [3.95] + close)).pick == ahead.DEFAULT


def test_the_choice_is_made_once_per_dtype_and_set_in_the_library(fresh):
    """float32 and bfloat16 each measured once (a second model of the dtype asks no timer) and set apart."""
    calls = []

    def given(seconds):
        return lambda bytes_ahead: calls.append(bytes_ahead) or seconds[bytes_ahead]

    fast_none, fast_default = {ahead.DEFAULT: 2e-3, ahead.NONE: 1e-3, ahead.L2: 3e-3}, {ahead.DEFAULT: 1e-3, ahead.NONE: 2e-3}
    assert ahead.settle(fresh, ahead.F32, (3072, 576), run=given(fast_none)).pick == ahead.NONE
    assert ahead.settle(fresh, bf16.DOT, (3072, 576), run=given(fast_default)).pick == ahead.DEFAULT
    timed = len(calls)
    assert ahead.settle(fresh, bf16.AVX512, (64, 32), run=given(fast_none)).pick == ahead.DEFAULT and len(calls) == timed
    assert [fresh.skinny_set_ahead(-1, -1, k) for k in (0, 1)] == [ahead.NONE, ahead.DEFAULT]


def test_the_timer_runs_the_linear_at_the_distance_it_is_given(fresh):
    """The real timer (copies of a small shape) sets the distance it times, in either dtype."""
    for fmt in (ahead.F32, bf16.paths(fresh)[0]):
        run = ahead.timer(fresh, fmt, (64, 32))
        for bytes_ahead in (ahead.NONE, 1024, ahead.DEFAULT):
            assert run(bytes_ahead) > 0 and fresh.skinny_set_ahead(-1, -1, ahead.kind(fmt)) == bytes_ahead


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_distance_gives_every_pass_the_same_logits(fresh, dtype, monkeypatch):
    """Passes of PASSES (a prompt, decoding, verification) at each distance, on each bfloat16 path built: alike."""
    ids = ids_for()
    for path in [None] if dtype == torch.float32 else bf16.paths(fresh):
        monkeypatch.setattr(bf16, "FORCED", path)
        found = []
        for bytes_ahead in (ahead.NONE, 64, ahead.DEFAULT, 3 * ahead.DEFAULT):
            runner = LeanRunner(MODELS["qwen2"]().to(dtype))
            runner(ids[:, :4], 1)  # the step built (its dtype's distance settled), then the distance under test
            fresh.skinny_set_ahead(bytes_ahead, bytes_ahead, 0)
            runner.rollback(0)
            found.append(torch.cat([runner(ids[:, :length], n) for length, n in PASSES]))
            assert runner.step_passes == len(PASSES) + 1 and fresh.skinny_set_ahead(-1, -1, int(dtype == torch.bfloat16)) == bytes_ahead
        if dtype == torch.float32 and ahead.L2 in ahead.candidates(fresh, ahead.F32):  # one position on the few-row loop
            runner = LeanRunner(MODELS["qwen2"]().to(dtype))
            runner(ids[:, :4], 1)
            ahead.apply(fresh, ahead.F32, ahead.L2)
            runner.rollback(0)
            found.append(torch.cat([runner(ids[:, :length], n) for length, n in PASSES]))
            assert few32(fresh) == ahead.FEW_L2
        assert all(torch.equal(f, found[0]) for f in found[1:])


def test_a_model_without_released_blocks_is_not_timed_on_copies_and_its_blocks_are_timed_later(fresh):
    """No weights and no timer (a start's kernel measurement, before the release): the default set, nothing timed,
    nothing allocated, nothing kept; the released blocks asked for next are timed."""
    fresh.skinny_set_ahead(ahead.NONE, ahead.NONE, 0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        untimed = ahead.settle(fresh, ahead.F32, (3072, 576))
    assert untimed == ahead.Measured(ahead.DEFAULT, ahead.UNTIMED) and fresh.skinny_set_ahead(-1, -1, 0) == ahead.DEFAULT
    assert sum(e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0) < 1 << 20  # no copies (64 MB)
    blocks = [torch.full((4, 32, 16), 1 / 64) for _ in range(2)]
    assert ahead.settle(fresh, ahead.F32, (64, 32), blocks).how == ahead.MEASURED


def test_the_headers_name_the_distance_and_how_it_was_chosen(fresh):
    """Untimed: the build's default said so; raced: the winner, by measurement (the C step's label carries it)."""
    assert ahead.words(fresh, ahead.F32) == "weights prefetched 4 KB ahead (the build's default, untimed)"
    ahead.settle(fresh, ahead.F32, (64, 32), run={ahead.DEFAULT: 2e-3, ahead.NONE: 1e-3, ahead.L2: 3e-3}.__getitem__)
    assert ahead.words(fresh, ahead.F32) == "weights streamed without software prefetch by measurement"
    ahead.settle(fresh, bf16.DOT, (64, 32), run={ahead.DEFAULT: 1e-3, ahead.NONE: 2e-3}.__getitem__)
    assert ahead.words(fresh, bf16.DOT) == "weights prefetched 4 KB ahead by measurement"


def test_the_distances_raced_are_named_with_their_samples_for_the_header(fresh):
    """``raced``: each dtype raced in this process, the pick and its least samples ("" before any race), as the
    REPL's verbose header adds them after its warm-up (the models' lines were written before the race)."""
    assert ahead.raced() == ""
    ahead.settle(fresh, ahead.F32, (3072, 576), run={ahead.DEFAULT: 2e-3, ahead.NONE: 1e-3, ahead.L2: 3e-3}.__getitem__)
    ahead.settle(fresh, bf16.DOT, (3072, 576), run={ahead.DEFAULT: 1e-3, ahead.NONE: 2e-3}.__getitem__)
    l2 = ", 3 ms the few-row loop into L2" if ahead.L2 in ahead.candidates(fresh, ahead.F32) else ""
    assert ahead.raced() == (f"float32 weights streamed without software prefetch by measurement (1 ms against 2 ms 4 KB ahead{l2}); "
                             "bfloat16 weights prefetched 4 KB ahead by measurement (1 ms against 2 ms none)")


@pytest.mark.skipif(skinny.available()[0] and skinny.library().skinny_simd() != 512, reason="the few-row loop is AVX-512's")
def test_float32_races_the_few_row_loop_into_l2_and_each_pick_sets_its_loop(fresh):
    """On an AVX-512 build float32 races L2 too: picked where clearly faster, it sets kernels/f32_few.h's FEW_L2 (one
    position on the few-row loop, prefetched into L2) and names it; a pick of a distance puts the loop back as built."""
    built = tuple(fresh.skinny_set_few32(-1, -1, -1, -1, 4 + i) for i in range(4))  # as built, whatever a test set before
    assert ahead.candidates(fresh, ahead.F32) == (ahead.DEFAULT, ahead.NONE, ahead.L2)
    assert ahead.candidates(fresh, bf16.DOT) == (ahead.DEFAULT, ahead.NONE)
    found = ahead.settle(fresh, ahead.F32, (64, 32), run={ahead.DEFAULT: 2e-3, ahead.NONE: 1.9e-3, ahead.L2: 1e-3}.__getitem__)
    assert found.pick == ahead.L2 and few32(fresh) == ahead.FEW_L2
    assert ahead.words(fresh, ahead.F32) == "weights prefetched 4 KB ahead into L2 on the few-row loop by measurement"
    assert ahead.choose({ahead.DEFAULT: 1e-3, ahead.NONE: 2e-3, ahead.L2: 0.99e-3}.__getitem__, ahead.candidates(fresh, ahead.F32)).pick == ahead.DEFAULT
    ahead.apply(fresh, ahead.F32, ahead.NONE)
    assert few32(fresh) == built and fresh.skinny_set_ahead(-1, -1, 0) == ahead.NONE
