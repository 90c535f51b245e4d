"""The drafter's start-up cost is timed on the pass drafting runs (issue 71 item 5): its runner asked for the output
rows the run's ``--drafter-head`` gives it (``RunnerConfig.drafter_head``) before its context is fed, as a drafting
run asks before its prompt; a cost saved at another row count is measured again, one at the same count reused; the
line names the rows timed; the programs hand the flag's rows to the measurement; and greedy output after it is
target AR's. Pass times here are fake (by the rows the timer's runner computes): nothing asserts on a clock."""
import re

import pytest
import torch

from conftest import llama, perturbed_copy
from kernels import skinny
from measure import Options, startup, steps, timing
from measure.record import MEASURED, REMEMBERED
from runners import LeanRunner, RunnerConfig
from sampling import autoregressive_generate, speculative_generate

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]

VOCAB, ROWS = 512, 32
PROMPT = [5, 17, 33, 5, 17, 40, 2, 9, 5, 17, 33, 71, 300, 9]
EAGER = RunnerConfig()


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A private cache folder: the real one is never read or written."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))


@pytest.fixture(scope="module")
def models():
    """A float32 target and a drafter that agrees with it partly, both on the C step (the lean forward)."""
    target = llama(vocab=VOCAB, seed=1, init=0.3)
    return target.to(torch.float32), perturbed_copy(target, 0.05, seed=2).to(torch.float32)


@pytest.fixture
def asked(monkeypatch):
    """Every ``output_rows`` call on a lean runner: (count, positions it had cached then); and fake pass times: a
    pass of part rows 8 ms, a whole one 10 ms (a target's, or a drafter's of every row)."""
    calls = []
    real = LeanRunner.output_rows

    def spy(self, count):
        calls.append((count, self.cached))
        return real(self, count)

    monkeypatch.setattr(LeanRunner, "output_rows", spy)
    monkeypatch.setattr(timing.PassTimer, "seconds", lambda self, rows: 0.010 if self.rows is None else 0.008)
    return calls


def quiet(**options) -> Options:
    return Options(say=lambda text: None, **options)


def test_the_drafter_cost_asks_for_the_runs_rows_before_its_context_and_names_them(models, asked):
    """The drafter's timer asks its runner for the run's rows with nothing fed yet, its passes compute them (a cut
    pass timed: 0.8 here), and the line says what was timed; with every row, no rows are asked nor named."""
    target, drafter = models
    cut = steps.drafter_step(drafter, target, EAGER, EAGER, quiet(), ROWS)
    assert asked == [(ROWS, 0)] and cut.value == 0.8 and cut.source == MEASURED
    assert cut.line == "a drafter pass of 32 output rows costs 0.80 of a target pass"
    whole = steps.drafter_step(drafter, target, EAGER, EAGER, quiet())
    assert asked == [(ROWS, 0)] and whole.value == 1.0 and whole.line == "a drafter pass costs 1.00 of a target pass"


def test_a_cost_saved_at_another_row_count_is_measured_again_the_same_count_reused(models, asked, monkeypatch):
    """The saved record is keyed by the rows: the same count reuses it (its line still naming them), another count
    and every row are measured again."""
    target, drafter = models
    measured = []
    real = timing.drafting_cost
    monkeypatch.setattr(timing, "drafting_cost", lambda *a, **k: measured.append(k["drafter_runner"].drafter_head) or real(*a, **k))
    found = [steps.drafter_step(drafter, target, EAGER, EAGER, quiet(), head) for head in (ROWS, ROWS, 2 * ROWS, 0)]
    assert measured == [ROWS, 2 * ROWS, 0]
    again = found[1]
    assert again.source == REMEMBERED and again.value == found[0].value
    assert re.fullmatch(r"a drafter pass of 32 output rows costs 0\.80 of a target pass \(reused from [0-9: -]+\)", again.line)
    assert found[2].line.startswith("a drafter pass of 64 output rows costs") and found[3].value == 1.0


def test_the_start_up_record_times_the_drafting_rows_and_keeps_every_row_on_its_runner(asked):
    """``startup(..., drafter_head=)`` on a bfloat16 pair (the real pair's dtype: its kernels as loaded, the C step):
    the cost line printed after the header names the rows; the record's drafter runner is the drafter-alone row's
    (every row: ``RunConfig.drafting_runner`` adds the rows where it drafts)."""
    target = llama(vocab=VOCAB, seed=1, init=0.3)
    drafter = perturbed_copy(target, 0.05, seed=2).to(torch.bfloat16)
    measured = startup(target.to(torch.bfloat16), EAGER, quiet(row_costs=(1.0, 1.1)), drafter, EAGER, drafter_head=ROWS)
    assert " · a drafter pass of 32 output rows costs 0.80 of a target pass" in measured.lines()[0]
    assert measured.drafter.runner.drafter_head == 0 and (ROWS, 0) in asked


def test_greedy_output_after_the_measurement_is_target_ar(models):
    """The measurement's runner took the model's kept rows; a drafting run after it takes them back: greedy
    speculative decoding with the same rows emits target AR's tokens (real passes, nothing timed asserted)."""
    target, drafter = models
    _, rows = timing.drafting_cost(drafter, target, context=16, repeats=2, drafter_runner=EAGER.with_(drafter_head=ROWS))
    assert rows == ROWS  # its passes computed part of the rows
    ref = autoregressive_generate(PROMPT, target, 30, eos_tokens_id=[], use_cache=True, runner=EAGER)
    out, _ = speculative_generate(PROMPT, drafter, target, gamma=4, max_gen_len=30, eos_tokens_id=[], use_cache=True,
                                  runner=EAGER, drafter_runner=EAGER.with_(drafter_head=ROWS))
    assert out == ref


@pytest.mark.parametrize("flag, rows", [("1024", 1024), ("full", 0), ("auto", 0)])
def test_load_pair_hands_the_flags_rows_to_the_measurement(tiny_models, monkeypatch, flag, rows):
    """``LoadOptions.drafter_head`` (``--drafter-head``) reaches ``measure.startup`` as the rows ``build_settings``
    gives the drafting runner (``app.session.drafter_head``: auto cuts none of a 49,152-token vocabulary)."""
    import measure
    from app.pair import LoadOptions, load_pair

    seen = []

    class Stop(Exception):
        pass

    def spy(*args, **kwargs):
        seen.append(args[6] if len(args) > 6 else kwargs.get("drafter_head"))
        raise Stop

    monkeypatch.setattr(measure, "startup", spy)
    with pytest.raises(Stop):
        load_pair(tiny_models["target"], tiny_models["drafter"], LoadOptions("cpu", dtype="float32", drafter_head=flag),
                  say=lambda text, style="": None)
    assert seen == [rows]
