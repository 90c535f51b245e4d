"""The compiled lean step (``runners.step.StepRunner`` over ``models.llama_step``): the lean runner's
logits at widths 1 and 4 (a padded pass included) and on tree passes, the same greedy tokens as the
lean runner and transformers' forward, no graph built after ``prepare_step`` (counted twice: our
``compile_events`` and dynamo's own graph counter), and which runner ``--compile`` picks on which device.
Tiny float32 models, widths 1 and 4 only, so the graphs build in seconds (on CPU: inductor's default
mode; CUDA graphs were not exercised here)."""
import pytest
import torch
from torch._dynamo.utils import counters

import runners.config as runner_config
import runners.step as step_module
from conftest import EOS_NEVER, PROMPT, gpt2, llama
from drafters import NGramTreeSpec, DraftContext, PromptLookupSpec
from ngram_assisted import NGramStorage
from runners import CompiledRunner, LeanRunner, RunnerConfig, StepRunner, compile_events, make_runner, prepare_step
from sampling import autoregressive_generate, generate

WIDTHS = (1, 4)
STEP = RunnerConfig(forward="step")


@pytest.fixture(scope="module")
def target():
    # float64: the lean runner compared with runs the torch forward, not the C step, which would release the
    # layers' own weights (kernels.one_copy) and give each layer a number dynamo specializes on
    model = llama(layers=2, window=512)
    prepare_step(model, 200, widths=WIDTHS)
    return model


def ids_for(length=80, seed=3):
    return torch.randint(96, (1, length), generator=torch.Generator().manual_seed(seed))


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def passes(runner, ids):
    """A prompt (eager step), 1-, 3- (padded to 4), 4- and 6-position passes (eager), rollbacks, two tree
    passes (4 rows: the width-4 graph; 7 rows: eager) and a kept branch; every pass's logits."""
    out = []
    for length, n, keep in ((12, 12, 12), (13, 1, 13), (16, 3, 15), (19, 4, 19), (25, 6, 22), (23, 1, 23)):
        out.append(runner(ids[:, :length], n))
        runner.rollback(keep)
    out.append(runner.tree_pass(ids, 24, [7, 8, 9], [-1, 0, 0]))  # feeds ids[23] and 3 nodes: 4 rows
    runner.keep_branch(24, [0, 2])
    out.append(runner(ids[:, :27], 1))
    out.append(runner.tree_pass(ids, 27, [1, 2, 3, 4, 5, 6], [-1, 0, 1, -1, 3, 3]))  # 7 rows: eager
    runner.keep_branch(27, [3, 5])
    out.append(runner(ids[:, :30], 1))
    return out


@pytest.mark.needs_cxx
def test_logits_close_to_the_lean_runner_at_widths_1_and_4_and_on_tree_passes(target):
    ids = ids_for()
    for step, lean in zip(passes(StepRunner(target), ids), passes(LeanRunner(target), ids)):
        assert step.shape == lean.shape
        close(step, lean)


@pytest.mark.needs_cxx
def test_hidden_states_equal_the_lean_runners(target):
    ids, step, lean = ids_for(), StepRunner(target), LeanRunner(target)
    for runner in (step, lean):
        runner.hidden_layers = (1, 0)
    for length, n in ((10, 10), (11, 1), (14, 3)):
        close(step(ids[:, :length], n), lean(ids[:, :length], n))
        assert step.hidden_start == lean.hidden_start
        close(step.hidden, lean.hidden)


@pytest.mark.needs_cxx
def test_greedy_tokens_equal_the_lean_runners_and_transformers_forward(target):
    common = dict(max_gen_len=30, eos_tokens_id=EOS_NEVER, use_cache=True)
    runs = {}
    for name, runner in (("step", STEP), ("lean", RunnerConfig()), ("transformers", RunnerConfig(forward="transformers"))):
        vocab = target.config.vocab_size
        runs[name] = (autoregressive_generate(PROMPT, target, runner=runner, **common),
                      generate(PROMPT, target, PromptLookupSpec(num_pred_tokens=3), {**common, "runner": runner})[0],
                      generate(PROMPT, target, PromptLookupSpec(num_pred_tokens=2), {**common, "runner": runner})[0],  # 3 rows: padded
                      generate(PROMPT, target, NGramTreeSpec(tree_size=3), {**common, "runner": runner},
                               DraftContext(storage=NGramStorage(2, vocab)))[0])
    assert runs["step"] == runs["lean"] == runs["transformers"]
    assert all(tokens == runs["step"][0] for tokens in runs["step"])


@pytest.mark.needs_cxx
def test_no_graph_is_built_after_preparation(target):
    """Decoding, padded verification, rollbacks, tree passes, kept branches, a second runner and whole
    generations, all at the prepared widths: neither counter moves. A pass asking for hidden states
    nobody prepared then runs uncompiled (counted as a fallback) and builds nothing; the same pass on a
    lazy state (a notebook's) builds one graph, and both counters see it (the check can fail)."""
    ids = ids_for()
    passes(StepRunner(target), ids)  # any first-use work outside the graphs
    events, graphs = len(compile_events), counters["stats"]["unique_graphs"]
    passes(StepRunner(target), ids)
    passes(StepRunner(target), ids_for(seed=4))
    generate(PROMPT, target, PromptLookupSpec(num_pred_tokens=3), dict(max_gen_len=20, eos_tokens_id=EOS_NEVER, use_cache=True,
                                                                       runner=STEP))
    assert (len(compile_events), counters["stats"]["unique_graphs"]) == (events, graphs)
    state, lean = step_module.step_state(target), LeanRunner(target)
    runner, fallbacks = StepRunner(target), state.fallbacks
    runner.hidden_layers = lean.hidden_layers = (1,)
    close(runner(ids[:, :2], 2), lean(ids[:, :2], 2))
    close(runner.hidden, lean.hidden)
    assert (len(compile_events), counters["stats"]["unique_graphs"], state.fallbacks) == (events, graphs, fallbacks + 1)
    del runner
    widths = state.widths
    state.lazy, state.widths = True, (1, 2, 4)  # a width nobody prepared, on a lazy state: built, and both counters see it
    try:
        runner = StepRunner(target)
        runner(ids[:, :2], 2)
        assert (len(compile_events), counters["stats"]["unique_graphs"]) == (events + 1, graphs + 1)
    finally:
        state.lazy, state.widths = False, widths


@pytest.mark.needs_cxx
def test_a_regrowth_mid_sequence_carries_the_cache_and_an_older_runner_keeps_its_own(monkeypatch):
    """Capacity 64 at first: a sequence past it moves to 128 (new graphs, counted: a notebook's lazy
    state builds what it meets), the cached positions carried; a runner still holding a 64-slot cache
    keeps decoding on it."""
    monkeypatch.setattr(step_module, "MIN_CAPACITY", 64)
    model = llama(layers=1, window=512, seed=2).to(torch.float32)
    step_module.step_state(model).set_widths((1,))
    ids, step, older, lean = ids_for(160), StepRunner(model), StepRunner(model), LeanRunner(model)
    close(older(ids[:, :10], 1), lean(ids[:, :10], 1))
    lean.rollback(0)
    events = len(compile_events)
    for length in (40, 41, 50, 59, 60, 70, 71, 90, 91):  # 1-row passes compiled, wider ones eager; 128 slots from 70
        close(step(ids[:, :length], 1), lean(ids[:, :length], 1))
    # two graphs: one for step's own 64-slot cache (older holds the prepared one), one at 128
    assert step.cache.capacity == 128 and len(compile_events) == events + 2
    lean.rollback(10)
    close(older(ids[:, :11], 1), lean(ids[:, :11], 1))
    assert older.cache.capacity == 64


@pytest.mark.needs_cxx
def test_bfloat16_steps_follow_the_lean_runner():
    model = llama(layers=2, window=512, seed=1).to(torch.bfloat16)
    prepare_step(model, 100, widths=(1,))
    ids, step, lean = ids_for(40), StepRunner(model), LeanRunner(model)
    for length, n in ((10, 10), (11, 1), (12, 1), (13, 1)):
        # the lean runner's passes are the C step's on CPU: bfloat16 weights, float32 arithmetic and logits
        torch.testing.assert_close(step(ids[:, :length], n), lean(ids[:, :length], n), rtol=2e-2, atol=2e-2, check_dtype=False)
    assert step.cache.layers[0].keys.dtype == torch.bfloat16


def test_the_step_is_the_default_on_cuda_for_the_llama_family_and_eager_keeps_the_eager_forward(monkeypatch):
    model = llama()
    compiled = RunnerConfig(compile=True)
    assert isinstance(make_runner(model, config=STEP), StepRunner)  # asked for: on any device
    assert isinstance(make_runner(model, config=compiled), CompiledRunner)  # CPU: transformers' compiled forward
    assert isinstance(make_runner(model), LeanRunner)  # CPU, no flag: the lean forward (the C step where it runs)
    assert not compiled.step_for(model) and "step" not in compiled.describe(model)
    with pytest.raises(ValueError, match="outside the Llama family"):
        make_runner(gpt2(), config=STEP)
    with pytest.raises(ValueError, match="eager"):
        RunnerConfig(eager=True, compile=True)
    monkeypatch.setattr(runner_config, "model_device", lambda m: torch.device("cuda"))
    default = RunnerConfig()
    for config in (default, compiled):  # with or without --compile: the step
        assert config.step_for(model) and config.compiled_for(model) and not config.lean_for(model)
        assert config.cache_for(model) == "static"
    assert "the default on CUDA for the Llama family; --eager keeps the eager forward" in default.describe(model)
    eager = RunnerConfig(eager=True)
    assert not eager.step_for(model) and not eager.compiled_for(model) and eager.lean_for(model)  # --eager: the lean forward
    assert not compiled.with_(forward="transformers").step_for(model)  # transformers' forward, compiled
    assert not RunnerConfig(forward="lean").step_for(model)
    assert not default.step_for(gpt2()) and not compiled.step_for(gpt2())  # outside the family: as before
