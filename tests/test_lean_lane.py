"""The lean runner's decided one-position pass (``runners.lean_lane``): the same bits as the full pass that decides
again (``ON = False``), and never stale: each change between two passes that the full pass would decide on (a hook
registered, a cast, a plan's route, a regrown cache, a rollback, an edit of the output layer) takes the full pass
for that pass, with the full pass's result; and its steady pass makes no tensor but the logits it returns.
Tiny Llamas, float32 and bfloat16, tied (the released embedding) and untied (a plain one)."""
import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import runners.lean_lane as lean_lane
from conftest import PROMPT, VOCAB, llama
from families import FAMILY_MODELS
from kernels import skinny
from runners import LeanRunner

pytestmark = pytest.mark.skipif(not skinny.available()[0], reason="the lane runs the C step")
IDS = torch.tensor([PROMPT])


def tied(dtype: torch.dtype) -> LlamaForCausalLM:
    """A tiny Llama whose embedding is its output layer's weight (released with it: ``kernels.one_head``)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)
    return LlamaForCausalLM(config).to(dtype).eval()


MODELS = {"tied float32": lambda: tied(torch.float32), "tied bfloat16": lambda: tied(torch.bfloat16),
          "untied float32": lambda: llama(layers=2).to(torch.float32), "untied bfloat16": lambda: llama(layers=2).to(torch.bfloat16)}


def greedy(runner: LeanRunner, n: int, between=None) -> list:
    """``n`` greedy passes after ``PROMPT`` from an empty cache, ``between(i)`` called before pass ``i``; their logits."""
    runner.rollback(0)
    ids, out = IDS, []
    for i in range(n):
        if between is not None:
            between(i)
        last = runner(ids, 1)[0]
        out.append(last.clone())
        ids = torch.cat([ids, last.argmax().view(1, 1)], dim=1)
    return out


def both(make, n: int, event=None, at: int = 3):
    """The same passes with the lane on and off, each on its own copy of the model, ``event(model, runner)``
    before pass ``at``: (logits on, logits off, the runner with the lane on, how many passes the lane ran before ``at``)."""
    found = {}
    for on in (True, False):
        lean_lane.ON = on
        model = make()
        runner = LeanRunner(model)
        marks = {}

        def between(i, model=model, runner=runner, marks=marks):
            if i == at:
                marks["before"] = runner.lane.passes
                if event is not None:
                    event(model, runner)
            if i == at + 1:
                marks["after"] = runner.lane.passes
        try:
            found[on] = (greedy(runner, n, between), runner, marks)
        finally:
            lean_lane.ON = True
    (on, runner, marks), (off, _, _) = found[True], found[False]
    return on, off, runner, marks


@pytest.mark.parametrize("name", MODELS)
def test_the_lane_gives_the_full_passs_bits_and_runs_decodings_passes(name):
    on, off, runner, _ = both(MODELS[name], 8)
    assert all(torch.equal(a, b) for a, b in zip(on, off))
    # the prompt's pass (12 positions) records the lane; the step is taken within it (its layers swapped after the
    # hooks were read), so its first decoding pass decides again (a bfloat16 model's too: its cache, bfloat16, asks no step)
    assert runner.lane.passes == 6 and runner.step_passes == 8


def test_a_hook_registered_between_passes_fires_on_the_next_pass():
    fired = []

    def hook(model, runner):
        model.model.layers[1].mlp.register_forward_hook(lambda module, args, output: fired.append(1))

    on, off, runner, marks = both(MODELS["tied float32"], 6, hook)
    assert all(torch.equal(a, b) for a, b in zip(on, off))
    assert marks["after"] == marks["before"] and runner.hooked_passes == 3 and len(fired) == 6  # both runs' 3 passes


@pytest.mark.parametrize("event", ["cast", "route", "edit", "rollback", "regrow"])
def test_a_change_the_full_pass_decides_on_takes_the_full_pass_with_its_result(event):
    from kernels.prepacking import OWN, PrepackedLinear
    from utils.module_walk import first_module

    def change(model, runner):
        if event == "cast":  # a bfloat16 model's step reads float32 weights again: remade
            model.to(torch.float32)
        elif event == "route":  # the plan names another kernel for one position: the torch forward
            first_module(model, PrepackedLinear).route = (OWN,)
        elif event == "edit":  # the output layer's copy is the step's own: remade at the next pass
            with torch.no_grad():
                model.lm_head.weight.mul_(2.0)
        elif event == "rollback":
            runner.rollback(runner.cached - 2)
        elif event == "regrow":  # another cache, its slots copied: the step binds it again
            runner._reserve(runner.capacity + 1)

    make = MODELS["tied bfloat16"] if event == "cast" else MODELS["untied float32"]
    on, off, runner, marks = both(make, 7, change)
    assert all(torch.equal(a, b) for a, b in zip(on, off))
    if event in ("cast", "route"):
        assert marks["after"] == marks["before"]


def test_a_steady_pass_makes_no_tensor_but_its_logits():
    """Counted by torch's allocator (``utils.allocations``): the lane's pass allocates the ``[1, V]`` logits it
    returns (a caller may keep them) and nothing else: no position, embedding row, RoPE view or cast."""
    from utils.allocations import counted

    runner = LeanRunner(tied(torch.bfloat16))
    greedy(runner, 4)
    ids = torch.cat([IDS, torch.tensor([[5, 6, 7, 8]])], dim=1)
    runner.rollback(len(PROMPT) + 2)
    runner(ids[:, : len(PROMPT) + 3], 1)  # the step's scratch sized, the lane's row made
    passes = runner.lane.passes
    with counted() as held:
        logits = runner(ids, 1)
    made = [b - a for (_, a), (_, b) in zip([(0, 0)] + held.trace, held.trace) if b > a]
    assert runner.lane.passes == passes + 1 and made == [VOCAB * 4] and logits.shape == (1, VOCAB), made


@pytest.mark.parametrize("name", sorted(FAMILY_MODELS))
def test_each_familys_lane_gives_the_full_passs_bits(name):
    """Qwen3's q/k norms, OLMo2's norms after, SmolLM3's layers without RoPE, Phi-3's fused linears, the sliding
    windows run the lane; Granite's scaled embedding and Gemma 3's two RoPE tables take the full pass."""
    make = lambda: FAMILY_MODELS[name]().to(torch.float32)  # noqa: E731
    on, off, runner, _ = both(make, 6)
    assert all(torch.equal(a, b) for a, b in zip(on, off))
    assert runner.step_passes == 6 and runner.lane.passes == (0 if name in ("granite", "gemma3") else 4), runner.lane.passes


@pytest.mark.parametrize("name", ["tied float32", "untied bfloat16"])
def test_a_heads_hidden_states_ride_the_lane_with_the_full_passs_bits(name):
    """A learned head's row keeps hidden states at every pass (``hidden_layers``): its one-position passes run the
    lane too (a paused head's step costs target AR's pass), with the full pass's logits and hidden states, bit for bit."""
    found = {}
    for on in (True, False):
        lean_lane.ON = on
        runner = LeanRunner(MODELS[name]())
        runner.hidden_layers = (0, 1)
        hidden = []
        try:
            logits = greedy(runner, 6, lambda i: hidden.append(None if runner.hidden is None else runner.hidden.clone()))
        finally:
            lean_lane.ON = True
        hidden = hidden[1:] + [runner.hidden.clone()]  # each pass's, read before the next
        found[on] = (logits, hidden, runner.lane.passes, runner.hidden_start)
    (logits, hidden, passes, start), (logits_off, hidden_off, _, start_off) = found[True], found[False]
    assert all(torch.equal(a, b) for a, b in zip(logits, logits_off))
    assert all(torch.equal(a, b) for a, b in zip(hidden, hidden_off)) and hidden[-1].shape == (1, 2 * 32)
    assert passes == 4 and start == start_off == len(PROMPT) + 4  # either dtype: the step taken within the prompt's pass


def test_hooks_that_do_not_count_leave_the_lane_on_and_their_removal_decides_again():
    """The pass clock's hook (``runners.hooks.skippable``) is no user's: the lane runs beside it; removed, the next
    pass decides again (the dict it was in is shorter), then the lane runs on."""
    from runners.hooks import skippable

    handles = []

    def change(model, runner):
        handles.append(model.model.layers[0].register_forward_hook(skippable(lambda module, args, output: None)))

    on, off, runner, marks = both(MODELS["tied float32"], 6, change, at=2)
    assert all(torch.equal(a, b) for a, b in zip(on, off)) and runner.hooked_passes == 0
    assert runner.lane.passes == 3 and marks["after"] == marks["before"]  # the pass after the registration: in full
    passes = runner.lane.passes
    handles[0].remove()
    ids = torch.tensor([PROMPT + [3, 4, 5]])
    runner.rollback(len(PROMPT) + 1)
    runner(ids[:, : len(PROMPT) + 2], 1)  # the dict is shorter: decided again
    runner(ids, 1)
    assert runner.lane.passes == passes + 1


def test_a_step_let_go_is_freed_though_the_lane_ran_on_it():
    """State beside a model dies with it, by reference count alone (no collection): a runner's step let go (a first
    start's kernel measurement switching away from the skinny kernel, ``kernels.holding.drop_step``) frees it and its
    blocked copies, though the lane's key compared it and its decided call is kept on it (before: the key and the
    call's cycle held it, and the measurement 4x the weights)."""
    import gc
    import weakref

    from kernels.holding import drop_step

    runner = LeanRunner(llama(layers=2).to(torch.float32))
    greedy(runner, 4)
    assert runner.lane.passes > 0
    step = weakref.ref(runner.step)
    gc.disable()
    try:
        drop_step(runner)
        assert step() is None
    finally:
        gc.enable()
