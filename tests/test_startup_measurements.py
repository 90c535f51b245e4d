"""Start-up measurements on a busy machine: budgets with a named fallback, progress, saved results
reused (unless --remeasure), keys, unreadable saved files, atomic writes, the load hint.
Every clock here is fake: nothing asserts on real time."""
import json
import re

import pytest
import torch

from conftest import llama
from sampling import calibration, startup
from utils import measurements


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
    monkeypatch.setattr(calibration._Timer, "seconds", lambda self, rows: 0.010 + 0.001 * (rows - 1))


def lines():
    said = []
    return said, said.append


def test_a_measurement_past_its_budget_falls_back_and_says_so(model):
    said, say = lines()
    cache, line = startup.startup_cache(model, clock=slow_clock(), say=say)
    assert line == "dynamic KV cache (fallback: measurement over its 3 s budget)"
    assert cache == "dynamic"
    assert said == ["Measuring the target's KV cache (static and dynamic, 7 rounds, budget 3 s) ..."]
    costs, note = startup.verification_costs(model, clock=slow_clock(), say=say)
    assert costs == () and note == "Verification costs not measured (fallback: measurement over its 5 s budget): constant draft length"
    assert said[-1] == "Measuring verification costs (1-12 positions, budget 5 s) ..."


def test_a_verification_curve_cut_short_keeps_the_positions_timed_and_extrapolates_the_rest(model, monkeypatch):
    fake_passes(monkeypatch)
    # 0.3 s a reading: the budget of 5 s is spent at the 17th check (4 before the context's passes of 32
    # positions, then one before each pass: position 1 warmed up and timed, 2 warmed up and timed, ... 6)
    costs, note = startup.verification_costs(model, clock=slow_clock(0.3), say=lambda text: None)
    assert note == "positions 1-6 measured, 7-12 extrapolated: measurement over its 5 s budget"
    assert costs[:6] == (1.0, 1.1, 1.2, 1.3, 1.4, 1.5) and costs[6:] == pytest.approx([1.6, 1.7, 1.8, 1.9, 2.0, 2.1])
    policy, _ = startup.startup_policy(model, remeasure=True, clock=slow_clock(0.3), say=lambda text: None)
    assert policy.row_costs == costs and policy.calibration.endswith("(positions 1-6 measured, 7-12 extrapolated: "
                                                                     "measurement over its 5 s budget)")


def test_a_drafter_cost_past_its_budget_falls_back_to_the_parameter_counts_ratio(model):
    drafter = llama(window=512, layers=1)
    cost, note = startup.draft_cost(drafter, model, clock=slow_clock(), say=lambda text: None)
    ratio = sum(p.numel() for p in drafter.parameters()) / sum(p.numel() for p in model.parameters())
    assert cost == round(ratio, 3) and note == "fallback: the parameter counts' ratio, measurement over its 2 s budget"


def test_a_saved_result_is_reused_with_its_date_unless_remeasure(model, monkeypatch):
    fake_passes(monkeypatch)
    measured = []
    real = calibration.measure_row_costs
    monkeypatch.setattr(calibration, "measure_row_costs", lambda *a, **k: measured.append(1) or real(*a, **k))
    quiet = dict(say=lambda text: None)
    first, note = startup.verification_costs(model, **quiet)
    assert measured == [1] and note == ""
    again, note = startup.verification_costs(model, **quiet)
    assert measured == [1] and again == first and re.fullmatch(r"reused from \d{4}-\d\d-\d\d \d\d:\d\d", note)
    _, note = startup.verification_costs(model, remeasure=True, **quiet)
    assert measured == [1, 1] and "reused" not in note
    policy, _ = startup.startup_policy(model, **quiet)
    assert re.search(r"Verification cost by positions 1\.\.12: .* \(reused from \d{4}-\d\d-\d\d \d\d:\d\d\)$", policy.calibration)


def test_a_reused_choice_is_applied_and_named_on_the_header(model):
    _, first = startup.startup_cache(model, clock=slow_clock(), say=lambda text: None)
    startup.startup_cache(model, clock=slow_clock(), say=lambda text: None, busy=True)  # the fallback is noisy: reused only when busy
    cache, second = startup.startup_cache(model, say=lambda text: None, busy=True)
    assert re.fullmatch(r"dynamic KV cache \(fallback: measurement over its 3 s budget; reused from [0-9: -]+\)", second)
    assert first != second and cache == "dynamic"


def test_a_noisy_saved_result_is_measured_again_on_a_quiet_machine(cache):
    calls = []
    measure = lambda: (calls.append(1) or {"value": len(calls)}, False)  # noqa: E731
    check = lambda result: None  # noqa: E731
    measurements.remembered("probe", {"k": 1}, measure, check, busy=True)
    assert measurements.remembered("probe", {"k": 1}, measure, check, busy=True)[0] == {"value": 1}
    assert measurements.remembered("probe", {"k": 1}, measure, check, busy=False) == ({"value": 2}, "")
    assert measurements.remembered("probe", {"k": 1}, measure, check, busy=True)[1].startswith("reused from")
    assert len(calls) == 2


def test_keys_differ_with_threads_dtype_and_model(model):
    threads = torch.get_num_threads()
    try:
        one = measurements.machine_key()
        torch.set_num_threads(threads + 1)
        more = measurements.machine_key()
    finally:
        torch.set_num_threads(threads)
    assert one != more and one["threads"] == threads
    assert set(one) >= {"cpu", "threads", "torch", "transformers"}
    identity = measurements.model_identity(model)
    as_float32 = measurements.model_identity(llama(window=512).to(torch.float32))
    other = measurements.model_identity(llama(window=512, layers=3))
    assert identity["dtype"] == "float64" and as_float32["dtype"] == "float32"
    paths = {measurements.saved_path("cache", {**one, "model": m}) for m in (identity, as_float32, other)}
    assert len(paths | {measurements.saved_path("cache", {**more, "model": identity})}) == 4


@pytest.mark.parametrize("content, reason", [
    ("{not json", "Expecting property name"),
    (json.dumps({"kind": "verification", "result": {"costs": "fast", "note": ""}}), "saved for other settings"),
    (json.dumps([1, 2, 3]), "not a saved measurement"),
])
def test_an_unreadable_saved_measurement_is_named_in_one_line_and_replaced(model, monkeypatch, cache, content, reason):
    fake_passes(monkeypatch)
    startup.verification_costs(model, say=lambda text: None)
    [path] = cache.glob("verification-*.json")
    path.write_text(content)
    said, say = lines()
    costs, note = startup.verification_costs(model, say=say)
    assert said[0].startswith(f"ignoring unreadable measurement {path}: {reason}") and said[0].endswith("; measuring again")
    assert len(said) == 2 and said[1].startswith("Measuring verification costs")
    assert json.loads(path.read_text())["result"]["costs"] == list(costs) and note == ""


def test_a_saved_measurement_of_the_wrong_shape_is_replaced(model, monkeypatch, cache):
    fake_passes(monkeypatch)
    startup.verification_costs(model, say=lambda text: None)
    [path] = cache.glob("verification-*.json")
    record = json.loads(path.read_text())
    record["result"]["costs"] = [1.0, 0.1]  # not plausible
    path.write_text(json.dumps(record))
    said, say = lines()
    startup.verification_costs(model, say=say)
    assert said[0] == f"ignoring unreadable measurement {path}: costs [1.0, 0.1] are not plausible; measuring again"


def test_a_saved_measurement_is_written_atomically_with_no_temporary_file_left(cache, monkeypatch):
    path = measurements.save("probe", {"k": 1}, {"value": 1}, noisy=False)
    assert [p.name for p in cache.iterdir()] == [path.name]
    assert json.loads(path.read_text())["result"] == {"value": 1}

    def failing(source, target):
        raise OSError("disk full")

    monkeypatch.setattr(measurements.os, "replace", failing)
    with pytest.raises(OSError):
        measurements.save("probe", {"k": 1}, {"value": 2}, noisy=False)
    assert [p.name for p in cache.iterdir()] == [path.name]  # the old file kept whole, the temporary one removed
    assert json.loads(path.read_text())["result"] == {"value": 1}


def test_the_load_hint_names_a_load_above_the_cpus():
    assert measurements.busy_note(lambda: (3.2, 1.0, 1.0), cpus=2) == "the machine is busy (load 3.2 on 2 CPUs): figures will be noisy"
    assert measurements.busy_note(lambda: (1.9, 5.0, 5.0), cpus=2) == ""


def test_progress_is_a_line_and_redraws_only_on_a_terminal(capsys):
    assert measurements.announce("Measuring x ...", tty=False) is None
    progress = measurements.announce("Measuring y ...", tty=True)
    progress(3, 12)
    progress(12, 12)
    err = capsys.readouterr().err
    assert err.startswith("Measuring x ...\nMeasuring y ...\n") and "3/12 passes" in err and err.endswith("\r\033[K")


def test_remeasure_is_a_flag_of_both_programs():
    import bench
    import infer

    assert infer.build_parser().parse_args(["--remeasure"]).remeasure
    assert bench.build_parser().parse_args(["--remeasure"]).remeasure


def kernel_passes(monkeypatch):
    """Deterministic pass times under each kernel option: own layers 6 ms + 5 ms a position, prepacked
    12 ms + 1 ms a position (own wins decoding, prepacked wins verification passes)."""
    from runners import prepacked

    monkeypatch.setattr(calibration._Timer, "seconds",
                        lambda self, rows: (0.012 + 0.001 * rows) if prepacked(self.model) else (0.006 + 0.005 * rows))


def test_the_kernel_measurement_is_saved_reused_and_gives_the_model_its_decoding_choice(monkeypatch):
    from runners import prepackable, prepacked

    model = llama(window=512).to(torch.float32)
    if not prepackable(model):
        pytest.skip("needs oneDNN (mkldnn)")
    kernel_passes(monkeypatch)
    choice, line = startup.startup_kernels(model, say=lambda text: None)
    assert choice.for_width(1) == calibration.OWN and choice.for_width(5) == calibration.PREPACKED
    assert not prepacked(model) and line.startswith("kernels by measurement: decoding 13.0 ms a pass prepacked, 11.0 ms own")
    policy, _ = startup.startup_policy(model, kernel_choice=choice, say=lambda text: None)
    assert policy.row_costs == choice.row_costs(calibration.PREPACKED) and "from the kernel measurement" in policy.calibration
    monkeypatch.setattr(calibration._Timer, "seconds", lambda self, rows: pytest.fail("measured again"))
    again, line = startup.startup_kernels(model, say=lambda text: None)
    assert again == choice and re.search(r"reused from \d{4}-\d\d-\d\d \d\d:\d\d\)$", line) and not prepacked(model)


def test_a_kernel_measurement_past_its_budget_keeps_the_models_own_linears(monkeypatch):
    from runners import prepackable, prepacked

    model = llama(window=512).to(torch.float32)
    if not prepackable(model):
        pytest.skip("needs oneDNN (mkldnn)")
    choice, line = startup.startup_kernels(model, clock=slow_clock(), say=lambda text: None)
    assert choice is None and not prepacked(model)
    assert line == "the model's own linears (fallback: measurement over its 5 s budget)"


def test_an_unreadable_saved_kernel_measurement_is_named_and_measured_again(cache, monkeypatch):
    from runners import prepackable

    model = llama(window=512).to(torch.float32)
    if not prepackable(model):
        pytest.skip("needs oneDNN (mkldnn)")
    kernel_passes(monkeypatch)
    startup.startup_kernels(model, say=lambda text: None)
    (saved,) = cache.glob("kernels-*.json")
    data = json.loads(saved.read_text())
    data["result"]["seconds"]["own"] = [1.0]  # fewer positions than the other option
    saved.write_text(json.dumps(data))
    said, say = lines()
    choice, _ = startup.startup_kernels(model, say=say)
    assert any(text.startswith(f"ignoring unreadable measurement {saved}") for text in said) and len(choice.seconds["own"]) == 12


def test_a_larger_model_gets_proportionally_larger_budgets_up_to_a_ceiling():
    small, tiny = llama(window=512), torch.nn.Linear(2, 2)
    assert startup.budget_scale(None) == startup.budget_scale(tiny) == 1.0  # never below the embedded model's
    big = torch.nn.Linear(1, 1)
    big.weight = torch.nn.Parameter(torch.empty(int(4 * startup.EMBEDDED_PARAMETERS), 1, device="meta"))
    assert startup.budget_scale(big) == pytest.approx(4.0, rel=1e-3)
    big.weight = torch.nn.Parameter(torch.empty(int(100 * startup.EMBEDDED_PARAMETERS), 1, device="meta"))
    assert startup.budget_scale(big) == startup.MAX_SCALE and startup.budget_scale(small) == 1.0
