"""The automatic dtypes (``--dtype auto`` under ``--preset pair``, a float32 target's drafter): the model's
own one-position pass raced in float32 and bfloat16 (``measure.pass_dtype``, ``measure.timing.dtype_race``),
the rule from given seconds, the C step run in both dtypes (its calls counted), the copy not chosen
freed and the one chosen kept as loaded, the result reused on the next start, and every greedy row the
target's with either drafter dtype. Seconds are given (a pass still runs), never read from a clock."""
import copy
import weakref

import pytest
import torch

import measure
from app.pair import LoadOptions, load_pair
from conftest import EOS_NEVER, PROMPT, llama, save_tiny
from kernels import skinny
from kernels.c_step import CStep
from kernels.step_one import OnePass
from kernels.prepacking import plan
from measure import pass_dtype, timing
from measure.machine import last_level_cache
from measure.pass_dtype import CLEARLY_FASTER, MIN_ROUNDS, ROUNDS, choose, race, where_read
from runners.lean import LeanRunner
from sampling import autoregressive_generate, speculative_generate
from utils.dtype_copy import bfloat16_copy
from utils.logits_processor import GreedyProcessor
from utils.models import load_model

needs_step = pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel (the C step) is not built here")
QUIET = LoadOptions("cpu", dtype="float32", measure_dtype=True, calibrate=False, prepack="off", cache="auto")


def budget(seconds: float = 1e9) -> timing.Budget:
    return timing.Budget(seconds, clock=lambda: 0.0)


def test_bfloat16_only_where_its_median_pass_is_clearly_faster():
    def line(share: float) -> tuple:
        return choose(race([[0.040, 0.050, 0.040], [0.040 * share] * 3], ("C step", "C step")), budget(), "from memory")

    assert line(0.5)[0] == "bfloat16" and line(CLEARLY_FASTER)[0] == "bfloat16"
    assert line(CLEARLY_FASTER + 0.02)[0] == "float32" and line(1.3)[0] == "float32"
    chosen, said = line(0.5)
    assert said == ("bfloat16 by measurement: a one-position pass of the model (C step) took 20 ms in bfloat16, 40 ms in "
                    "float32 (0.50, clearly faster: at most 0.8; medians of 3 alternating rounds, weights read from memory)")
    assert "(0.82, not clearly faster: at most 0.8;" in line(0.82)[1]
    mixed = choose(race([[1.0] * 2, [0.5] * 2], ("C step", "torch forward")), budget(), "from memory")[1]
    assert "(float32 C step, bfloat16 torch forward)" in mixed


def test_a_budget_spent_before_enough_rounds_keeps_float32():
    assert race([[1.0] * (MIN_ROUNDS - 1), [0.1] * (MIN_ROUNDS - 1)], ("C step",) * 2) is None
    assert choose(None, budget(2.0), "from memory") == ("float32", "float32 (fallback: measurement over its 2 s budget)")


def test_a_model_whose_copies_fit_in_the_cache_is_said_to_be_timed_from_it(tmp_path):
    assert where_read(200 << 20, 100 << 20) == "from memory" and where_read(10 << 20, 0) == "from memory"
    assert where_read(18 << 20, 300 << 20) == "from cache (both copies, 18 MiB, fit in the 300 MiB last-level cache)"
    for index, (level, size) in enumerate(((1, "48K"), (2, "2048K"), (3, "105M"), (2, "bad"))):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "level").write_text(f"{level}\n")
        (tmp_path / f"index{index}" / "size").write_text(f"{size}\n")
    assert last_level_cache(tmp_path) == 105 << 20 and last_level_cache(tmp_path / "none") == 0


@needs_step
def test_the_race_runs_the_c_step_in_both_dtypes_alternately(monkeypatch):
    calls = []
    real = CStep.__call__

    def counted(self, *args, **kwargs):
        calls.append(_dtype(self.model()))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CStep, "__call__", counted)
    one = OnePass.one  # decoding's decided pass (``runners.lean_lane``): the same step's
    monkeypatch.setattr(OnePass, "one", lambda self, *args: calls.append(_dtype(self.step.model())) or one(self, *args))
    float32 = llama(layers=2, window=256).float()  # conftest's llama is float64
    bfloat16 = copy.deepcopy(float32).to(torch.bfloat16)
    seconds, paths = timing.dtype_race((float32, bfloat16), budget(), ROUNDS, context=16)
    assert [len(s) for s in seconds] == [ROUNDS, ROUNDS] and paths == ("C step", "C step")
    # each: its context, the untimed round, then the timed ones, float32 and bfloat16 in turn from the untimed round on
    assert calls == [torch.float32, torch.bfloat16] + [torch.float32, torch.bfloat16] * (1 + ROUNDS)


def _dtype(model) -> torch.dtype:
    return model.model.embed_tokens.weight.dtype


def fixed_seconds(monkeypatch, bfloat16_share: float) -> None:
    """Every timed pass runs; it reports 10 ms in float32, ``bfloat16_share`` of it in bfloat16."""
    real = timing.PassTimer.seconds

    def seconds(self, rows: int) -> float:
        real(self, rows)
        return 0.010 * (bfloat16_share if _dtype(self.model) == torch.bfloat16 else 1.0)

    monkeypatch.setattr(timing.PassTimer, "seconds", seconds)


def watched(monkeypatch) -> list:
    """Weak references to the two copies each ``measure.measured_dtype`` call races."""
    copies, real = [], measure.measured_dtype

    def measured(folder, float32, bfloat16, role, options):
        copies.append((role, weakref.ref(float32), weakref.ref(bfloat16)))
        return real(folder, float32, bfloat16, role, options)

    monkeypatch.setattr(measure, "measured_dtype", measured)
    return copies


@needs_step
@pytest.mark.parametrize("share, chosen", [(0.5, torch.bfloat16), (0.9, torch.float32)])
def test_the_drafter_keeps_the_copy_chosen_as_loaded_frees_the_other_and_the_output_stays_the_targets(
        tiny_models, monkeypatch, tmp_path, share, chosen):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr("measure.busy_note", lambda: "")  # an idle machine: a result saved is reused, never noisy
    fixed_seconds(monkeypatch, share)
    copies, said = watched(monkeypatch), []
    pair = load_pair(tiny_models["target"], tiny_models["drafter"], QUIET, say=lambda text, style="": said.append(text))
    [(role, float32, bfloat16)] = copies  # the float32 target given: only the drafter measured
    assert role == "drafter" and (float32() if chosen == torch.float32 else bfloat16()) is pair.drafter
    assert (bfloat16() if chosen == torch.float32 else float32()) is None  # the other copy freed
    assert _dtype(pair.drafter) == chosen and _dtype(pair.target) == torch.float32
    # the start gave it what it gives a loaded model: --prepack off's own layers, a bfloat16 model no plan (the C step)
    assert plan(pair.drafter) == (None if chosen == torch.bfloat16 else ("own",)) and plan(pair.target) == ("own",)
    fresh = load_model(tiny_models["drafter"], "cpu", str(chosen).replace("torch.", ""))[0]
    for (name, mine), (_, theirs) in zip(pair.drafter.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(mine, theirs), name  # as loaded: the race's released layers given back bit for bit
    line = pair.describe("drafter")
    assert f"by measurement: a one-position pass of the model (C step) took {10 * share:.3g} ms in bfloat16, 10 ms in float32" in line
    assert ("drafts in bfloat16 by measurement" in pair.summary("drafter")) == (chosen == torch.bfloat16)
    out, _ = speculative_generate(PROMPT, pair.drafter, pair.target, gamma=4, logits_processor=GreedyProcessor(), max_gen_len=24,
                                  eos_tokens_id=EOS_NEVER, use_cache=True)
    assert out == autoregressive_generate(PROMPT, pair.target, max_gen_len=24, eos_tokens_id=EOS_NEVER, use_cache=True)
    said.clear()
    again = load_pair(tiny_models["target"], tiny_models["drafter"], QUIET, say=lambda text, style="": said.append(text))
    assert len(copies) == 1 and _dtype(again.drafter) == chosen and "reused from" in again.describe("drafter")
    assert not any("bfloat16 copy" in text for text in said)  # a saved choice loads one copy


@needs_step
def test_the_targets_auto_dtype_is_its_own_pass_and_a_bfloat16_target_keeps_the_c_step(tiny_models, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    fixed_seconds(monkeypatch, 0.5)
    copies = watched(monkeypatch)
    pair = load_pair(tiny_models["target"], tiny_models["drafter"], LoadOptions("cpu", measure_dtype=True, calibrate=False),
                     say=lambda text, style="": None)
    assert [role for role, *_ in copies] == ["target"]  # a bfloat16 target's drafter takes its dtype, unmeasured
    assert _dtype(pair.target) == torch.bfloat16 == _dtype(pair.drafter) and copies[0][1]() is None
    assert pair.header_note().startswith(" · bfloat16 by measurement: a one-position pass of the model (C step) took 5 ms")
    runner = LeanRunner(pair.target)
    runner(torch.tensor([PROMPT]), 1)
    assert runner.step_passes == 1  # its passes take the C step, as a loaded bfloat16 model's (the race's route not kept)


def test_the_bfloat16_copy_is_what_a_bfloat16_load_gives_and_keeps_a_tied_table_tied(tmp_path):
    from test_pass_dtype_memory import shaped

    folder = save_tiny(tmp_path / "tied", shaped(64, 2, tie=True))
    float32, loaded = (load_model(folder, "cpu", dtype)[0] for dtype in ("float32", "bfloat16"))
    made = bfloat16_copy(float32)
    assert made.lm_head.weight is made.model.embed_tokens.weight and made.lm_head.weight.dtype == torch.bfloat16
    assert made.config.to_json_string(use_diff=False) == loaded.config.to_json_string(use_diff=False)  # the same keys saved
    assert made.state_dict().keys() == loaded.state_dict().keys()
    for name, tensor in made.state_dict().items():
        assert tensor.dtype == loaded.state_dict()[name].dtype and torch.equal(tensor, loaded.state_dict()[name]), name
    assert float32.model.embed_tokens.weight.dtype == torch.float32  # the float32 model untouched
