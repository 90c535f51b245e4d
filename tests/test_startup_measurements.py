"""Start-up measurements on a busy machine: budgets with a named fallback, progress, saved results
reused (unless --remeasure), keys, unreadable saved files, atomic writes, the load hint, and the one
record the entry returns (``measure.startup`` -> ``Measured``). Every clock here is fake: nothing
asserts on real time."""
import json
import re

import pytest
import torch

from conftest import llama
from measure import ImplausibleCosts, Options, startup
from measure import budgets, machine, saved, steps, timing
from measure.costs import costs_line
from measure.kernels import OWN, PREPACKED
from measure.record import FIXED, GIVEN, MEASURED, REMEMBERED
from runners.config import EAGER, RunnerConfig
from sampling import DraftPolicy


# transformers' forward, whose KV cache kind is measured (the lean forward has one kind: static)
TRANSFORMERS = RunnerConfig(forward="transformers")


def slow_clock(step: float = 10.0):
    """A clock that advances ``step`` seconds at every reading: every budget is spent at its first check."""
    now = [0.0]

    def clock() -> float:
        now[0] += step
        return now[0]

    return clock


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A private cache folder: the real one is never read or written."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    return tmp_path / "measurements"


@pytest.fixture(scope="module")
def model():
    return llama(window=512)


def fake_passes(monkeypatch):
    """Deterministic pass times: one position 10 ms, each more 1 ms."""
    monkeypatch.setattr(timing.PassTimer, "seconds", lambda self, rows: 0.010 + 0.001 * (rows - 1))


def lines():
    said = []
    return said, said.append


def quiet(**options) -> Options:
    return Options(say=lambda text: None, **options)


def test_a_measurement_past_its_budget_falls_back_and_says_so(model):
    said, say = lines()
    measured = startup(model, TRANSFORMERS, Options(clock=slow_clock(), say=say))
    cache = measured.target.cache
    assert cache.line == "dynamic KV cache (fallback: measurement over its 3 s budget)"
    assert cache.value == measured.target.runner.cache == "dynamic" and cache.source == MEASURED and cache.noisy
    assert measured.target.kernels.source == FIXED  # float64: nothing to prepack, nothing measured
    rows = measured.costs.row_costs
    assert rows.value == () and rows.line == "Verification costs not measured (fallback: measurement over its 5 s budget): constant draft length"
    assert said == ["Measuring the target's KV cache (static and dynamic, 7 rounds, budget 3 s) ...",
                    "Measuring verification costs (1-12 positions, budget 5 s) ..."]
    assert measured.noisy() and measured.lines() == [rows.line]


def test_the_lean_forward_measures_no_cache_kind(model):
    """A Llama-family model runs the lean forward by default (``runners.lean``): one cache kind, nothing to measure."""
    said, say = lines()
    measured = startup(model, EAGER, Options(clock=slow_clock(), say=say))
    assert measured.target.cache is None and measured.notes("target") == {} and measured.target.runner == EAGER
    assert said == ["Measuring verification costs (1-12 positions, budget 5 s) ..."]


def test_a_verification_curve_cut_short_keeps_the_positions_timed_and_extrapolates_the_rest(model, monkeypatch):
    fake_passes(monkeypatch)
    # 0.3 s a reading: the budget of 5 s is spent at the 17th check (4 before the context's passes of 32
    # positions, then one before each pass: position 1 warmed up and timed, 2 warmed up and timed, ... 6)
    found = steps.verification_step(model, EAGER, quiet(clock=slow_clock(0.3)))
    costs = found.value
    assert found.line.endswith("(positions 1-6 measured, 7-12 extrapolated: measurement over its 5 s budget)")
    assert costs[:6] == (1.0, 1.1, 1.2, 1.3, 1.4, 1.5) and costs[6:] == pytest.approx([1.6, 1.7, 1.8, 1.9, 2.0, 2.1])
    measured = startup(model, EAGER, quiet(cache=None, remeasure=True, clock=slow_clock(0.3)))
    policy = DraftPolicy.calibrated(measured.costs)
    assert policy.row_costs == costs and policy.calibration.endswith("(positions 1-6 measured, 7-12 extrapolated: "
                                                                     "measurement over its 5 s budget)")


def test_a_drafter_cost_past_its_budget_falls_back_to_the_parameter_counts_ratio(model):
    drafter = llama(window=512, layers=1)
    found = steps.drafter_step(drafter, model, EAGER, EAGER, quiet(clock=slow_clock()))
    ratio = sum(p.numel() for p in drafter.parameters()) / sum(p.numel() for p in model.parameters())
    assert found.value == round(ratio, 3) and found.noisy
    assert found.line == (f"a drafter pass costs {found.value:.2f} of a target pass "
                          "(fallback: the parameter counts' ratio, measurement over its 2 s budget)")


def test_a_saved_result_is_reused_with_its_date_unless_remeasure(model, monkeypatch):
    fake_passes(monkeypatch)
    measured = []
    real = timing.measure_row_costs
    monkeypatch.setattr(timing, "measure_row_costs", lambda *a, **k: measured.append(1) or real(*a, **k))
    first = steps.verification_step(model, EAGER, quiet())
    assert measured == [1] and first.line == costs_line(first.value) and first.source == MEASURED
    again = steps.verification_step(model, EAGER, quiet())
    assert measured == [1] and again.value == first.value and again.source == REMEMBERED
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", again.when) and again.line.endswith(f"(reused from {again.when})")
    remeasured = steps.verification_step(model, EAGER, quiet(remeasure=True))
    assert measured == [1, 1] and "reused" not in remeasured.line
    policy = DraftPolicy.calibrated(startup(model, EAGER, quiet(cache=None)).costs)
    assert re.search(r"Verification cost by positions 1\.\.12: .* \(reused from \d{4}-\d\d-\d\d \d\d:\d\d\)$", policy.calibration)


def test_pass_costs_saved_on_another_kernel_build_are_measured_again(model, monkeypatch):
    """The verification costs and the drafter's cost are kept per build of the kernels' library (the C step's): a
    build whose paths cost a width otherwise is not weighed on an earlier build's costs; the same build reuses them."""
    fake_passes(monkeypatch)
    measured = []
    real_rows, real_draft = timing.measure_row_costs, timing.drafting_cost
    monkeypatch.setattr(timing, "measure_row_costs", lambda *a, **k: measured.append("rows") or real_rows(*a, **k))
    monkeypatch.setattr(timing, "drafting_cost", lambda *a, **k: measured.append("draft") or real_draft(*a, **k))
    drafter = llama(window=512, layers=1)
    for build in ("skinny-a.so", "skinny-a.so", "skinny-b.so"):
        monkeypatch.setattr(steps.skinny, "identity", lambda build=build: build)
        steps.verification_step(model, EAGER, quiet())
        steps.drafter_step(drafter, model, EAGER, EAGER, quiet())
    assert measured == ["rows", "draft", "rows", "draft"]


def test_a_reused_choice_is_applied_and_named_on_the_header(model):
    first = steps.cache_step(model, "target", quiet(clock=slow_clock()))
    steps.cache_step(model, "target", quiet(clock=slow_clock(), busy="busy"))  # the fallback is noisy: reused only when busy
    second = steps.cache_step(model, "target", quiet(busy="busy"))
    assert re.fullmatch(r"dynamic KV cache \(fallback: measurement over its 3 s budget; reused from [0-9: -]+\)", second.line)
    assert first.line != second.line and second.value == "dynamic" and second.source == REMEMBERED and second.noisy


def test_a_noisy_saved_result_is_measured_again_on_a_quiet_machine(cache):
    calls = []
    measure = lambda: (calls.append(1) or {"value": len(calls)}, False)  # noqa: E731
    steps.remembered("probe", {"k": 1}, measure, quiet(busy="busy"))
    assert steps.remembered("probe", {"k": 1}, measure, quiet(busy="busy"))[0] == {"value": 1}
    assert steps.remembered("probe", {"k": 1}, measure, quiet()) == ({"value": 2}, "", False)
    assert steps.remembered("probe", {"k": 1}, measure, quiet(busy="busy"))[1]  # reused: its date
    assert len(calls) == 2


def test_keys_differ_with_threads_dtype_and_model(model):
    threads = torch.get_num_threads()
    try:
        one = machine.machine_key()
        torch.set_num_threads(threads + 1)
        more = machine.machine_key()
    finally:
        torch.set_num_threads(threads)
    assert one != more and one["threads"] == threads
    assert set(one) >= {"cpu", "threads", "torch", "transformers"}
    identity = saved.model_identity(model)
    as_float32 = saved.model_identity(llama(window=512).to(torch.float32))
    other = saved.model_identity(llama(window=512, layers=3))
    assert identity["dtype"] == "float64" and as_float32["dtype"] == "float32"
    paths = {saved.saved_path("cache", {**one, "model": m}) for m in (identity, as_float32, other)}
    assert len(paths | {saved.saved_path("cache", {**more, "model": identity})}) == 4


@pytest.mark.parametrize("content, reason", [
    ("{not json", "Expecting property name"),
    (json.dumps({"kind": "verification", "result": {"costs": "fast", "note": ""}}), "saved for other settings"),
    (json.dumps([1, 2, 3]), "not a saved measurement"),
])
def test_an_unreadable_saved_measurement_is_named_in_one_line_and_replaced(model, monkeypatch, cache, content, reason):
    fake_passes(monkeypatch)
    steps.verification_step(model, EAGER, quiet())
    [path] = cache.glob("verification-*.json")
    path.write_text(content)
    said, say = lines()
    found = steps.verification_step(model, EAGER, Options(say=say))
    assert said[0].startswith(f"ignoring unreadable measurement {path}: {reason}") and said[0].endswith("; measuring again")
    assert len(said) == 2 and said[1].startswith("Measuring verification costs")
    assert json.loads(path.read_text())["result"]["costs"] == list(found.value) and found.line == costs_line(found.value)


def test_a_saved_measurement_of_the_wrong_shape_is_replaced(model, monkeypatch, cache):
    fake_passes(monkeypatch)
    steps.verification_step(model, EAGER, quiet())
    [path] = cache.glob("verification-*.json")
    record = json.loads(path.read_text())
    record["result"]["costs"] = [1.0, 0.1]  # not plausible
    path.write_text(json.dumps(record))
    said, say = lines()
    steps.verification_step(model, EAGER, Options(say=say))
    assert said[0] == f"ignoring unreadable measurement {path}: costs [1.0, 0.1] are not plausible; measuring again"


def test_a_saved_measurement_is_written_atomically_with_no_temporary_file_left(cache, monkeypatch):
    path = saved.save("probe", {"k": 1}, {"value": 1}, noisy=False)
    assert [p.name for p in cache.iterdir()] == [path.name]
    assert json.loads(path.read_text())["result"] == {"value": 1}

    def failing(source, target):
        raise OSError("disk full")

    monkeypatch.setattr("utils.files.os.replace", failing)
    with pytest.raises(OSError):
        saved.save("probe", {"k": 1}, {"value": 2}, noisy=False)
    assert [p.name for p in cache.iterdir()] == [path.name]  # the old file kept whole, the temporary one removed
    assert json.loads(path.read_text())["result"] == {"value": 1}


def test_the_load_hint_names_a_load_above_the_cpus():
    assert machine.busy_note(lambda: (3.2, 1.0, 1.0), cpus=2) == "the machine is busy (load 3.2 on 2 CPUs): figures will be noisy"
    assert machine.busy_note(lambda: (1.9, 5.0, 5.0), cpus=2) == ""


def test_progress_is_drawn_by_the_app_on_a_terminal_and_measure_prints_nothing(model, capsys):
    from app.pair import measure_options, progress_bar

    progress_bar(3, 12)
    progress_bar(12, 12)
    progress_bar(0, 0)  # the measurement is over
    err = capsys.readouterr().err
    assert "3/12 passes" in err and err.endswith("12/12 passes\r\033[K\r\033[K")
    assert measure_options().progress is None  # stderr is no terminal here
    said, say = lines()
    startup(model, TRANSFORMERS, Options(clock=slow_clock(), say=say))
    printed = capsys.readouterr()
    assert printed.out == printed.err == "" and len(said) == 2  # its lines went to say, and nowhere else


def test_remeasure_is_a_flag_of_both_programs():
    import bench
    import infer

    assert infer.build_parser().parse_args(["--remeasure"]).remeasure
    assert bench.build_parser().parse_args(["--remeasure"]).remeasure


def kernel_passes(monkeypatch):
    """Deterministic pass times under each kernel option: own layers 6 ms + 5 ms a position, prepacked
    12 ms + 1 ms a position (own wins decoding, prepacked wins verification passes), the skinny kernel
    (where it builds) 20 ms + 2 ms a position (never the faster)."""
    from kernels.prepacking import plan

    times = {None: (0.006, 0.005), ("own",): (0.006, 0.005), ("prepacked",): (0.012, 0.001), ("skinny",): (0.020, 0.002)}
    monkeypatch.setattr(timing.PassTimer, "seconds", lambda self, rows: times[plan(self.model)][0] + times[plan(self.model)][1] * rows)


def float32_model():
    from runners import prepackable

    model = llama(window=512).to(torch.float32)
    if not prepackable(model):
        pytest.skip("needs oneDNN (mkldnn)")
    return model


def test_the_kernel_measurement_is_saved_reused_and_gives_the_model_one_kernel_family(monkeypatch):
    """Own layers win one position (11 ms against 13), prepacked ones every verification pass: the
    plan is one family for every width, prepacked (13 + 18.5 against 11 + 38.5 ms), and its costs
    are prepacked's."""
    from measure.kernels import model_label

    model = float32_model()
    kernel_passes(monkeypatch)
    measured = startup(model, EAGER, quiet(cache=None))
    found = measured.target.kernels
    choice = found.value
    assert choice.for_width(1) == PREPACKED and choice.for_width(5) == PREPACKED and found.source == MEASURED
    plan = "prepacked"
    assert model_label(model) == plan and re.match(r"kernels by measurement: a one-position pass 11.0 ms own, 13.0 ms prepacked(, 22.0 ms skinny)?; "
                                                             rf"every pass on {re.escape(plan)} \(costs by positions 1..12: chosen 1.00 1.08 1.15 ", found.line)
    rows = measured.costs.row_costs  # the plan's: prepacked's 12 ms + 1 ms a position
    assert rows.value == choice.row_costs() == tuple(round((12 + r) / 13, 3) for r in range(1, 13))
    assert rows.line.endswith(f"({plan}, from the kernel measurement)")
    monkeypatch.setattr(timing.PassTimer, "seconds", lambda self, rows: pytest.fail("measured again"))
    again = steps.kernels_step(model, "target", EAGER, quiet())
    assert again.value == choice and re.search(r"reused from \d{4}-\d\d-\d\d \d\d:\d\d\)$", again.line) and model_label(model) == plan


def test_a_slower_machine_gets_every_round_in_a_budget_scaled_to_its_passes(monkeypatch):
    """Passes five times as slow as the budget was set for: a probe pass says what the rounds cost
    here, the budget grows to fit all three rounds (said in the line), and no round is cut."""
    model = float32_model()
    now = [0.0]
    times = {("own",): 0.20, ("prepacked",): 0.21, ("skinny",): 0.22}

    def seconds(self, rows):
        from kernels.prepacking import plan

        now[0] += times.get(plan(self.model), 0.20)
        return times.get(plan(self.model), 0.20)

    monkeypatch.setattr(timing.PassTimer, "seconds", seconds)
    budget = timing.Budget(10.0, clock=lambda: now[0])
    choice = timing.measure_kernels(model, budget=budget)
    assert not budget.stopped and budget.scaled.startswith("budget scaled from 10 s to ")
    assert budget.seconds > 10.0 and choice is not None and choice.widths() == 12


@pytest.mark.parametrize("need, rounds", [(3.9, 4), (4.1, 3), (40.0, 2)])
def test_a_machine_needing_over_the_most_scaled_budget_runs_the_full_rounds_that_fit(monkeypatch, need, rounds):
    """The budget a machine needs (its probe's estimate) is ``need`` times the budget: up to
    ``MOST_SCALED`` it gets every round (the warm-up and 3 timed); past it, as many full rounds as
    fit in ``MOST_SCALED`` times the budget, at least the warm-up and one timed, never a partial plan,
    and the line says so. No cliff between 3.9x and 4.1x."""
    from kernels.prepacking import plan

    model = float32_model()
    now, calls = [0.0], [0]

    def seconds(self, rows):
        calls[0] += 1
        now[0] += 0.2
        return 0.2 + 0.01 * (plan(self.model) == ("prepacked",))

    monkeypatch.setattr(timing.PassTimer, "seconds", seconds)
    n = len(timing.kernel_options())
    estimate = 0.2 * n * (1 + 1.3 * 12 * 4)  # the probe, then 1.3 x its cost for 12 widths, 4 rounds
    budget = timing.Budget(estimate / need, clock=lambda: now[0])
    choice = timing.measure_kernels(model, budget=budget)
    assert choice is not None and choice.widths() == 12 and not budget.stopped
    assert calls[0] == n * (1 + 12 * rounds)
    if need > timing.MOST_SCALED:
        assert f"at most {timing.MOST_SCALED:g}x: {rounds - 1} of 3 rounds" in budget.scaled


def test_a_kernel_measurement_past_its_budget_keeps_the_models_own_linears(monkeypatch):
    from kernels.prepacking import OWN, plan

    model = float32_model()
    found = steps.kernels_step(model, "target", EAGER, quiet(clock=slow_clock()))
    assert found.value is None and plan(model) == (OWN,) and found.noisy  # said, so that no pass runs the C step
    assert found.line == "the model's own linears (fallback: measurement over its 10 s budget)"


def test_an_unreadable_saved_kernel_measurement_is_named_and_measured_again(cache, monkeypatch):
    model = float32_model()
    kernel_passes(monkeypatch)
    steps.kernels_step(model, "target", EAGER, quiet())
    (saved_file,) = cache.glob("kernels-*.json")
    data = json.loads(saved_file.read_text())
    data["result"]["seconds"]["own"] = [1.0]  # fewer positions than the other option
    saved_file.write_text(json.dumps(data))
    said, say = lines()
    found = steps.kernels_step(model, "target", EAGER, Options(say=say))
    assert any(text.startswith(f"ignoring unreadable measurement {saved_file}") for text in said) and len(found.value.seconds["own"]) == 12


def test_a_larger_model_gets_proportionally_larger_budgets_up_to_a_ceiling():
    small, tiny = llama(window=512), torch.nn.Linear(2, 2)
    assert budgets.budget_scale(None) == budgets.budget_scale(tiny) == 1.0  # never below the embedded model's
    big = torch.nn.Linear(1, 1)
    big.weight = torch.nn.Parameter(torch.empty(int(4 * budgets.EMBEDDED_PARAMETERS), 1, device="meta"))
    assert budgets.budget_scale(big) == pytest.approx(4.0, rel=1e-3)
    big.weight = torch.nn.Parameter(torch.empty(int(100 * budgets.EMBEDDED_PARAMETERS), 1, device="meta"))
    assert budgets.budget_scale(big) == budgets.MAX_SCALE and budgets.budget_scale(small) == 1.0


def test_costs_given_by_a_flag_are_checked_before_anything_is_measured_and_named_given(model):
    said, say = lines()
    with pytest.raises(ImplausibleCosts, match="not plausible"):
        startup(model, EAGER, Options(row_costs=(1.0, 9.0), say=say))
    assert said == []
    measured = startup(model, EAGER, quiet(cache=None, row_costs=(1, 1.2, 1.1)))
    rows = measured.costs.row_costs
    assert rows.source == GIVEN and rows.value == (1.0, 1.2, 1.1)
    assert measured.lines() == ["Verification cost by positions 1..3: 1.00 1.20 1.10 (given, not measured)"]


def test_the_record_is_immutable_and_its_dict_is_json(model, monkeypatch):
    fake_passes(monkeypatch)
    drafter = llama(window=512, layers=1)
    measured = startup(model, TRANSFORMERS, quiet(), drafter=drafter)
    with pytest.raises(AttributeError):
        measured.costs = None
    record = json.loads(json.dumps(measured.as_dict()))
    assert set(record) == {"target", "drafter", "dtype", "row_costs", "draft_cost", "busy", "noisy"}
    assert record["target"]["cache"]["value"] in ("static", "dynamic") and record["drafter"]["runner"]["compile"] is False
    assert record["row_costs"]["source"] == MEASURED and record["draft_cost"]["value"] == measured.costs.draft_cost.value
    [line] = measured.lines()
    assert line.startswith("Verification cost by positions 1..12: 1.00 1.10") and " · a drafter pass costs " in line
    assert measured.notes("target") == {"cache": measured.target.cache.line} and measured.notes("drafter")["cache"]
    assert startup(model, EAGER, quiet(calibrate=False)).lines() == []


def test_a_model_moved_to_another_folder_keeps_its_saved_measurements():
    """The key names the folder's last component only (the suite links models into folders of its own)."""
    here, there = llama(window=512), llama(window=512)
    here.config._name_or_path, there.config._name_or_path = "/home/a/.cache/models/tiny", "/tmp/suite-x/models/tiny"
    assert saved.model_identity(here) == saved.model_identity(there)
    there.config._name_or_path = "/tmp/suite-x/models/other"
    assert saved.model_identity(here)["config"] != saved.model_identity(there)["config"]
