"""The prepacked (oneDNN) linear layers of float32 CPU models change nothing but speed, and are used only
when asked for or measured faster on the machine that runs them."""
import re

import pytest
import torch

import kernels.prepacking as prepacking
import runners as caching

from conftest import EOS_NEVER, PROMPT, llama, perturbed_copy
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
from drafters import PromptLookupSpec
from sampling import autoregressive_generate, generate, speculative_generate
from measure import OWN, PREPACKED, KernelChoice, choose_kernels, choose_prepack
from measure.kernels import SKINNY, label_plan, model_label, plan_label
from runners import KVCacheModel, PrepackedLinear, kernels, prepackable, prepacked, set_prepack
from kernels import skinny
from kernels.prepacking import plan

pytestmark = pytest.mark.skipif(not prepackable(llama().to(torch.float32)), reason="needs oneDNN (mkldnn)")


@pytest.fixture(scope="module")
def float32_pair():
    target = llama(vocab=300, init=0.2).to(torch.float32)
    drafter = perturbed_copy(target, 0.2, seed=1).to(torch.float32)
    for model in (target, drafter):
        set_prepack(model, True)
    return target, drafter


def linear_count(model):
    return sum(type(m) is torch.nn.Linear for m in model.modules())


def test_every_float32_linear_layer_of_the_model_itself_is_prepacked(float32_pair):
    target, _ = float32_pair
    swaps = prepackable(target)
    assert len(swaps) == sum(type(m) is PrepackedLinear for m in target.modules()) > 1 and linear_count(target) == 0
    assert all(modules[name] is packed for modules, name, packed, _ in swaps)
    # model code that reads a layer's .weight (dtype casts, tied heads) still finds the parameter
    assert all(packed.weight is own.weight and packed.bias is own.bias for _, _, packed, own in swaps)
    assert set(target.state_dict()) == set(type(target)(target.config).state_dict())  # no extra entries


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_prepacked_logits_match_the_models_own_over_any_number_of_rows(float32_pair, rows):
    target, _ = float32_pair
    ids = torch.tensor([PROMPT])
    with kernels(target, False):
        own = KVCacheModel(target)(ids, rows)
    fast = KVCacheModel(target)(ids, rows)
    torch.testing.assert_close(fast, own, rtol=1e-4, atol=1e-4)


def test_kernels_are_restored_after_a_block_even_when_it_fails(float32_pair):
    target, _ = float32_pair
    before = [(name, module) for name, module in target.named_modules()]
    with pytest.raises(IndexError):
        with kernels(target, False):
            assert plan(target) == (OWN,)  # explicitly: no pass runs the C step either
            KVCacheModel(target)(torch.tensor([[10**6]]), 1)  # token id outside the vocabulary
    assert [(name, module) for name, module in target.named_modules()] == before


def count_prepacked_calls(model):
    """A spy: how many times a prepacked layer of ``model`` runs."""
    calls = [0]
    hooks = [m.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1)) for m in model.modules() if type(m) is PrepackedLinear]
    return calls, hooks


def spy_on_widths(model):
    """A spy: the pass widths at which a prepacked layer of ``model`` ran, by kernel ({"own": {...},
    "oneDNN": {...}}); returns them and the calls that remove the spy."""
    calls, undo = {"own": set(), "oneDNN": set()}, []
    for layer in model.modules():
        if type(layer) is PrepackedLinear:
            def kernel_for(x, layer=layer, real=layer.kernel_for):
                kernel = real(x)
                calls["own" if kernel == OWN else "oneDNN" if kernel == PREPACKED else kernel].add(x.numel() // layer.in_features)
                return kernel
            layer.kernel_for = kernel_for
            undo.append(lambda layer=layer: layer.__dict__.pop("kernel_for"))
    return calls, undo


def test_transformers_generate_runs_the_same_prepacked_kernels_as_our_runner(float32_pair):
    """Like for like: the kernels are the model's, so a transformers peer on the same model runs them too."""
    target, _ = float32_pair
    calls, hooks = count_prepacked_calls(target)
    try:
        target.generate(torch.tensor([PROMPT]), max_new_tokens=3, do_sample=False, pad_token_id=0)
    finally:
        for hook in hooks:
            hook.remove()
    assert calls[0] >= 3 * len(prepackable(target))


def test_prepacked_layers_follow_a_weight_change():
    target = llama(vocab=300).to(torch.float32)
    set_prepack(target, True)
    ids = torch.tensor([PROMPT])
    KVCacheModel(target)(ids, 1)
    with torch.no_grad():
        target.lm_head.weight.mul_(-1)
        target.model.layers[0].mlp.up_proj.weight.mul_(0.5)
    fast = KVCacheModel(target)(ids, 3)
    with kernels(target, False):
        torch.testing.assert_close(fast, KVCacheModel(target)(ids, 3), rtol=1e-4, atol=1e-4)


def test_prepacking_only_for_float32_cpu_linear_layers_and_off_unless_asked():
    assert prepackable(llama()) == [] and not set_prepack(llama(), True)  # float64
    model = llama().to(torch.float32)
    assert not prepacked(model)  # no default tuned to one processor
    assert set_prepack(model, True) and prepacked(model)
    assert not set_prepack(model, False) and not prepacked(model) and linear_count(model) > 1


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_speculative_equals_autoregressive_in_float32_with_prepacked_layers(float32_pair, use_cache):
    target, drafter = float32_pair
    reference = autoregressive_generate(PROMPT, target, 40, eos_tokens_id=EOS_NEVER, use_cache=use_cache)
    out, _ = speculative_generate(PROMPT, drafter, target, gamma=4, max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=use_cache)
    nasd, _ = ngram_assisted_speculative_generate(
        PROMPT, NGramStorage(3, 300), target, gamma=4, max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=use_cache
    )
    pld, _ = generate(PROMPT, target, PromptLookupSpec(), dict(max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=use_cache))
    assert out == reference and nasd == reference and pld == reference


def test_choose_kernels_measures_every_option_gives_the_model_its_plan_and_says_so():
    model = llama(vocab=300).to(torch.float32)
    choice, line = choose_kernels(model)
    assert set(choice.seconds) == {PREPACKED, OWN} | ({SKINNY} if skinny.available()[0] else set()) and all(len(t) == 12 and min(t) > 0 for t in choice.seconds.values())
    kernel = "(own|prepacked|skinny)"
    assert re.match(rf"kernels by measurement: a one-position pass [0-9.]+ ms own, [0-9.]+ ms prepacked(, [0-9.]+ ms skinny)?; "
                    rf"every pass on ({kernel}|({kernel} at [0-9]+(-[0-9]+)?, )+{kernel} at [0-9]+\+ positions) "
                    r"\(costs by positions 1..12: chosen 1.00 ", line)
    assert plan(model) == choice.route() and model_label(model) == choice.label()
    if not choice.uses(PREPACKED):  # oneDNN's copies made for the measurement are freed
        assert all(layer.packed is None for layer in model.modules() if type(layer) is PrepackedLinear)
        assert prepacked(model) or not any(prepacking.remembered(layer) for layer in model.modules() if type(layer) is torch.nn.Linear)
    assert choose_prepack(llama(vocab=300)) == "no float32 CPU linear layers to prepack"  # float64


def test_every_measured_width_runs_one_kernel_family_and_prompts_the_fastest_at_the_longest():
    """The Intel CPU's pair: own layers win 1-3 positions, prepacked ones win verification passes. The
    plan is one family for 1..R (the least one-position pass plus mean pass: prepacked here), so a
    position's product does not depend on its pass's width; longer passes take the fastest at R."""
    own = (1.00, 1.01, 0.97, 1.75, 1.85, 1.96, 2.52)
    packed = (1.03, 1.14, 1.21, 1.25, 1.29, 1.29, 1.43)
    choice = KernelChoice({OWN: own, PREPACKED: packed})
    assert choice.family() == PREPACKED and {choice.for_width(r) for r in range(1, 8)} == {PREPACKED}
    assert choice.for_width(99) == PREPACKED  # past the measured passes: the longest one's
    assert choice.route() == (PREPACKED,) * 8  # widths 1..7, then longer passes
    assert choice.label() == PREPACKED and label_plan(choice.label()) == (PREPACKED,)
    # the policy's costs are the plan's, relative to its one-position pass
    assert choice.row_costs() == tuple(round(t / 1.03, 3) for t in packed)
    assert choice.row_costs(PREPACKED)[:2] == (1.0, round(1.14 / 1.03, 3))
    # a clearly faster one-position pass wins even where verification is a little dearer
    decode = KernelChoice({OWN: (0.70, 0.80, 0.90), PREPACKED: (1.0, 1.0, 1.0)})
    assert decode.route() == (OWN,) * 4 and decode.label() == OWN
    # prepacking must be clearly faster somewhere (it costs a copy of the weights): 3% is not enough
    close = KernelChoice({OWN: (1.0, 1.1), PREPACKED: (0.97, 1.07)})
    assert close.for_width(1) == OWN and not close.uses(PREPACKED) and close.label() == OWN and close.row_costs() == (1.0, 1.1)
    assert plan_label(None) == OWN and plan_label((PREPACKED,)) == PREPACKED
    assert plan_label((PREPACKED, OWN)) == "prepacked at 1, own at 2+ positions" and label_plan(OWN) is False


def test_noise_between_close_options_never_makes_the_plan_alternate_by_width():
    """Two options within noise of each other at every width (the zig-zag seen on a busy EPYC): the
    plan is one of them for every measured width, whichever way the noise fell."""
    from measure.kernels import SKINNY

    generator = torch.Generator().manual_seed(7)
    for _ in range(50):
        base = torch.linspace(1.0, 1.6, 12)
        noisy = {o: tuple((base * (1 + 0.03 * torch.randn(12, generator=generator))).tolist()) for o in (PREPACKED, SKINNY)}
        noisy[OWN] = tuple((base * 1.5).tolist())
        route = KernelChoice(noisy).route()
        assert len(set(route[:12])) == 1, route
        assert route[12] == (SKINNY if route[0] == SKINNY else PREPACKED), route  # prompts: the skinny family's own kernel


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9])
def test_a_prepacked_layer_runs_the_kernel_its_plan_names_for_the_pass_width(rows):
    """By width: the model's own kernel (exactly ``F.linear``) where the plan says own, oneDNN's where
    it says prepacked, and the plan's last entry for passes longer than it."""
    layer = torch.nn.Linear(64, 48).to(torch.float32)
    packed = PrepackedLinear(layer)
    packed.route = (OWN, PREPACKED, OWN)
    x = torch.randn(1, rows, 64, generator=torch.Generator().manual_seed(rows))
    own = torch.nn.functional.linear(x, layer.weight, layer.bias)
    packed._pack()
    oneDNN = torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed.packed, packed.bias.detach(), "none", [], "")
    assert torch.equal(packed(x), own if rows in (1, 3) or rows > 3 else oneDNN)
    packed.route = (PREPACKED,)
    assert torch.equal(packed(x), oneDNN)


def test_every_row_and_its_transformers_peer_run_one_plan_so_one_position_costs_the_same_everywhere(float32_pair):
    """A spy on the kernels by width: with own layers measured faster at 1-3 positions and prepacked ones
    at 4+, every row's one-position passes run on the own kernels and every pass of 4+ positions (the
    prompt's, speculative decoding's and transformers' assisted generation's verification of 4 drafts)
    on oneDNN; every row's result names the one plan, and the model is as before after each row."""
    from strategies import EVERY, RunConfig, RunContext, run_strategy

    target, drafter = float32_pair
    choice = KernelChoice({OWN: (1.0, 1.01, 0.97, 1.75, 1.85, 1.96), PREPACKED: (1.03, 1.14, 1.21, 1.25, 1.29, 1.29)})
    route = (OWN,) * 3 + (PREPACKED,)  # a mixed plan given by hand (a measured one is one family): own at 1-3, oneDNN at 4+
    config = RunConfig(gamma=4, max_gen_len=8, kernel_choice=choice)
    context = RunContext(target=target, tokenizer=None, drafter=drafter)
    calls, hooks = spy_on_widths(target)
    ran, widths = {}, {}
    before = plan(target)
    try:
        with kernels(target, route):
            for key in ("target", "hf_generate", "speculative", "hf_assisted"):
                calls["own"].clear(), calls["oneDNN"].clear()
                result = run_strategy(EVERY[key], PROMPT, config, context)
                ran[key] = result.kernels
                assert calls["own"] <= {1, 2, 3} and min(calls["oneDNN"]) >= 4, (key, calls)
                widths[key] = (1 in calls["own"], 5 in calls["oneDNN"])
                assert plan(target) == route
    finally:
        for hook in hooks:
            hook()
    assert plan(target) == before
    label = "own at 1-3, prepacked at 4+ positions"
    assert ran == dict.fromkeys(("target", "hf_generate", "speculative", "hf_assisted"), label)
    assert widths == {"target": (True, False), "hf_generate": (True, False), "speculative": (True, True), "hf_assisted": (False, True)}


def test_a_divergence_is_replayed_on_the_kernels_each_run_had(float32_pair):
    """A row on prepacked linears against target AR on the model's own: each computation replayed as it
    ran, so the rounding weighed is the one between the kernels, whatever the model has now. The runs
    are without gradients, as generation's and the replay's: with them, oneDNN's AVX2 kernels (AMD EPYC
    before Zen 4; ``ONEDNN_MAX_CPU_ISA=AVX2``) take a training primitive that rounds apart."""
    from sampling.divergence import default_runner, on_kernels

    target, _ = float32_pair
    ids = torch.tensor([PROMPT])
    with kernels(target, False), torch.no_grad():
        own = KVCacheModel(target)(ids, 3)
    with kernels(target, True), torch.no_grad():
        packed = KVCacheModel(target)(ids, 3)
    for now in (True, False):
        with kernels(target, now):
            assert torch.equal(on_kernels(default_runner, "own")(target)(ids, 3), own)
            assert torch.equal(on_kernels(default_runner, "prepacked")(target)(ids, 3), packed)
            assert plan(target) == ((PREPACKED,) if now else (OWN,))


def test_the_repl_table_names_each_rows_kernels_when_they_differ_and_says_nothing_when_they_agree():
    from types import SimpleNamespace as Row

    from app.repl.repl import kernels_caption

    target, ngram, pld = Row(title="Target AR"), Row(title="N-gram assisted"), Row(title="Prompt lookup")
    mixed = [(target, Row(kernels="own")), (ngram, Row(kernels="prepacked")), (pld, Row(kernels="prepacked"))]
    assert kernels_caption(mixed) == " · linears: own (Target AR) · prepacked (N-gram assisted, Prompt lookup)"
    assert kernels_caption([(target, Row(kernels="own")), (ngram, Row(kernels="own"))]) == ""


def test_a_prepacked_model_deep_copies_into_an_independent_prepacked_model(float32_pair):
    """``truncated_drafter`` deep-copies the target: oneDNN's packed weights have no storage to copy."""
    import copy

    from utils.models import truncated_drafter

    target, _ = float32_pair
    clone = copy.deepcopy(target)
    ids = torch.tensor([PROMPT])
    assert prepacked(clone) and torch.equal(KVCacheModel(clone)(ids, 3), KVCacheModel(target)(ids, 3))
    with torch.no_grad():
        clone.lm_head.weight.mul_(2)
    assert not torch.equal(KVCacheModel(clone)(ids, 1), KVCacheModel(target)(ids, 1))  # its own weights
    assert prepacked(truncated_drafter(target, 1))
