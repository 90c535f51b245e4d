"""The compiled step made ready (issue 65): key buckets instead of the whole capacity, the graphs the
programs' rows need built before any timed run and none during one, a fresh runner on the pool's
capacity (the divergence replay's ``KeyError: 1024``), a prompt longer than the prepared capacity,
and the artifacts kept between starts (a corrupt or foreign one is never loaded). Tiny float32 models
on CPU (inductor's default mode; CUDA graphs are not exercised here)."""
import json

import pytest
import torch

import kernels.step_artifacts as artifacts
import runners.step as step_module
import runners.step_graphs as step_graphs
from app.steps import drafter_widths, head_widths, ready, row_rows, start_widths, step_widths
from conftest import EOS_NEVER, PROMPT, llama
from configuration import RunConfig
from drafters import PromptLookupSpec
from runners import LeanRunner, RunnerConfig, StepRunner, compile_events, prepare_step
from sampling import autoregressive_generate, generate
from sampling.divergence import PassRecorder, classify_divergence, default_runner
from strategies import BY_KEY

STEP = RunnerConfig(forward="step")


def ids_for(length, seed=3):
    return torch.randint(96, (1, length), generator=torch.Generator().manual_seed(seed))


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def built_since(count):
    return [event[1:] for event in compile_events[count:]]


@pytest.mark.needs_cxx
def test_a_pass_attends_to_its_key_bucket_not_the_whole_capacity(monkeypatch):
    """Buckets of 16, 32, 64, 128 keys in a cache of 1024 slots: a decoding pass at position p runs the
    graph of the smallest bucket holding p + 1, and its logits are the lean runner's."""
    monkeypatch.setattr(step_graphs, "MIN_KEYS", 16)  # where ``key_bucket`` reads it
    model = llama(layers=1, window=512, seed=5).to(torch.float32)
    step_module.step_state(model).set_widths((1,))
    ids, step, lean = ids_for(120), StepRunner(model), LeanRunner(model)
    close(step(ids[:, :8], 8), lean(ids[:, :8], 8))  # the prompt: uncompiled, 8 keys
    count = len(compile_events)
    for length in range(9, 120):
        close(step(ids[:, :length], 1), lean(ids[:, :length], 1))
    assert step.cache.capacity == 1024
    assert built_since(count) == [(1, 16), (1, 32), (1, 64), (1, 128)]


def test_key_buckets_are_powers_of_two_within_the_capacity():
    assert [step_module.key_bucket(n, 2048) for n in (1, 256, 257, 600, 1025, 4000)] == [256, 256, 512, 1024, 2048, 2048]
    assert step_module.key_buckets(100, 700, 1024) == [256, 512, 1024]
    assert step_module.key_buckets(300, 300, 1024) == [512]


def test_each_row_needs_its_drafts_plus_one_and_target_ar_one():
    config = RunConfig(gamma=4).with_(pld_num_tokens=6, tree_size=12)
    assert row_rows(BY_KEY["target"], config) == 1
    assert row_rows(BY_KEY["ngram"], config) == 5  # at most gamma drafts
    assert row_rows(BY_KEY["pld"], config) == 7  # its own budget
    assert row_rows(BY_KEY["tree_ngram"], config) == 13  # a tree of 12 nodes and the last token
    rows = [(BY_KEY[key], config) for key in ("target", "ngram", "pld", "speculative")]
    assert step_widths(rows) == (1, 5, 7)
    assert drafter_widths(rows) == (1, 5) and drafter_widths(rows[:3]) == ()
    assert start_widths([4]) == (1, 5) and start_widths([2, "auto"]) == (1, 3, 9)


def test_gamma_auto_prepares_the_widths_its_policy_can_ask_for():
    """Under ``/gamma auto`` the calibrated policy drafts up to the longest measured pass less one (11 on
    12 measured rows), past ``gamma``: the target's and the drafter's widths hold those passes."""
    config = RunConfig(gamma=4).with_policy(auto=True, row_costs=(1.0,) * 12)
    rows = [(BY_KEY[key], config) for key in ("target", "ngram", "speculative")]
    assert row_rows(BY_KEY["ngram"], config) == 12 and row_rows(BY_KEY["target"], config) == 1
    assert step_widths(rows) == (1, 12) and drafter_widths(rows) == (1, 12)
    assert step_widths([(BY_KEY["ngram"], config.with_policy(auto=False))]) == (1, 5)


def test_gamma_auto_prepares_the_heads_catch_up_and_an_uncompiled_head_feed_is_a_fallback():
    """The head's side of ``/gamma auto``: an EAGLE row's catch-up feeds the head up to 12 rows, so ``ready``
    prepares that width for the head too; and once prepared, a head feed past every width (a 12-row
    catch-up on widths 1 and 8) runs uncompiled and counts as a fallback, where the head's prompt does not."""
    from eagle.head_step import HeadStepCache, head_steps
    from test_eagle_row import head_for

    config = RunConfig(gamma=4).with_policy(auto=True, row_costs=(1.0,) * 12)
    assert head_widths([(BY_KEY[key], config) for key in ("target", "eagle", "ngram")]) == (12,)
    assert head_widths([(BY_KEY["eagle"], config.with_policy(auto=False))]) == (5,)
    head = head_for(llama(layers=2, init=0.1, seed=5))
    steps = head_steps(head)
    steps.lazy = False  # prepared, with the head's own widths 1 and 8 and no graph built
    size, holder = head.config.hidden_size, HeadStepCache(head, 64)
    feed = lambda start, m: holder.decode(torch.zeros((1, m, size), dtype=head.fc.weight.dtype),
                                          torch.zeros((1, m, size), dtype=head.fc.weight.dtype), start)
    feed(0, 20)  # the prompt
    assert steps.fallbacks == 0
    feed(20, 12)
    assert steps.fallbacks == 1


def test_every_uncompiled_pass_a_graph_could_run_is_a_fallback_once_prepared_and_a_prompt_is_not():
    """Prepared (not lazy) with widths 1 and 4 and no graph built: a 12-row pass (``/gamma auto``'s widest,
    past every width) counts, as a 1-row pass does; the prompt and a pass wider than any graph do not."""
    model = llama(layers=1, window=512, seed=12)
    state = step_module.step_state(model)
    state.set_widths((1, 4))
    state.lazy = False
    runner, ids = StepRunner(model), ids_for(100)
    runner(ids[:, :10], 1)
    assert state.fallbacks == 0
    runner(ids[:, :22], 12)
    runner(ids[:, :23], 1)
    assert state.fallbacks == 2
    runner(ids[:, :23 + step_module.MAX_WIDTH + 1], 1)
    assert state.fallbacks == 2


@pytest.mark.needs_cxx
def test_ready_builds_what_the_rows_need_and_no_timed_run_builds_a_graph():
    """``app.steps.ready`` for target AR and prompt lookup (3 drafts: width 4) on one prompt; then both
    rows run, and neither a graph is built nor a pass falls back to the uncompiled step."""
    model = llama(layers=2, window=512, seed=6).to(torch.float32)
    config = RunConfig(gamma=4).with_(pld_num_tokens=3)
    rows = [(BY_KEY["target"], config), (BY_KEY["pld"], config)]
    lines = []
    seconds = ready(model, None, {"target": STEP, "drafter": STEP}, rows, len(PROMPT), len(PROMPT) + 30, lines.append)
    state = step_module.step_state(model)
    assert seconds > 0 and state.widths == (1, 4) and not state.lazy
    assert len(lines) == 2 and "graph 1 of 2, width 1" in lines[0] and "graph 2 of 2, width 4" in lines[1]
    count, fallbacks = len(compile_events), state.fallbacks
    common = dict(max_gen_len=30, eos_tokens_id=EOS_NEVER, use_cache=True, runner=STEP)
    reference = autoregressive_generate(PROMPT, model, **common)
    drafted = generate(PROMPT, model, PromptLookupSpec(num_pred_tokens=3), common)[0]
    assert (len(compile_events), state.fallbacks) == (count, fallbacks)
    assert drafted == reference == autoregressive_generate(PROMPT, model, **{**common, "runner": RunnerConfig()})
    assert ready(model, None, {"target": STEP, "drafter": STEP}, rows, len(PROMPT), len(PROMPT) + 30, lines.append) == 0.0


@pytest.mark.needs_cxx
def test_a_fresh_runner_after_the_pool_grew_takes_the_pools_capacity_and_its_graphs(monkeypatch):
    """Today's ``KeyError: 1024``: the pool prepared for long prompts (a larger capacity), then a fresh
    runner for a short sequence (the divergence classifier's replay) asked for a smaller cache no
    graph or slot range was made for. It now takes the pool's capacity and the prepared graphs."""
    monkeypatch.setattr(step_module, "MIN_CAPACITY", 64)
    model = llama(layers=1, window=512, seed=7).to(torch.float32)
    prepare_step(model, 200, widths=(1, 4))  # capacity 256
    state, count = step_module.step_state(model), len(compile_events)
    keeper = StepRunner(model)
    keeper._reserve(10)  # holds the pooled cache: the next runner makes one
    runner = StepRunner(model)
    ids = ids_for(20)
    close(runner(ids[:, :10], 1), LeanRunner(model)(ids[:, :10], 1))
    close(runner(ids[:, :11], 1), LeanRunner(model)(ids[:, :11], 1))
    assert runner.cache.capacity == state.capacity == 256 and len(compile_events) == count
    del runner, keeper
    recorder = PassRecorder()
    tokens = generate(PROMPT, model, PromptLookupSpec(num_pred_tokens=3),
                      dict(max_gen_len=12, eos_tokens_id=EOS_NEVER, use_cache=True, runner=STEP, streamer=recorder))[0]
    other = list(tokens)
    other[5] = (other[5] + 1) % 96  # a made-up divergence: the replay runs both ways on fresh runners
    found = classify_divergence(model, PROMPT, tokens, other, recorder.passes, lambda m: default_runner(m, STEP))
    assert found is not None and found.position == 5 and len(compile_events) == count


@pytest.mark.needs_cxx
def test_a_prompt_longer_than_the_prepared_capacity_gets_a_larger_one(monkeypatch):
    monkeypatch.setattr(step_module, "MIN_CAPACITY", 64)
    model = llama(layers=1, window=1024, seed=8).to(torch.float32)
    prepare_step(model, 40, widths=(1,))  # capacity 64
    prompt = ids_for(300)[0].tolist()
    common = dict(max_gen_len=8, eos_tokens_id=EOS_NEVER, use_cache=True)
    assert autoregressive_generate(prompt, model, runner=STEP, **common) == autoregressive_generate(prompt, model, **common)
    assert step_module.step_state(model).capacity == 512


@pytest.mark.needs_cxx
def test_artifacts_round_trip_and_a_corrupt_or_foreign_file_is_never_loaded(monkeypatch, tmp_path):
    monkeypatch.setattr(artifacts, "artifacts_dir", lambda: tmp_path)
    model = llama(layers=1, window=512, seed=9).to(torch.float32)
    key = artifacts.artifact_key(model, torch.float32, torch.device("cpu"))
    prepare_step(model, 40, widths=(1,))
    path = artifacts.artifact_path(key)
    if not path.exists():  # this process had built its graphs before: save what torch holds
        assert artifacts.save_artifacts(key, [(1, 256, ())]) == path
    payload, graphs, problem = artifacts.read_artifact(key)
    assert payload and (1, 256, ()) in graphs and problem == ""
    loaded = []
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: loaded.append(data) or object())  # torch answers a CacheInfo
    assert artifacts.load_artifacts(key)[0] and loaded == [payload]
    head, _, body = path.read_bytes().partition(b"\n")
    path.write_bytes(head + b"\n" + body[:-1] + bytes([body[-1] ^ 1]))  # one bit flipped
    assert artifacts.load_artifacts(key) == ([], "corrupt (its payload does not match its checksum)")
    line = json.loads(head)
    line["key"]["dtype"] = "torch.bfloat16"
    path.write_bytes(json.dumps(line).encode() + b"\n" + body)
    assert artifacts.load_artifacts(key)[1] == "made for another torch, device, model or dtype"
    path.write_bytes(b"garbage")
    assert artifacts.load_artifacts(key)[1] == "not a step artifact"
    assert len(loaded) == 1  # none of the three reached torch


@pytest.mark.needs_cxx
def test_regional_graphs_compile_one_layer_for_every_layer():
    """The default (``RunnerConfig.graphs``): a (width, keys) graph of a 4-layer model is one dynamo
    graph, the decoder layer's, shared by the four layers; "whole" would trace the four into one."""
    from torch._dynamo.utils import counters

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(10)  # a shape no other test compiles: dynamo's cache of decoder_layer is shared by every model
    config = LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).float().eval()
    graphs = counters["stats"]["unique_graphs"]
    prepare_step(model, 40, widths=(1,))
    assert step_module.step_state(model).mode == "regional"
    assert counters["stats"]["unique_graphs"] == graphs + 1
    ids = ids_for(30)
    close(StepRunner(model)(ids, 1), LeanRunner(model)(ids, 1))


def test_how_the_step_makes_graphs_is_a_setting_of_the_runs_configuration_not_an_environment_switch(monkeypatch):
    """``RunnerConfig.graphs`` (``--step-graphs``) reaches the model's state through ``make_runner``; a runner
    made without a choice keeps the state's; the environment variable that chose it before is not read."""
    from runners import make_runner

    monkeypatch.setenv("SPECDEC_STEP_GRAPHS", "whole")
    model = llama(layers=1, window=512, seed=13)
    assert RunnerConfig().graphs == "regional" and make_runner(model, config=STEP).state.mode == "regional"
    assert make_runner(model, config=STEP.with_(graphs="whole")).state.mode == "whole"
    assert StepRunner(model).state.mode == "whole"
    with pytest.raises(ValueError, match="graphs must be one of regional, whole"):
        RunnerConfig(graphs="everything")


@pytest.mark.needs_cxx
def test_a_drafter_model_runs_on_its_own_step_prepared_with_the_targets_and_greedy_stays_exact():
    """Speculative decoding with the target's first layer as the drafter, both on the step (CUDA's default
    for each): ``ready`` builds the drafter's widths (1 and gamma + 1) too, no pass builds a graph, and the
    tokens are target AR's."""
    from sampling import speculative_generate
    from utils.models import truncated_drafter

    model = llama(layers=2, window=512, seed=11)
    drafter = truncated_drafter(model, 1)
    config = RunConfig(gamma=3)
    rows = [(BY_KEY["target"], config), (BY_KEY["speculative"], config)]
    ready(model, drafter, {"target": STEP, "drafter": STEP}, rows, len(PROMPT), len(PROMPT) + 24, lambda text: None)
    assert step_module.step_state(drafter).widths == (1, 4) and not step_module.step_state(drafter).lazy
    count = len(compile_events)
    common = dict(max_gen_len=24, eos_tokens_id=EOS_NEVER, use_cache=True)
    drafted, _ = speculative_generate(PROMPT, drafter, model, gamma=3, runner=STEP, drafter_runner=STEP, **common)
    assert len(compile_events) == count
    assert drafted == autoregressive_generate(PROMPT, model, **common)
