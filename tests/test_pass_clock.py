"""``bench.py --overhead`` times the forward passes where every runner makes them (``runners.clock``: the
runners ``make_runner`` hands out, whatever their insides), so a lean row's passes count as passes."""
from types import SimpleNamespace
from typing import List

import pytest
import torch

from app.bench.run import Bench, pass_times
from conftest import PROMPT, llama
from drafters import PromptLookupSpec
from runners import Runner, RunnerConfig, make_runner
from sampling import GenerationConfig, GenerationStats, generate


class Ticks:
    """A clock that moves one unit at each reading: a pass read at its start and end lasts exactly 1."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def pld_row(model, forward: str, stats: GenerationStats):
    """A prompt-lookup run of ``model`` with the runner ``forward`` picks; returns what ``Bench.run`` returns."""
    config = GenerationConfig(use_cache=True, max_gen_len=10, runner=RunnerConfig(forward=forward), stats=stats)

    def run(_config, prompt: List[int], observer=None, repeat: int = 0):
        generate(list(prompt), model, PromptLookupSpec(num_pred_tokens=3), config)
        return SimpleNamespace(seconds=1.0)  # today's overhead read the run's own clock; ignored now
    return run


def bench_of(model, run) -> SimpleNamespace:
    return SimpleNamespace(target=model, drafter=None, run=run)


def test_a_lean_rows_passes_are_counted_inside_forward_passes():
    """The lean forward never calls the top-level model, so hooks there saw none of its passes (share 1.0)."""
    model, stats = llama(), GenerationStats()
    shares = Bench.overhead(bench_of(model, pld_row(model, "lean", stats)), [SimpleNamespace(label="pld")], PROMPT)
    assert stats.target_forward_passes > 0 and 0.0 < shares["pld"] < 1.0


@pytest.mark.parametrize("forward", ["lean", "transformers"])
def test_each_pass_is_timed_once_on_an_injected_clock(forward):
    """Passes counted by the clock equal those the loop counted; with a clock that ticks once per reading
    every pass lasts one tick (a transformers pass, seen by the runner and the model's hooks, is not counted twice)."""
    model, stats, ticks = llama(), GenerationStats(), Ticks()
    timed = pass_times(bench_of(model, pld_row(model, forward, stats)), [SimpleNamespace(label="pld")], PROMPT, clock=ticks)
    passes = timed["pld"]
    assert not passes.failed and passes.passes == stats.target_forward_passes > 0
    assert passes.inside == passes.passes and 0 < passes.inside < passes.wall


class FakeRunner:
    """A ``Runner`` whose passes move the injected clock by known amounts, and whose bookkeeping does not."""

    def __init__(self, clock: Ticks):
        self.model, self.device, self.cached, self.forward_passes, self.cache_kind = None, torch.device("cpu"), 0, 0, "static"
        self.hidden_layers, self.hidden, self.hidden_start, self.clock = (), None, 0, clock

    def __call__(self, ids, n_last=1):
        self.clock.now += 5.0
        self.forward_passes += 1
        return torch.zeros(n_last, 4)

    def tree_pass(self, ids, cur, nodes, parents):
        self.clock.now += 7.0
        self.forward_passes += 1
        return torch.zeros(1 + len(nodes), 4)

    def rollback(self, length):
        self.clock.now += 100.0

    def keep_branch(self, cur, path):
        self.clock.now += 100.0


def test_chain_and_tree_passes_of_any_runner_are_timed_and_nothing_else():
    from runners.clock import PassClock, timed_runner, timing_passes

    ticks = Ticks()
    fake = FakeRunner(ticks)
    with timing_passes(PassClock(ticks)) as clock:
        runner = timed_runner(fake)
        assert isinstance(runner, Runner) and runner.cache_kind == "static"
        runner(torch.zeros(1, 3, dtype=torch.long), 2)
        runner.tree_pass(torch.zeros(1, 3, dtype=torch.long), 3, [1, 2], [-1, 0])
        runner.rollback(1)
        runner.keep_branch(3, [0])
        runner.hidden_layers = (1,)  # set on the runner itself, as the loops do
    assert fake.hidden_layers == (1,) and runner.forward_passes == 2 == clock.passes
    assert clock.seconds == (5 + 1) + (7 + 1)  # each pass's own time and the tick of its end reading
    assert timed_runner(fake) is fake  # no clock: the runner as it is


def test_make_runner_times_every_kind_it_hands_out(monkeypatch):
    """Compiled, lean, transformers' (static, dynamic, no cache) and llama.cpp's: one return point, one wrapper."""
    import runners
    import runners.llama_cpp
    from runners.clock import PassClock, TimedRunner, timing_passes

    model = llama()
    monkeypatch.setattr(runners.llama_cpp, "LlamaCppRunner", lambda gguf, model: FakeRunner(Ticks()))
    monkeypatch.setattr(runners, "CompiledRunner", lambda model: FakeRunner(Ticks()))
    monkeypatch.setattr(RunnerConfig, "compiled_for", lambda self, model: self.compile)
    configs = [RunnerConfig(), RunnerConfig(forward="transformers"), RunnerConfig(cache="dynamic"), RunnerConfig(compile=True),
               RunnerConfig(gguf="model.gguf")]
    with timing_passes(PassClock()):
        made = [make_runner(model, config=config) for config in configs] + [make_runner(model, use_cache=False)]
    assert all(type(runner) is TimedRunner for runner in made)
    assert all(type(make_runner(model, config=config)) is not TimedRunner for config in configs[:3])
