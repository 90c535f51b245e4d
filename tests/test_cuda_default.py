"""On CUDA, never eager by default (issue 72 item 5): a model the compiled step cannot take runs
transformers' forward compiled over a static cache (``runners.compiled``) where its graphs are ready
within the first-answer limit, else eager with one line saying why; a model that cannot compile, and
the flags that keep the eager forward, say why too. The device decision is forced to CUDA on CPU (as
``tests/test_step_runner.py`` does); no graph is compiled here (a pass of the compiled runner is stubbed)."""
import functools
from types import SimpleNamespace

import pytest
import torch

import runners.compiled as compiled
import runners.config as runner_config
from app.header_lines import describe
from app.pair import LoadOptions, _runners
from conftest import VOCAB, gpt2, llama, t5
from runners import EAGER, CompiledRunner, KVCacheModel, RunnerConfig, StepRunner, make_runner
from runners.compiled import past_limit


@pytest.fixture
def cuda(monkeypatch):
    """The runner configuration's device decision forced to CUDA (the models stay on CPU)."""
    monkeypatch.setattr(runner_config, "model_device", lambda model: torch.device("cuda"))
    monkeypatch.setattr("app.steps.on_cuda", lambda model: True)


def stub_graphs(monkeypatch, seconds_a_call: float) -> None:
    """``prepare`` without compiling: each compiled pass returns zeros, and its clock advances
    ``seconds_a_call`` at every reading (no real clock is read)."""
    def run(self, ids, start, cache, layers=()):
        return torch.zeros(ids.shape[1], VOCAB), None

    ticks = iter(range(10_000))
    monkeypatch.setattr(compiled._Compiled, "run", run)
    monkeypatch.setattr(compiled, "prepare", functools.partial(compiled.prepare, clock=lambda: next(ticks) * seconds_a_call))


def load(model, said: list, **options) -> RunnerConfig:
    """The target's ``RunnerConfig`` as the programs choose it at start-up, each line said kept in ``said``."""
    return _runners(SimpleNamespace(target=model, drafter=None, compile_seconds={}), LoadOptions(**options),
                    lambda text, style="": said.append((text, style)))["target"]


def test_on_cuda_a_model_the_step_cannot_take_runs_transformers_forward_compiled_by_default(cuda):
    model = gpt2()
    assert EAGER.compiles_by_default(model) and EAGER.compiled_for(model) and not EAGER.step_for(model)
    assert isinstance(make_runner(model), CompiledRunner) and EAGER.cache_for(model) == "static"
    assert EAGER.describe(model).startswith("static KV cache · compiled (the default on CUDA for a model the step cannot take "
                                            "(GPT2LMHeadModel (gpt2) is outside the Llama family")
    assert isinstance(make_runner(llama()), StepRunner)  # the family keeps the step
    for config, why in ((RunnerConfig(eager=True), "--eager"), (RunnerConfig(forward="transformers"), "--forward transformers without --compile")):
        assert not config.compiled_for(model) and isinstance(make_runner(model, config=config), KVCacheModel)
        assert config.eager_reason(model) == why and f"· eager ({why})" in config.describe(model)
    assert isinstance(make_runner(model, config=RunnerConfig(compile=True)), CompiledRunner)  # asked for: no reason needed
    assert RunnerConfig(compile=True).compiled_reason(model) == ""


def test_off_cuda_the_default_is_unchanged():
    model = gpt2()
    assert not EAGER.compiles_by_default(model) and isinstance(make_runner(model), KVCacheModel)
    assert EAGER.eager_reason(model) == "" and EAGER.describe(model).endswith("KV cache · eager")


def test_a_model_whose_graphs_are_ready_within_the_first_answer_limit_runs_them(cuda, monkeypatch):
    stub_graphs(monkeypatch, 1.0)  # 2 s a graph: 6 graphs well within 120 s
    said, model = [], gpt2()
    config = load(model, said)
    assert config.compiled_for(model) and not config.eager and isinstance(make_runner(model, config=config), CompiledRunner)
    assert said[-1][0].startswith("Compiled the target (transformers' forward, CUDA's default for a model the step cannot take) in")
    assert [style for _, style in said] == ["dim", ""]  # what it compiles, then how long: nothing in red
    assert "the default on CUDA for a model the step cannot take" in describe(model, "gpt2", "none", runner=config)


def test_a_model_whose_graphs_would_not_be_ready_within_the_first_answer_limit_runs_eager_and_one_line_says_why(cuda, monkeypatch):
    stub_graphs(monkeypatch, 50.0)  # the first graph took 100 s: six would take about 600
    said, model = [], gpt2()
    config = load(model, said)
    assert config.eager and not config.compiled_for(model) and isinstance(make_runner(model, config=config), KVCacheModel)
    why = ("transformers' compiled forward not ready in time: its compiled graphs would be ready in about 600 s "
           "(1 of 6 built in 100 s), past the first-answer limit of 120 s; --compile waits for it")
    assert said[1:] == [(f"The target runs eager on CUDA: {why}", "red")] and config.why_eager == why  # after what it compiles
    assert f"· eager ({why})" in describe(model, "gpt2", "none", runner=config)
    said.clear()
    assert load(model, said, first_answer_limit=1000.0).compiled_for(model)  # a longer limit waits for them


def test_the_limit_is_judged_on_the_last_graphs_cost():
    assert past_limit(spent=30.0, last=10.0, built=2, total=6, limit=120.0) is None  # 30 + 4 x 10 = 70 s
    assert past_limit(spent=50.0, last=40.0, built=1, total=6, limit=120.0) == (
        "its compiled graphs would be ready in about 250 s (1 of 6 built in 50 s), past the first-answer limit of 120 s")


def test_on_cuda_a_model_that_cannot_compile_runs_eager_and_one_line_says_why(cuda):
    said, model = [], t5()
    config = load(model, said)
    assert not config.compiled_for(model) and said == [
        ("The target runs eager on CUDA: encoder-decoder models run eagerly (their cross-attention cache is not static)", "red")]
    said.clear()
    assert not load(model, said, eager=True).compiled_for(model) and said == []  # --eager asked for it: nothing to say
