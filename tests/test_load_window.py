"""A start-up measurement taken while other processes worked is saved noisy (issue 71): each measurement runs in a
load window (``measure.steps.under_load``, ``Options.meter``), not only after the load average read before loading,
which lags a minute. Every meter here is a fake (``FixedMeter``) or the real ``LoadMeter`` over a fake ``/proc``:
nothing depends on the machine's load or a clock."""
import json

import pytest
import torch

from conftest import llama
from measure import Options, saved, steps, timing
from test_load import TICK, Clock, write_stat
from utils.load import OTHERS_ENV, FixedMeter, LoadMeter, start_up_meter

KEY = {"k": 1}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A private folder of measurements (the suite's cache keeps its built kernels: none is built again here)."""
    monkeypatch.setattr(saved, "measurements_dir", lambda: tmp_path / "measurements")
    return tmp_path / "measurements"


def options(cores: float, said=None, **given) -> Options:
    """Options whose every measurement's window says the other processes used ``cores``."""
    return Options(say=(said.append if said is not None else lambda text: None), meter=lambda: FixedMeter(cores), **given)


def counting():
    """A measurement that counts its calls: ``(calls, measure)``."""
    calls = []

    def measure():
        calls.append(1)
        return {"value": len(calls)}, False

    return calls, measure


def saved_record(cache, kind: str = "probe") -> dict:
    return json.loads(next(cache.glob(f"{kind}-*.json")).read_text())


def test_a_measurement_beside_1_5_other_cores_is_saved_noisy_and_measured_again_on_the_next_quiet_start(cache):
    calls, measure = counting()
    result, when, noisy = steps.remembered("probe", KEY, measure, options(1.5))
    assert noisy and when == "" and saved_record(cache)["noisy"] is True
    assert result["load"] == "measured under load: other processes used 1.50 cores"
    again = steps.remembered("probe", KEY, measure, options(0.0))  # a quiet start: measured again, now quiet
    assert len(calls) == 2 and again == ({"value": 2}, "", False) and saved_record(cache)["noisy"] is False
    assert steps.remembered("probe", KEY, measure, options(0.0))[1] and len(calls) == 2  # then reused, with its date


def test_a_measurement_under_0_1_other_cores_is_saved_quiet_and_reused(cache):
    calls, measure = counting()
    assert steps.remembered("probe", KEY, measure, options(0.09)) == ({"value": 1}, "", False)
    assert saved_record(cache)["noisy"] is False and "load" not in saved_record(cache)["result"]
    result, when, noisy = steps.remembered("probe", KEY, measure, options(0.09))
    assert len(calls) == 1 and result == {"value": 1} and when and not noisy


def test_a_busy_start_marks_its_measurement_noisy_however_quiet_its_window(cache):
    calls, measure = counting()
    assert steps.remembered("probe", KEY, measure, options(0.0, busy="the machine is busy"))[2] is True
    assert saved_record(cache)["noisy"] is True
    steps.remembered("probe", KEY, measure, options(0.0))
    assert len(calls) == 2  # the next quiet start measures it again


def test_the_say_line_and_the_findings_line_name_the_load_and_a_reused_one_keeps_it():
    model, said = llama(window=512), []
    found = steps.cache_step(model, "target", options(1.5, said, clock=lambda: 0.0))
    assert said[-1] == "measured under load: other processes used 1.50 cores; saved as noisy, a quiet start measures it again"
    assert found.noisy and "measured under load: other processes used 1.50 cores" in found.line
    reused = steps.cache_step(model, "target", options(0.0, busy="busy"))  # noisy: reused on a busy start only
    assert reused.source == "remembered" and reused.noisy
    assert "measured under load: other processes used 1.50 cores; reused from " in reused.line


def test_the_dtype_race_under_load_is_saved_noisy_and_named(tmp_path, monkeypatch):
    float32 = llama(window=64).float()
    bfloat16 = llama(window=64).to(torch.bfloat16)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(float32.config.to_json_string())
    monkeypatch.setattr(timing, "dtype_race", lambda models, budget, rounds: ([[0.010] * rounds, [0.008] * rounds], ("f32", "bf16")))
    said = []
    found = steps.dtype_step(tmp_path / "model", float32, bfloat16, "target", options(1.5, said, clock=lambda: 0.0))
    assert found.noisy and found.line.endswith("(measured under load: other processes used 1.50 cores)")
    assert said[-1].startswith("measured under load")
    assert steps.saved_dtype(tmp_path / "model", options(0.0)) is None  # a quiet start races again
    reused = steps.saved_dtype(tmp_path / "model", options(0.0, busy="busy"))
    assert reused.value == found.value and "measured under load: other processes used 1.50 cores; reused from" in reused.line


def test_the_real_meter_through_options_counts_another_process_during_the_measurement(tmp_path, cache):
    """``LoadMeter`` over a fake /proc: another program gains 15 CPU seconds over the measurement's 10 s."""
    proc, clock = tmp_path / "proc", Clock()
    write_stat(proc, 100, 1, 0, 0)
    write_stat(proc, 200, 1, 1000, 0)

    def measure():
        clock.now = 10.0
        write_stat(proc, 100, 1, 1000, 0)  # ours: never counted
        write_stat(proc, 200, 1, 2500, 0)
        return {"value": 1}, False

    meter = lambda: LoadMeter(proc, root=100, clock=clock, load=lambda: (0.5,), tick=TICK)  # noqa: E731
    assert steps.remembered("probe", KEY, measure, Options(meter=meter))[2] is True
    assert saved_record(cache)["result"]["load"] == "measured under load: other processes used 1.50 cores"


def test_the_start_up_meter_is_the_real_one_unless_the_environment_fixes_the_cores(monkeypatch):
    monkeypatch.delenv(OTHERS_ENV, raising=False)
    assert isinstance(start_up_meter(), LoadMeter) and Options().meter is start_up_meter
    monkeypatch.setenv(OTHERS_ENV, "1.5")
    assert start_up_meter().stop().others_cores == 1.5


def test_a_saved_load_that_is_not_words_is_left_out_of_the_line(cache):
    saved.save("probe", KEY, {"value": 1, "load": 7}, noisy=False)
    assert steps._source(saved.recall("probe", KEY)[0].result, "2026-12-01 04:00") == "reused from 2026-12-01 04:00"


@pytest.mark.parametrize("text", ["lots", "-1", "nan"])
def test_a_start_up_meter_variable_that_is_not_a_count_of_cores_is_refused_by_name(monkeypatch, text):
    monkeypatch.setenv(OTHERS_ENV, text)
    with pytest.raises(ValueError, match=OTHERS_ENV):
        start_up_meter()
