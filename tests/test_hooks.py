"""Forward hooks (``runners.hooks``): a model with a forward hook or pre-hook on any of its modules (a
``PrepackedLinear``, its own ``nn.Linear``, a decoder layer, a norm), or a global module hook, runs
transformers' own forward for that pass on every runner with a fast path, so that the hook fires as
in plain transformers; the pass after the hook is removed runs the fast path again; the header names
the hooks. Tiny float32 Llama, a generation first so that the C step and its prepacked layers are live."""
import pytest
import torch
from torch.nn.modules.module import register_module_forward_hook

from conftest import EOS_NEVER, PROMPT, llama
from app.header_lines import describe
from kernels.one_copy import released
from runners import EAGER, CompiledRunner, KVCacheModel, LeanRunner, RunnerConfig, StepRunner, make_runner
from sampling import autoregressive_generate, speculative_generate
from utils.models import truncated_drafter


def skinny_built() -> bool:
    from kernels import skinny

    return skinny.available()[0]


@pytest.fixture
def model():
    """A float32 Llama of 3 layers that ran one generation (the C step made, its layers released)."""
    made = llama(layers=3).to(torch.float32)
    runner = make_runner(made)
    greedy(runner, 4)
    return made


IDS = torch.tensor([PROMPT])


def greedy(runner, n: int) -> list:
    """The logits ``[V]`` of ``n`` greedy passes after ``PROMPT`` on ``runner`` (from an empty cache)."""
    runner.rollback(0)
    ids, logits = IDS, []
    for _ in range(n):
        last = runner(ids, 1)[0]
        logits.append(last)
        ids = torch.cat([ids, last.argmax().view(1, 1)], dim=1)
    return logits


def reference(model, n: int) -> list:
    """The same from transformers' forward over the whole sequence (no cache, no runner)."""
    ids, logits = IDS, []
    with torch.no_grad():
        for _ in range(n):
            last = model(input_ids=ids).logits[0, -1]
            logits.append(last)
            ids = torch.cat([ids, last.argmax().view(1, 1)], dim=1)
    return logits


def zero(module, args, output):
    return torch.zeros_like(output)


def halve(module, args, output):
    return output * 0.5 if torch.is_tensor(output) else (output[0] * 0.5,) + tuple(output[1:])


def shift(module, args):
    return (args[0] + 1.0,)


HOOKS = {  # where a hook goes, and the hook
    "PrepackedLinear": (lambda m: m.model.layers[1].mlp.down_proj, "register_forward_hook", zero),
    "its own nn.Linear": (lambda m: getattr(m.model.layers[1].mlp.down_proj, "linear", [m.model.layers[1].mlp.down_proj])[0],
                          "register_forward_hook", zero),
    "decoder layer": (lambda m: m.model.layers[1], "register_forward_hook", halve),
    "norm pre-hook": (lambda m: m.model.layers[1].post_attention_layernorm, "register_forward_pre_hook", shift),
}


def close(a: list, b: list) -> None:
    torch.testing.assert_close(torch.stack(a), torch.stack(b), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("where", sorted(HOOKS))
def test_a_hook_fires_on_the_lean_runner_and_removing_it_brings_the_step_back(model, where):
    unhooked = reference(model, 4)
    find, register, hook = HOOKS[where]
    handle = getattr(find(model), register)(hook)
    try:
        runner = make_runner(model)
        assert type(runner) is LeanRunner
        hooked = greedy(runner, 4)
        close(hooked, reference(model, 4))  # what transformers computes with the hook
        assert (torch.stack(hooked) - torch.stack(unhooked)).abs().max() > 1e-3  # and the hook changed it
        assert runner.hooked_passes == 4 and runner.step_passes == 0
    finally:
        handle.remove()
    close(greedy(runner, 4), unhooked)  # the same runner, the hook gone: the fast path again
    assert runner.hooked_passes == 4 and (runner.step_passes == 4 or not skinny_built())


def test_a_global_forward_hook_fires_on_the_lean_runner(model):
    target = model.model.layers[1].mlp
    unhooked = reference(model, 3)
    handle = register_module_forward_hook(lambda module, args, output: output * 0 if module is target else None)
    try:
        runner = make_runner(model)
        hooked = greedy(runner, 3)
        close(hooked, reference(model, 3))
        assert (torch.stack(hooked) - torch.stack(unhooked)).abs().max() > 1e-3
        assert runner.hooked_passes == 3
        assert "a global forward hook" in EAGER.describe(model)
    finally:
        handle.remove()


def test_a_hook_added_mid_generation_is_seen_at_the_next_pass(model):
    runner = make_runner(model)
    greedy(runner, 2)
    before = runner.step_passes
    calls = []
    handle = model.model.layers[0].register_forward_hook(lambda *args: calls.append(1))
    try:
        runner(torch.cat([IDS, torch.tensor([[3, 4]])], dim=1), 1)
    finally:
        handle.remove()
    assert calls == [1] and runner.step_passes == before


def test_a_hook_on_a_module_put_in_after_the_first_pass_is_seen(model):
    import copy

    runner = make_runner(model)
    greedy(runner, 1)
    norm = copy.deepcopy(model.model.norm)
    norm.register_forward_pre_hook(shift)
    before, model.model.norm = model.model.norm, norm
    try:
        close(greedy(runner, 2), reference(model, 2))
        assert runner.hooked_passes == 2
    finally:
        model.model.norm = before


def test_the_header_names_the_hooks(model):
    plain = EAGER.describe(model)
    handle = model.model.layers[1].mlp.down_proj.register_forward_hook(zero)
    pre = model.model.norm.register_forward_pre_hook(shift)
    try:
        text = EAGER.describe(model)
        step, line = RunnerConfig(forward="step").describe(model), describe(model, "tiny", "none")
    finally:
        handle.remove()
        pre.remove()
    assert "transformers' forward (the model has forward hooks: model.layers.1.mlp.down_proj, model.norm" in text
    assert "lean" not in text and "hooks" not in plain and EAGER.describe(model) == plain
    assert step == text and line.endswith(text)  # the compiled step's header, and the programs' line


def test_greedy_drafting_under_a_hook_emits_greedy_ar_under_the_same_hook(model):
    drafter = truncated_drafter(model, 1)
    handle = model.model.layers[2].mlp.down_proj.register_forward_hook(halve)
    try:
        ar = autoregressive_generate(PROMPT, model, 8, eos_tokens_id=EOS_NEVER, use_cache=True)
        out, _ = speculative_generate(PROMPT, drafter, model, gamma=3, max_gen_len=8, eos_tokens_id=EOS_NEVER, use_cache=True)
        plain = [int(x.argmax()) for x in reference(model, 8)]
    finally:
        handle.remove()
    assert out == ar == plain


@pytest.mark.parametrize("make", [StepRunner, CompiledRunner])
def test_the_compiled_runners_run_transformers_forward_under_a_hook(make):
    """No graph is built while the model is hooked: each pass runs transformers' own forward."""
    model = llama(layers=2).to(torch.float32)
    handle = model.model.layers[0].mlp.down_proj.register_forward_hook(zero)
    try:
        runner = make(model)
        close(greedy(runner, 3), reference(model, 3))
        assert runner.hooked_passes == 3
    finally:
        handle.remove()


TREE = dict(nodes=[7, 8, 9, 10, 11], parents=[-1, 0, 0, 1, -1])


@pytest.mark.parametrize("make", [LeanRunner, StepRunner])
def test_tree_passes_and_hidden_states_under_a_hook_are_transformers(model, make):
    """A hooked tree pass, its kept branch and its hidden states: what ``KVCacheModel`` (transformers'
    forward, the same hook) gives."""
    ids = torch.randint(96, (1, 30), generator=torch.Generator().manual_seed(0))
    handle = model.model.layers[1].register_forward_hook(halve)
    try:
        ours, own = make(model), KVCacheModel(model, cache="static")
        for runner in (ours, own):
            runner.hidden_layers = (0, 2)
            runner(ids[:, :15], 1)
        torch.testing.assert_close(ours.tree_pass(ids, 18, **TREE), own.tree_pass(ids, 18, **TREE), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours.hidden, own.hidden, rtol=1e-4, atol=1e-5)
        for runner in (ours, own):
            runner.keep_branch(18, [0, 1, 3])
        kept = torch.cat([ids[:, :18], torch.tensor([[7, 8, 10, 4, 5]])], dim=1)
        torch.testing.assert_close(ours(kept, 2), own(kept, 2), rtol=1e-4, atol=1e-5)
        assert ours.hooked_passes == 3
    finally:
        handle.remove()


@pytest.mark.parametrize("make, fast", [(StepRunner, "chain"), (CompiledRunner, "run")])
def test_the_compiled_runners_take_their_graphs_again_once_the_hook_is_gone(make, fast, monkeypatch):
    """The pass after the hook is removed is the runner's compiled one (stubbed here: no graph is built)."""
    model = llama(layers=2).to(torch.float32)
    handle = model.model.norm.register_forward_pre_hook(shift)
    runner = make(model)
    calls = []
    monkeypatch.setattr(runner.state, fast, lambda *args: calls.append(1) or (torch.zeros(1, 96), None))
    runner(IDS, 1)
    handle.remove()
    runner(torch.cat([IDS, torch.tensor([[3]])], dim=1), 1)
    assert runner.hooked_passes == 1 and calls == [1]


def test_a_hooked_eagle_head_drafts_on_the_torch_step_and_its_hooks_fire(monkeypatch):
    """Hooks on the head's MLP and final norm (no linear layer: the C head step took them before): the C head step and the compiled head step give way to
    the torch step (the hooks fire), and the C step runs again once they are gone."""
    from types import SimpleNamespace

    import kernels.head_step as head_step
    from drafters.eagle import EagleDrafter
    from eagle.head import HeadCache
    from eagle.head_step import HeadStepCache
    from test_head_step import random_head, torch_step

    head = random_head()
    ids, features = torch.arange(6), torch.randn(6, 3 * 48, generator=torch.Generator().manual_seed(0))
    calls = []
    real = head_step.HeadStep.__call__
    monkeypatch.setattr(head_step.HeadStep, "__call__", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    handles = [head.layers[0].mlp.register_forward_hook(zero), head.norm.register_forward_pre_hook(shift)]
    try:
        hooked = head.draft_step(HeadCache(head, 8, "cpu", torch.float32), ids, 0, features=features)[1]
        torch.testing.assert_close(hooked, torch_step(head, HeadCache(head, 8, "cpu", torch.float32), ids, 0, features=features)[1])
        assert "the head has forward hooks: layers.0.mlp, norm" in head.step_kind()
        holder = HeadStepCache(head, 16)  # the compiled head step's cache: no graph is built while hooked
        drafted = EagleDrafter._draft_step(SimpleNamespace(cache=holder, head=head), ids, 0, features=features)[1]
        torch.testing.assert_close(drafted, hooked)
    finally:
        for handle in handles:
            handle.remove()
    assert calls == [] and "hooks" not in head.step_kind()
    plain = head.draft_step(HeadCache(head, 8, "cpu", torch.float32), ids, 0, features=features)[1]
    assert (calls == [1] or not skinny_built()) and (plain - hooked).abs().max() > 1e-3


def test_the_pass_clocks_hooks_leave_the_fast_path_on(model):
    """``bench.py --overhead`` times transformers' generate with hooks on the models: not the user's."""
    from runners.clock import PassClock, model_passes

    runner = make_runner(model)
    with model_passes([model], PassClock()):
        greedy(runner, 2)
    assert runner.hooked_passes == 0 and (runner.step_passes == 2 or not skinny_built())


def test_a_prepacked_layer_fires_the_hooks_of_the_linear_it_replaced():
    from kernels.prepacking import OWN, PrepackedLinear

    own, x = torch.nn.Linear(32, 16), torch.randn(3, 32, generator=torch.Generator().manual_seed(0))
    own.register_forward_pre_hook(lambda module, args, kwargs: ((args[0] * 2,), kwargs), with_kwargs=True)
    own.register_forward_hook(lambda module, args, output: output + args[0].sum())
    packed = PrepackedLinear(own)
    packed.route = (OWN,)
    with torch.no_grad():
        torch.testing.assert_close(packed(x), own(x), rtol=0, atol=0)


@pytest.mark.parametrize("where", ["PrepackedLinear", "its own nn.Linear"])
def test_a_hook_on_a_released_bfloat16_layer_fires_and_a_new_runner_takes_the_step_again(where):
    """bfloat16, its layers released by the step (their forward on its bfloat16 route): a hook on the
    layer or on the linear it replaced fires on the lean runner (transformers' forward, a bfloat16 cache
    from then on: ``runners.lean``); removed, a new runner's step gives the unhooked logits bit for bit."""
    made = llama(layers=3).to(torch.bfloat16)
    unhooked = greedy(make_runner(made), 4)
    assert released(made.model.layers[1].mlp.down_proj) or not skinny_built()
    find, register, hook = HOOKS[where]
    handle = getattr(find(made), register)(hook)
    try:
        runner = make_runner(made)
        hooked = greedy(runner, 4)
        torch.testing.assert_close(torch.stack(hooked), torch.stack(reference(made, 4)), rtol=0, atol=2e-3)  # logits up to ~0.3
        assert (torch.stack(hooked).float() - torch.stack(unhooked)).abs().max() > 1e-2
        assert runner.hooked_passes == 4 and runner.step_passes == 0
    finally:
        handle.remove()
    again = make_runner(made)
    assert torch.equal(torch.stack(greedy(again, 4)), torch.stack(unhooked)) and (again.step_passes == 4 or not skinny_built())
