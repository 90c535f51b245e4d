"""Choosing the prompt pass's GEMM by measurement (``measure.prompt``, ``measure.steps.prompt_step``): the
fastest variant and chunk length from the timings (the defaults unless clearly beaten), a budget's
fallback, the plan saved, reused, given to the model and named in the header. Every timing here is
injected: nothing asserts on a clock."""
import json
import re

import pytest
import torch

from conftest import llama
from kernels import skinny
from kernels.prompt_gemm import CHUNKS, DEFAULT, DEFAULT_CHUNK, REFERENCE, PromptPlan, plan_of
from measure import Options, prompt, saved, startup, steps
from measure.record import MEASURED, REMEMBERED
from measure.timing import Budget
from runners.config import EAGER

pytestmark = [pytest.mark.needs_cc, pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A private cache folder: the real one is never read or written."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    return tmp_path / "measurements"


def fake(per_row: dict, chunk_cost: dict | None = None, calls: list | None = None):
    """``run(variant, rows)``: ``per_row[variant]`` seconds a position, times ``chunk_cost[rows]``; each call logged."""
    def run(tile: int, rows: int) -> float:
        if calls is not None:
            calls.append((tile, rows))
        return per_row[tile] * rows * (chunk_cost or {}).get(rows, 1.0)
    return run


def test_the_fastest_variant_then_the_fastest_chunk_on_it_are_chosen():
    calls = []
    run = fake({0: 1e-6, 1: 0.9e-6, 2: 0.7e-6, 3: 0.8e-6}, {128: 1.1, 512: 0.9}, calls)
    choice = prompt.measure_prompt(run, [0, 1, 2, 3], flops=2e6)
    assert choice.plan() == PromptPlan(2, 512)
    assert dict(choice.tiles) == pytest.approx({0: 1e-6, 1: 0.9e-6, 2: 0.7e-6, 3: 0.8e-6})
    assert [c for c, _ in choice.chunks] == sorted(CHUNKS)
    assert {tile for tile, rows in calls if rows != prompt.ROWS} == {2}  # the chunk lengths timed on the chosen variant
    assert len(calls) == 4 * (prompt.REPEATS + 1) + (len(CHUNKS) - 1) * (prompt.REPEATS + 1)  # warm-up and 3 rounds each


def test_the_defaults_stay_unless_another_is_clearly_faster():
    near = 1 - (1 - prompt.MARGIN) / 2  # within the margin: noise, not a win
    choice = prompt.measure_prompt(fake({0: 1e-6, 1: near * 1e-6, 2: 1.2e-6}, {128: near, 512: 1.05}), [0, 1, 2], flops=1.0)
    assert choice.plan() == PromptPlan(REFERENCE, DEFAULT_CHUNK)
    assert prompt.fastest({0: 1.0, 5: 0.5}, 0) == 5 and prompt.fastest({3: 2.0, 4: 1.0}, 0) == 4  # the default unmeasured: the fastest


def test_a_budget_spent_before_two_rounds_gives_no_choice():
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731

    def run(tile: int, rows: int) -> float:
        now[0] += 1.0
        return 1.0

    assert prompt.measure_prompt(run, [0, 1, 2], flops=1.0, budget=Budget(5.0, clock)) is None


def test_a_budget_cut_during_the_chunk_lengths_keeps_the_default_length():
    """Three variants' warm-up and three rounds (12 samples) fit; the chunk lengths' do not."""
    now = [0.0]

    def run(tile: int, rows: int) -> float:
        now[0] += 1.0
        return {0: 1.0, 1: 0.5, 2: 2.0}[tile] * rows / 256

    budget = Budget(12.5, lambda: now[0])
    choice = prompt.measure_prompt(run, [0, 1, 2], flops=1.0, budget=budget)
    assert budget.stopped and choice.plan() == PromptPlan(1, DEFAULT_CHUNK) and choice.chunks == ((DEFAULT_CHUNK, 0.5 / 256),)


def float32_on_the_step():
    """A float32 Llama whose passes run the C step as loaded (no kernel plan): the prompt GEMM is measured."""
    model = llama(window=512).to(torch.float32)
    assert prompt.measurable(model, EAGER.lean_for(model) and not EAGER.compiled_for(model))
    return model


def fake_layers(monkeypatch, per_row: dict, calls: list) -> None:
    """``measure.prompt.layer_seconds`` replaced: the injected seconds, 1 MFLOP a position."""
    monkeypatch.setattr(prompt, "layer_seconds", lambda step, library, threads: (fake(per_row, {512: 0.95}, calls), 1e6))


def skinny_wins(monkeypatch) -> None:
    """The kernel measurement's passes: the skinny kernel (the C step) fastest at every width."""
    from kernels.prepacking import plan
    from measure import timing

    monkeypatch.setattr(timing.PassTimer, "seconds", lambda self, rows: 0.001 * rows * (1 if plan(self.model) == ("skinny",) else 2))


def test_the_plan_is_saved_reused_given_to_the_model_and_named_in_the_header(monkeypatch):
    from app.header_lines import describe

    model, calls = float32_on_the_step(), []
    variants = skinny.library().skinny_tiles()
    per_row = {v: 1e-6 * (0.8 if v == variants - 1 else 1.0) for v in range(variants)}
    fake_layers(monkeypatch, per_row, calls)
    said = []
    found = steps.prompt_step(model, "target", EAGER, Options(say=said.append))
    assert found.value == {"tile": variants - 1, "chunk": 512} and found.source == MEASURED and not found.noisy
    assert plan_of(model) == PromptPlan(variants - 1, 512)
    assert said == ["Measuring the target's prompt GEMM (its many-row variants over 256 positions, then chunks of 128/256/512, "
                    "3 rounds, budget 3 s) ..."]
    assert re.match(r"prompt GEMM by measurement: tile \S+.*, chunks of 512 positions \(a layer's linears over 256 positions: "
                    r"\d+x\d+ \(decoding's\) 1000, .* GFLOP/s; chunks of 128/256/512: 1250/1250/1316 GFLOP/s\)$", found.line), found.line
    before = len(calls)
    model.__dict__.pop("_specdec_prompt_plan")
    again = steps.prompt_step(model, "target", EAGER, Options())
    assert len(calls) == before and again.source == REMEMBERED and again.line.endswith(f"; reused from {again.when})")
    assert plan_of(model) == PromptPlan(variants - 1, 512)  # the saved plan given back
    skinny_wins(monkeypatch)
    measured = startup(model, EAGER, Options(calibrate=False))
    assert measured.notes("target")["prompt"] == measured.target.prompt.line
    assert measured.target.prompt.line in describe(model, "probe", "none", measured.notes("target"), EAGER)
    assert json.loads(json.dumps(measured.as_dict()))["target"]["prompt"]["value"] == {"tile": variants - 1, "chunk": 512}


def test_choose_kernels_gives_the_model_the_prompt_plan_the_start_up_would(monkeypatch):
    """A notebook's or a script's ``choose_kernels`` (scripts/versus_openvino.py's first token) runs a long
    prompt on the plan the REPL's start-up measures, not on the default, and its line names it."""
    from measure import choose_kernels

    model, calls = float32_on_the_step(), []
    variants = skinny.library().skinny_tiles()
    fake_layers(monkeypatch, {v: 1e-6 * (0.8 if v == variants - 1 else 1.0) for v in range(variants)}, calls)
    skinny_wins(monkeypatch)
    _, line = choose_kernels(model)
    assert plan_of(model) == PromptPlan(variants - 1, 512) and calls
    assert re.search(r"; prompt GEMM by measurement: tile \S+.*, chunks of 512 positions \(", line), line


def test_a_budget_spent_at_once_gives_the_default_plan_and_says_so(monkeypatch):
    model, now = float32_on_the_step(), [0.0]

    def clock() -> float:
        now[0] += 10.0
        return now[0]

    fake_layers(monkeypatch, {v: 1e-6 for v in range(skinny.library().skinny_tiles())}, [])
    found = steps.prompt_step(model, "target", EAGER, Options(clock=clock))
    assert plan_of(model) == DEFAULT and found.noisy and found.value == {"tile": REFERENCE, "chunk": DEFAULT_CHUNK}
    assert found.line.startswith("prompt GEMM: tile ") and found.line.endswith("(fallback: measurement over its 3 s budget)")


def test_no_prompt_gemm_where_long_passes_do_not_run_the_float32_step(monkeypatch):
    monkeypatch.setattr(prompt, "measure_model", lambda *a, **k: pytest.fail("measured"))
    assert steps.prompt_step(llama(window=512), "target", EAGER, Options()) is None  # float64: the torch forward
    model = float32_on_the_step()
    from runners.config import RunnerConfig

    assert steps.prompt_step(model, "target", RunnerConfig(forward="transformers"), Options()) is None


def test_a_saved_prompt_measurement_of_the_wrong_shape_is_measured_again(monkeypatch, cache):
    model, calls = float32_on_the_step(), []
    fake_layers(monkeypatch, {v: 1e-6 for v in range(skinny.library().skinny_tiles())}, calls)
    steps.prompt_step(model, "target", EAGER, Options())
    (path,) = cache.glob("prompt-*.json")
    record = json.loads(path.read_text())
    record["result"]["tiles"] = [[0, -1.0]]
    path.write_text(json.dumps(record))
    said, before = [], len(calls)
    steps.prompt_step(model, "target", EAGER, Options(say=said.append))
    assert any(line.startswith(f"ignoring unreadable measurement {path}") for line in said) and len(calls) > before
    assert saved.recall("prompt", record["key"])[0] is not None
