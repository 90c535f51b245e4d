"""The bfloat16 path and its many-row variant chosen by measurement (kernels/bf16_choice.py,
kernels/bf16.py): the choice is a pure function of the seconds the timer gives (fixed here, no clock),
made once per process and library, named in the header with its figures, and the greedy rows of a run
under it emit target AR's tokens, every pass on the one path chosen."""
import math
import weakref

import pytest

import kernels.bf16 as bf16
from kernels import bf16_choice as choice
from kernels import skinny
from kernels.c_step import CStep, gate_up_shape, label, short_label
from kernels.prompt_gemm import MANY_ROWS
from runners import LeanRunner
from test_c_step_bf16 import bfloat16, drafting_rows_are_target_ar
from test_lean_runner import ids_for

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]


def given(seconds: dict, per_tile: dict):
    """A timer as ``choice.linear_timer`` makes one, giving ``seconds[path]`` for one row, twice that for
    a verification's ``VERIFY_ROWS`` rows and ``per_tile[tile]`` for a many-row variant; each call counted in ``calls``."""
    calls = []

    def make(library, shape, threads, weights=None):
        def run(path: int, tile: int, rows: int) -> float:
            calls.append((shape, path, tile, rows))
            return seconds[path] if rows == 1 else 2 * seconds[path] if rows == choice.VERIFY_ROWS else per_tile[tile]
        return run

    return make, calls


@pytest.fixture
def fresh(monkeypatch):
    """No choice made yet in this test (the process's own put back after), nothing forced; the paths built."""
    monkeypatch.setattr(bf16, "_DECIDED", weakref.WeakKeyDictionary())
    monkeypatch.setattr(bf16, "FORCED", None)
    monkeypatch.setattr(bf16, "FORCED_TILE", None)
    built = bf16.paths(skinny.library())
    if len(built) < 2:
        pytest.skip("one bfloat16 path built here: nothing to choose")
    return built


def test_the_fastest_path_and_variant_of_the_given_seconds_are_chosen():
    """The least weighed run wins (one-position and many-row medians); a key within ``MARGIN`` of the
    default leaves the default; one key built is taken untimed; the budget (the timer's own seconds)
    stops rounds after ``MIN_REPEATS``."""
    slow = lambda seconds: lambda path, tile, rows: seconds[path if rows == 1 else tile]  # noqa: E731
    runs = lambda one, verify, many: lambda path, tile, rows: {1: one, choice.VERIFY_ROWS: verify}.get(rows, many)[path]  # noqa: E731
    assert choice.choose_path([4, 3, 2], slow({4: 2.0e-3, 3: 1.0e-3, 2: 1.5e-3})) == \
        choice.Measured(3, choice.MEASURED, ((4, 2.0e-3), (3, 1.0e-3), (2, 1.5e-3)))  # no path rounds apart: one position decides
    assert choice.choose_path([4, 3], slow({4: 1.0e-3, 3: 0.99e-3})).pick == 4  # within the margin: the default
    one, verify, many = {5: 1.2e-3, 3: 1.0e-3, 2: 1.5e-3}, {5: 1.3e-3, 3: 1.2e-3}, {5: 2e-3, 3: 8e-3}
    measured = choice.choose_path([5, 3, 2], runs(one, verify, many), 3, rounding=(5,))  # 5 rounds apart: it and 3 race on the weighed run
    assert (measured.pick, measured.seconds) == (5, tuple((p, choice.weighed(one[p], verify[p], many[p])) for p in (5, 3)))
    assert measured.parts[:2] == ((5, one[5], verify[5], many[5]), (3, one[3], verify[3], many[3])) and measured.parts[2][:2] == (2, one[2])
    assert math.isnan(measured.parts[2][2]) and math.isnan(measured.parts[2][3])  # 2 widens as 3 does, slower: never timed over rows
    assert choice.choose_path([1], slow({})) == choice.Measured(1, choice.ONLY)
    assert choice.choose_tile(3, [1, 2], 2, slow({1: 0.9e-3, 2: 1.0e-3})).pick == 1
    calls = []
    timed = choice.medians([1, 2], lambda key: calls.append(key) or 1.0)  # a second a call: past the budget at once
    assert timed == {1: 1.0, 2: 1.0} and len(calls) == 2 * (choice.WARMUP + choice.MIN_REPEATS)


def test_a_path_slower_at_one_row_wins_where_its_prompt_pass_pays_for_it():
    """The rule weighs ``DECODED`` one-position linears against a ``PROMPT``-position prompt: a path 1.1x
    slower at one row but 8x faster over ``ROWS`` rows (the AMX tiles against the widening load) is
    chosen; one 2x slower at one row and only 1.2x faster over many rows is not; the variant each path's
    many rows were timed on is the one given for it."""
    asked = []

    def timer(one, verify, many):
        def run(path, tile, rows):
            asked.append((path, tile, rows))
            return {1: one, choice.VERIFY_ROWS: verify}.get(rows, many)[path]
        return run

    widening, amx, dot = bf16.AVX512, bf16.AMX, bf16.DOT
    assert choice.choose_path([amx, widening], timer({amx: 1.1e-3, widening: 1e-3}, {amx: 1.2e-3, widening: 1.2e-3},
                                                     {amx: 2.5e-3, widening: 20e-3}), widening, {amx: 1, widening: 2}, bf16.ROUNDING).pick == amx
    assert {(path, tile) for path, tile, rows in asked if rows == choice.ROWS} == {(amx, 1), (widening, 2)}
    assert {(path, tile) for path, tile, rows in asked if rows == choice.VERIFY_ROWS} == {(amx, 0), (widening, 0)}  # decoding's loop
    assert choice.choose_path([amx, widening], timer({amx: 2e-3, widening: 1e-3}, {amx: 2e-3, widening: 1.2e-3},
                                                     {amx: 16.7e-3, widening: 20e-3}), widening, rounding=bf16.ROUNDING).pick == widening
    # the dot products as one measured them here: at one position and over 64 rows ahead, but 3x the widening
    # load's time at a verification's 8 rows (docs/profile.md): a drafting row's passes decide it
    dot_runs = timer({dot: 0.95e-3, widening: 1e-3}, {dot: 3e-3, widening: 1.1e-3}, {dot: 10e-3, widening: 12e-3})
    assert choice.choose_path([dot, widening], dot_runs, widening, rounding=bf16.ROUNDING).pick == widening


def test_a_path_whose_samples_lost_time_slices_still_wins_by_its_least_samples():
    """Another process only ever adds time to a sample: the dot path faster on the weighed run, but with all its
    one-position samples but one disturbed (3x), is still chosen (each path by its least sample), where the
    medians of the same samples would take the widening load; the many-row variant likewise."""
    clean = {(bf16.DOT, 1): 1.0e-4, (bf16.AVX512, 1): 1.0e-4, (bf16.DOT, choice.VERIFY_ROWS): 1.2e-4,
             (bf16.AVX512, choice.VERIFY_ROWS): 1.6e-4, (bf16.DOT, choice.ROWS): 0.5e-3, (bf16.AVX512, choice.ROWS): 1.0e-3}
    count = {}

    def run(path, tile, rows):
        n = count[path, rows] = count.get((path, rows), -1) + 1
        slow = path == bf16.DOT and rows == 1 and n != choice.WARMUP + 1  # one clean timed sample of the dot's one position
        return clean[path, rows] * (3 if slow else 1)

    found = choice.choose_path([bf16.DOT, bf16.AVX512], run, bf16.AVX512, rounding=bf16.ROUNDING)
    assert found.pick == bf16.DOT and dict(found.seconds)[bf16.DOT] == choice.weighed(1.0e-4, 1.2e-4, 0.5e-3), found
    count.clear()
    one = choice.medians([bf16.DOT, bf16.AVX512], lambda path: run(path, 0, 1))  # the rule before: medians
    assert choice.weighed(one[bf16.DOT], 1.2e-4, 0.5e-3) > choice.weighed(one[bf16.AVX512], 1.6e-4, 1.0e-3)
    tiles = iter([5e-3, 2e-3] * choice.WARMUP + [1e-3, 2e-3] + [5e-3, 2e-3] * (choice.REPEATS - 1))  # variant 1: least 1e-3, median 5e-3
    assert choice.choose_tile(bf16.DOT, [1, 2], 2, lambda path, tile, rows: next(tiles)).pick == 1


def test_a_process_measures_once_and_the_header_names_the_measurement(fresh, monkeypatch):
    """The first bfloat16 model's step measures its gate/up shape; the path and many-row variant the given
    seconds make fastest run its passes and are named with their figures; a second model, and the
    header, measure nothing again; ``forget`` asks again."""
    built = fresh
    seconds = {p: 0.9e-3 for p in built} | {built[0]: 0.63e-3, built[1]: 0.41e-3}
    many = list(range(1, len(bf16.tiles(skinny.library(), built[1]))))
    per_tile = {t: (10 - t) * 1e-3 for t in many}  # the last variant fastest
    make, calls = given(seconds, per_tile)
    monkeypatch.setattr(choice, "linear_timer", make)
    model, ids = bfloat16(), ids_for(40)
    runner = LeanRunner(model)
    runner(ids[:, :30], 1)
    measured = len(calls)
    assert measured and {shape for shape, *_ in calls} == {gate_up_shape(model)}
    assert runner.step.dims.weights == built[1] and bf16.prompt_tile(skinny.library(), built[1], MANY_ROWS + 1) == many[-1]
    n, k = gate_up_shape(model)
    rows, blocks, _ = bf16.tiles(skinny.library(), built[1])[many[-1]]
    words = label(model)
    assert f"read by the {bf16.NAMES[built[1]]}, " in words, words
    if set(built[:2]) & set(bf16.ROUNDING):  # a path that rounds apart races: the weighed run, each many-row time named
        many_ms = lambda path: f"{per_tile[bf16.PROMPT_TILE[path]] * 1e3:.3g}"  # noqa: E731 (its default variant's seconds)
        weights = f"{choice.DECODED}:{choice.VERIFIED}:{choice.PROMPT // choice.ROWS}"
        assert (f"by measurement ({n}x{k} linears, 1, {choice.VERIFY_ROWS} and {choice.ROWS} rows weighed {weights}, 0.41 + 0.82 + "
                f"{many_ms(built[1])} ms against 0.63 + 1.26 + {many_ms(built[0])} ms {bf16.NAMES[built[0]]}") in words, words
    else:
        assert f"by measurement (a one-position {n}x{k} linear 0.41 ms against 0.63 ms {bf16.NAMES[built[0]]}" in words, words
    if len(many) > 1:
        assert f"prompt tile {rows}x{blocks} by measurement ({choice.ROWS} rows {10 - many[-1]} ms against" in words, words
    assert short_label(model) == f"C step, {bf16.NAMES[built[1]]} by measurement"
    other = bfloat16()
    LeanRunner(other)(ids[:, :30], 1)
    assert len(calls) == measured  # the same shape, the same process: no new measurement
    bf16.forget()
    bf16.chosen(skinny.library(), gate_up_shape(other))
    assert len(calls) > measured


def test_greedy_rows_under_the_measured_path_emit_target_ar_tokens(fresh, monkeypatch):
    """With nothing forced, the path the given seconds make fastest (not the build's first) runs every
    pass of target AR and of each drafting row, and the rows emit target AR's tokens."""
    built = fresh
    make, _ = given({p: 1e-3 for p in built} | {built[1]: 0.5e-3}, {t: 1e-3 for t in range(8)})
    monkeypatch.setattr(choice, "linear_timer", make)
    drafting_rows_are_target_ar("llama", built[1])


def test_a_forced_path_is_taken_unmeasured_and_named_forced(fresh, monkeypatch):
    """Forcing a path (scripts' ``--path``) times no path, only the forced one's many-row variants; the
    step runs it and the header says it was forced."""
    built = fresh
    make, calls = given({p: 1e-3 for p in built}, {t: 1e-3 for t in range(8)})
    monkeypatch.setattr(choice, "linear_timer", make)
    monkeypatch.setattr(bf16, "FORCED", built[-1])
    model = bfloat16()
    assert CStep(model).dims.weights == built[-1] and all(rows == choice.ROWS for *_, rows in calls)
    assert short_label(model) == f"C step, {bf16.NAMES[built[-1]]}, forced"


def test_a_race_run_beside_other_work_is_named_under_load_and_a_quiet_one_is_not():
    """Least samples resist a neighbour on some samples, not on all: a per-process race (never saved) whose window
    saw other processes' work past ``utils.load.BUSY`` carries the words, a quiet one none; its pick is untouched."""
    import kernels.ahead as ahead
    from utils.load import FixedMeter

    race = lambda: choice.Measured(2, choice.MEASURED, ((2, 1e-3), (1, 2e-3)))  # noqa: E731
    loud = choice.in_window(race, lambda: FixedMeter(1.2))
    assert loud.pick == 2 and loud.load == "raced under load (other processes used 1.20 cores)"
    assert choice.in_window(race, lambda: FixedMeter(0.05)).load == ""
    assert choice.in_window(lambda: choice.Measured(1, choice.ONLY), lambda: FixedMeter(1.2)).load == ""  # nothing raced
    none = choice.Measured(ahead.NONE, choice.MEASURED, ((ahead.NONE, 1e-3), (ahead.DEFAULT, 2e-3)))
    assert ahead._phrase(choice.in_window(lambda: none, lambda: FixedMeter(1.2))) == (
        "weights streamed without software prefetch by measurement, raced under load (other processes used 1.20 cores)")
    assert ahead._phrase(none) == "weights streamed without software prefetch by measurement"


def test_the_header_names_a_bfloat16_path_raced_under_load(fresh, monkeypatch):
    """The path's race in a loud window: the short label and the full words say so (the suite's own windows are fixed
    quiet by ``SPECDEC_OTHERS_CORES``, so this test gives the race its meter)."""
    from utils.load import FixedMeter

    built = fresh
    make, _ = given({p: 0.9e-3 for p in built} | {built[1]: 0.41e-3}, {t: 1e-3 for t in range(1, 64)})
    monkeypatch.setattr(choice, "linear_timer", make)
    monkeypatch.setattr(choice, "start_up_meter", lambda: FixedMeter(1.5))
    model = bfloat16()
    LeanRunner(model)(ids_for(40)[:, :30], 1)
    assert short_label(model) == f"C step, {bf16.NAMES[built[1]]} by measurement, raced under load"
    assert "raced under load (other processes used 1.50 cores)" in label(model)
