"""One copy of the weights (kernels/one_copy.py): once the C step binds, the decoder layers' own
weights are freed and the blocked copies are their one copy; every output stays what it was bit for
bit, and every path that reads the linears still works or refuses in one line."""
import copy

import pytest
import torch

from conftest import EOS_NEVER, PROMPT, llama
from drafters import PromptLookupSpec
from kernels import skinny
from kernels.one_copy import groups, held, released, weight_bytes
from kernels.prepacking import set_prepack
from measure.timing import measure_kernels
from runners import LeanRunner
from sampling import autoregressive_generate, generate
from utils.models import truncated_drafter

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]

LONG = torch.randint(96, (1, 100), generator=torch.Generator().manual_seed(1))  # past the step's 64 positions


def outputs(model) -> dict:
    """Target AR and a drafting row's greedy tokens (on the step), a long prompt's logits (the torch
    forward) and transformers' forward on it."""
    target = autoregressive_generate(PROMPT, model, 30, eos_tokens_id=EOS_NEVER, use_cache=True)
    lookup, _ = generate(PROMPT, model, PromptLookupSpec(), dict(max_gen_len=30, eos_tokens_id=EOS_NEVER, use_cache=True))
    return dict(target=target, lookup=lookup, long=LeanRunner(model)(LONG, 5), transformers=model(LONG).logits)


def model_and_step(dtype: torch.dtype = torch.float32):
    model = llama(layers=3).to(dtype)
    runner = LeanRunner(model)
    runner(LONG[:, :8], 1)
    return model, runner.step


def test_once_the_step_binds_the_layers_weights_are_held_once():
    """Counted by storage address: the model's parameters and every blocked copy the step reads come
    to the float32 weights plus the output layer's blocked copy (it stays twice), where keeping
    the layers' own weights would hold them twice."""
    fresh = llama(layers=3).to(torch.float32)
    weights = sum(t.numel() * t.element_size() for t in (*fresh.parameters(), *fresh.buffers()))
    model, step = model_and_step()
    head = step.head.untyped_storage().nbytes()
    assert all(released(m) for layer in model.model.layers for m in (layer.self_attn.q_proj, layer.mlp.down_proj))
    assert weight_bytes(model, *step.keep, step.head) <= weights + head
    with held(model):  # the own weights back beside the copies: what the process held before
        assert weight_bytes(model, *step.keep, step.head) >= 1.8 * weights


def test_a_bfloat16_model_on_the_step_holds_about_half_a_float32_models_bytes():
    """Counted by storage (``weight_bytes``: parameters, buffers, released copies and the step's own
    tensors; not RSS): a bfloat16 model's layers are released too, their bfloat16 blocks their one copy,
    so it holds about half a float32 model's bytes (keeping its own weights beside the copies, 0.88x)."""
    held_bytes, layers = {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        model, step = model_and_step(dtype)
        held_bytes[dtype] = weight_bytes(model, *step.keep, step.head)
        layers[dtype] = [x for layer in model.model.layers for group in groups(layer) for x in group]
    assert held_bytes[torch.bfloat16] <= 0.55 * held_bytes[torch.float32], held_bytes
    assert all(released(x) and x.blocks.dtype == dtype for dtype, found in layers.items() for x in found)


def bits(model) -> dict:
    return {k: v.view(torch.int16) if v.dtype == torch.bfloat16 else v for k, v in model.state_dict().items()}


def test_a_bfloat16_models_release_changes_no_weight_token_or_logit():
    """Its own weights given back (``held``: the bfloat16 blocks unpacked) are the loaded ones bit for
    bit; released again, greedy tokens, the step's logits and transformers' forward (its layers on the
    step's bfloat16 route either way) are unchanged bit for bit."""
    loaded = bits(llama(layers=3).to(torch.bfloat16))
    model, _ = model_and_step(torch.bfloat16)
    with held(model):
        assert not any(released(m) for m in model.modules())
        assert all(torch.equal(v, loaded[k]) for k, v in bits(model).items())
        before = outputs(model)
    after = outputs(model)
    assert released(model.model.layers[0].mlp.gate_proj) and model.model.layers[0].mlp.gate_proj.blocks.dtype == torch.bfloat16
    assert after["target"] == before["target"] and after["lookup"] == before["lookup"]
    assert torch.equal(after["long"], before["long"]) and torch.equal(after["transformers"], before["transformers"])
    assert all(torch.equal(v, loaded[k]) for k, v in bits(model).items())  # ``state_dict`` unblocks them alike


def test_greedy_tokens_and_logits_are_unchanged_bit_for_bit():
    model = llama(layers=3).to(torch.float32)
    with held(model):
        before = outputs(model)
        assert not any(released(m) for m in model.modules())
    after = outputs(model)
    assert any(released(m) for m in model.modules())
    assert after["target"] == before["target"] and after["lookup"] == before["lookup"]
    assert torch.equal(after["long"], before["long"]) and torch.equal(after["transformers"], before["transformers"])


def test_saving_reads_the_unblocked_weights(tmp_path):
    """``state_dict`` and ``save_pretrained``: the same keys and values as the own weights'."""
    model, _ = model_and_step()
    fresh = llama(layers=3).to(torch.float32)
    saved = model.state_dict()
    assert list(saved) == list(fresh.state_dict())
    assert all(torch.equal(saved[k], v) for k, v in fresh.state_dict().items())
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).to(torch.float32)
    assert torch.equal(loaded(LONG).logits, fresh(LONG).logits)


def test_loading_or_casting_a_released_model_gives_its_layers_their_weights_back():
    """A load or a real cast restores every layer first (tests/test_kernel_state.py has the values);
    a no-op move keeps them released."""
    model, _ = model_and_step()
    model.to(torch.float32)  # a no-op move
    assert released(model.model.layers[0].self_attn.q_proj)
    model.load_state_dict(llama(layers=3).to(torch.float32).state_dict())
    assert not any(released(m) for m in model.modules())
    model.to(torch.float64)
    assert all(p.dtype == torch.float64 for p in model.parameters())


def test_a_copy_the_own_linears_and_a_kernel_measurement_get_their_weights_back():
    """``deepcopy`` (a truncated drafter), the model's own linears again (``set_prepack(False)``) and
    the start-up measurement (its "own" timed on own weights) read real weights; tokens unchanged."""
    model, _ = model_and_step()
    reference = autoregressive_generate(PROMPT, model, 20, eos_tokens_id=EOS_NEVER, use_cache=True)
    drafter = truncated_drafter(model, 1)
    assert not any(released(m) for m in drafter.modules())
    assert autoregressive_generate(PROMPT, drafter, 5, eos_tokens_id=EOS_NEVER, use_cache=True)
    assert measure_kernels(model, max_rows=2, repeats=1) is not None
    set_prepack(model, False)
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert isinstance(model.model.layers[0].self_attn.q_proj.weight, torch.nn.Parameter)
    assert autoregressive_generate(PROMPT, model, 20, eos_tokens_id=EOS_NEVER, use_cache=True) == reference
    assert copy.deepcopy(model) is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_eagle_head_and_transformers_generate_run_on_a_released_target(dtype):
    """A head made from the released target (it reads its layers, unblocked, and its output rows)
    drafts with greedy target AR's tokens; transformers' ``generate`` runs the kernels it ran with the
    own weights kept (the same route: the same tokens). bfloat16 too (its head in bfloat16)."""
    from strategies import BY_KEY, RunConfig, RunContext, run_strategy
    from test_eagle_row import head_for

    target, _ = model_and_step(dtype)
    context = RunContext(target=target, tokenizer=None, head=head_for(target))
    config = RunConfig(max_gen_len=24, eos_tokens_id=EOS_NEVER)
    expected = run_strategy(BY_KEY["target"], PROMPT, config, context).tokens
    assert run_strategy(BY_KEY["eagle"], PROMPT, config, context).tokens == expected
    assert all(released(m) for m in (target.model.layers[0].self_attn.q_proj, target.model.layers[0].mlp.up_proj))
    ids = torch.tensor([PROMPT])
    after = target.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    with held(target):
        before = target.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(after, before)


@pytest.mark.needs_cxx
def test_a_model_compiled_with_transformers_forward_keeps_its_own_weights_and_is_never_released_under_its_graphs():
    """transformers' compiled passes (``CompiledRunner``) over a model the C step released: its own weights
    come back for good (``keep``), the graphs give the eager passes' logits, and a later C step (an eager
    row's) releases nothing under them (a release would rebuild the graphs inside a timed run)."""
    from kernels.c_step import CStep
    from runners import KVCacheModel
    from runners import compiled

    model, _ = model_and_step()
    assert released(model.model.layers[0].mlp.down_proj)
    ids = torch.tensor([PROMPT * 3])
    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(compiled, "BUCKETS", (4,))  # one graph: the 1- and 3-position passes padded into it
        fast, slow = compiled.CompiledRunner(model), KVCacheModel(model, True, cache="static")
        for length, rows in [(20, 1), (21, 1), (24, 3)]:
            torch.testing.assert_close(fast(ids[:, :length], rows), slow(ids[:, :length], rows), rtol=1e-5, atol=1e-6)
    assert not released(model.model.layers[0].mlp.down_proj)
    CStep(model)
    assert not released(model.model.layers[0].mlp.down_proj)


def test_a_row_on_the_own_layers_gets_the_own_weights_back(monkeypatch):
    """A row whose kernels are the model's own (transformers' compiled static peer) runs MKL over its
    own weights, not over ones unblocked per pass; the next C step frees them again."""
    import strategies
    from strategies import BY_KEY, RunConfig, RunContext, run_strategy

    target, _ = model_and_step()
    context, config = RunContext(target=target, tokenizer=None), RunConfig(max_gen_len=12, eos_tokens_id=EOS_NEVER)
    q = target.model.layers[0].self_attn.q_proj
    expected = run_strategy(BY_KEY["target"], PROMPT, config, context).tokens
    assert released(q)
    monkeypatch.setattr(strategies, "row_kernels", lambda strategy, config: strategies.OWN)
    assert run_strategy(BY_KEY["target"], PROMPT, config, context).tokens  # MKL: rounded apart from the step, no token asserted
    assert not released(q) and isinstance(q.weight, torch.nn.Parameter)
    monkeypatch.undo()
    assert run_strategy(BY_KEY["target"], PROMPT, config, context).tokens == expected and released(q)


def test_a_released_model_counts_and_keys_as_before():
    """Its parameter count (a saved measurement's key, the budgets' scale) counts the released weights."""
    from measure.saved import model_identity
    from kernels.one_copy import parameter_count

    fresh = llama(layers=3).to(torch.float32)
    model, _ = model_and_step()
    assert parameter_count(model) == sum(p.numel() for p in fresh.parameters())
    assert model_identity(model) == model_identity(fresh)


def test_the_step_takes_a_model_whose_layers_it_releases_while_one_group_and_the_head_fit_twice(monkeypatch):
    """The memory rule counts what a start holds twice at once: with the layers released (oneDNN can
    hold them) a group at a time and the output layer, not the whole model; without, every copy."""
    import kernels.c_step as c_step
    import kernels.memory_fits as memory_fits

    model = llama(layers=4).to(torch.float32)
    layers = model.model.layers
    group = max(sum(x.weight.numel() * 4 for x in g) for layer in layers for g in groups(layer))
    whole = sum(x.weight.numel() * 4 for layer in layers for g in groups(layer) for x in g)
    head = model.lm_head.weight.numel() * 4
    monkeypatch.setattr(memory_fits, "physical_memory", lambda: 4 * (group + head))  # a quarter: exactly one group and the head
    assert group + head < whole + head
    assert c_step.step_unsupported(model) is None
    monkeypatch.setattr(c_step, "can_prepack", lambda: False)
    assert "twice at once, over a quarter of this machine's memory" in c_step.step_unsupported(model)


def test_a_model_over_a_quarter_of_memory_is_still_released_onto_the_step_but_gets_no_onednn_copies(monkeypatch):
    """The wrappers the C step's route takes hold no second copy, so no size limit keeps a large model
    from being held once; a route that makes oneDNN's copies keeps the quarter-of-memory limit."""
    import kernels.memory_fits as memory_fits

    model = llama(layers=2).to(torch.float32)
    group = max(sum(x.weight.numel() * 4 for x in g) for layer in model.model.layers for g in groups(layer))
    # a quarter of memory: one group and the output layer (what the step holds twice at once), not the model
    monkeypatch.setattr(memory_fits, "physical_memory", lambda: 4 * (group + model.lm_head.weight.numel() * 4))
    assert not set_prepack(model, True)  # oneDNN's copies (the default route): refused
    runner = LeanRunner(model)
    runner(torch.tensor([PROMPT]), 1)
    assert runner.step and all(released(x) for layer in model.model.layers for g in groups(layer) for x in g)
