"""The prepacked (oneDNN) linear layers of float32 CPU models change nothing but speed, and are used only
when asked for or measured faster on the machine that runs them."""
import re

import pytest
import torch

import utils.caching as caching

from conftest import EOS_NEVER, PROMPT, llama, perturbed_copy
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
from sampling import autoregressive_generate, prompt_lookup_generate, speculative_generate
from sampling.calibration import choose_prepack
from utils.caching import KVCacheModel, PrepackedLinear, prepacked_linears, set_prepack

pytestmark = pytest.mark.skipif(not prepacked_linears(llama().to(torch.float32), True), reason="needs oneDNN (mkldnn)")


@pytest.fixture(scope="module")
def float32_pair():
    target = llama(vocab=300, init=0.2).to(torch.float32)
    drafter = perturbed_copy(target, 0.2, seed=1).to(torch.float32)
    for model in (target, drafter):
        set_prepack(model, True)
    return target, drafter


def linear_count(model):
    return sum(type(m) is torch.nn.Linear for m in model.modules())


def test_every_float32_linear_layer_is_prepacked(float32_pair):
    target, _ = float32_pair
    swaps = prepacked_linears(target)
    assert len(swaps) == linear_count(target) > 1
    assert all(isinstance(packed, PrepackedLinear) for _, _, packed, _ in swaps)
    # model code that reads a layer's .weight (dtype casts, tied heads) still finds the parameter
    assert all(packed.weight is own.weight and packed.bias is own.bias for _, _, packed, own in swaps)


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_prepacked_logits_match_the_models_own_over_any_number_of_rows(float32_pair, rows):
    target, _ = float32_pair
    ids = torch.tensor([PROMPT])
    own = KVCacheModel(target, prepack=False)(ids, rows)
    fast = KVCacheModel(target, prepack=True)(ids, rows)
    torch.testing.assert_close(fast, own, rtol=1e-4, atol=1e-4)


def test_model_keeps_its_own_layers_after_a_prepacked_pass(float32_pair):
    target, _ = float32_pair
    before = [(name, module) for name, module in target.named_modules()]
    KVCacheModel(target)(torch.tensor([PROMPT]), 1)
    assert [(name, module) for name, module in target.named_modules()] == before
    assert not any(isinstance(m, PrepackedLinear) for m in target.modules())


def test_model_keeps_its_own_layers_when_a_pass_fails(float32_pair):
    target, _ = float32_pair
    with pytest.raises(Exception):
        KVCacheModel(target)(torch.tensor([[10**6]]), 1)  # token id outside the vocabulary
    assert not any(isinstance(m, PrepackedLinear) for m in target.modules())


def test_prepacked_layers_follow_a_weight_change():
    target = llama(vocab=300).to(torch.float32)
    set_prepack(target, True)
    ids = torch.tensor([PROMPT])
    KVCacheModel(target)(ids, 1)
    with torch.no_grad():
        target.lm_head.weight.mul_(-1)
        target.model.layers[0].mlp.up_proj.weight.mul_(0.5)
    torch.testing.assert_close(KVCacheModel(target)(ids, 3), KVCacheModel(target, prepack=False)(ids, 3), rtol=1e-4, atol=1e-4)


def test_prepacking_only_for_float32_cpu_linear_layers_and_off_unless_asked():
    assert prepacked_linears(llama(), True) == []  # float64
    model = llama().to(torch.float32)
    assert prepacked_linears(model) == []  # no default tuned to one processor
    set_prepack(model, True)
    assert prepacked_linears(model)
    set_prepack(model, False)
    assert prepacked_linears(model) == []


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_speculative_equals_autoregressive_in_float32_with_prepacked_layers(float32_pair, use_cache):
    target, drafter = float32_pair
    reference = autoregressive_generate(PROMPT, target, 40, eos_tokens_id=EOS_NEVER, use_cache=use_cache)
    out, _ = speculative_generate(PROMPT, drafter, target, gamma=4, max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=use_cache)
    nasd, _ = ngram_assisted_speculative_generate(
        PROMPT, NGramStorage(3, 300), target, gamma=4, max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=use_cache
    )
    pld, _ = prompt_lookup_generate(PROMPT, target, max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=use_cache)
    assert out == reference and nasd == reference and pld == reference


def test_auto_prepacking_measures_both_keeps_its_choice_and_says_what_it_measured():
    model = llama(vocab=300).to(torch.float32)
    line = choose_prepack(model, context=16, repeats=2)
    chosen = bool(prepacked_linears(model))
    assert re.fullmatch(r"(prepacked linears|the model's own linears) \(measured [0-9.]+ ms a pass prepacked, [0-9.]+ ms its own\)", line)
    assert line.startswith("prepacked linears") == chosen
    if not chosen:  # the copies made for the measurement are freed
        assert not any(layer in caching._PREPACKED for layer in model.modules())
    assert choose_prepack(llama(vocab=300), context=16, repeats=2) == "no float32 CPU linear layers to prepack"  # float64
