"""CPU weight-only int8/int4 layers: close to the float weights, row-independent, and every strategy
exact against target autoregressive under the same quantized weights."""
import copy

import pytest
import torch

from conftest import EOS_NEVER, PROMPT, llama, perturbed_copy
from drafters import ChainedSpec, DraftContext, PromptLookupSpec
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
from sampling import DraftPolicy, autoregressive_generate, generate, speculative_generate
from utils.quantization import WeightOnlyLinear, model_quantization, quantize_cpu

LENGTH = 40


def quantized(model, quantize):
    model = copy.deepcopy(model).to(torch.float32)
    quantize_cpu(model, quantize)
    return model.eval()


@pytest.mark.parametrize("bits", [8, 4])
def test_weight_only_layer_is_close_to_the_float_layer(bits):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    layer = WeightOnlyLinear(linear, bits)
    x = torch.randn(5, 3, 64)
    expected = linear(x)
    out = layer(x)
    assert out.shape == expected.shape and out.dtype == torch.float32
    # bfloat16 activations plus the weight grid: a few percent of the output's scale
    tolerance = {8: 0.02, 4: 0.12}[bits] * expected.abs().max()
    assert (out - expected).abs().max() < tolerance
    # the de-quantized weight, as code reading .weight sees it, is on the same grid
    assert (layer.weight - linear.weight).abs().max() < {8: 0.01, 4: 0.05}[bits]


@pytest.mark.parametrize("bits", [8, 4])
def test_each_output_row_depends_only_on_its_own_input_row(bits):
    """What makes a verification pass over r positions equal r single-position passes."""
    torch.manual_seed(1)
    layer = WeightOnlyLinear(torch.nn.Linear(96, 64), bits)
    x = torch.randn(12, 96)
    together = layer(x)
    for rows in (1, 2, 5, 12):
        alone = torch.cat([layer(x[i:i + 1]) for i in range(rows)])
        assert torch.equal(together[:rows], alone)


def test_int4_keeps_the_output_head_int8_and_counts_layers():
    model = llama().to(torch.float32)
    counts = quantize_cpu(model, "int4")
    assert model.lm_head.bits == 8
    assert counts == {"int4": 2 * 7, "int8": 1}
    assert not any(type(m) is torch.nn.Linear for m in model.modules())


@pytest.fixture(scope="module", params=["int8", "int4"])
def quantized_pair(request):
    target = llama(seed=0)
    drafter = perturbed_copy(target, 0.2, seed=1)
    return quantized(target, request.param), quantized(drafter, request.param)


@pytest.mark.parametrize("use_cache", [False, True], ids=["no_cache", "cache"])
def test_greedy_every_strategy_equals_target_ar_under_the_same_quantized_weights(quantized_pair, use_cache):
    target, drafter = quantized_pair
    vocab = target.config.vocab_size
    common = dict(max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=use_cache)
    expected = autoregressive_generate(PROMPT, target, **common)
    assert len(expected) == LENGTH
    padded = lambda: DraftPolicy(row_costs=(1.0, 3.0, 3.0, 2.0, 1.5, 1.5, 1.5, 1.5), min_gain=0.5, pause_steps=2)  # noqa: E731
    for policy in (lambda: None, padded):
        runs = {
            "speculative": speculative_generate(PROMPT, drafter, target, gamma=3, policy=policy(), **common),
            "ngram": ngram_assisted_speculative_generate(PROMPT, NGramStorage(3, vocab), target, gamma=4, policy=policy(), **common),
            "pld": generate(PROMPT, target, PromptLookupSpec(num_pred_tokens=5), dict(policy=policy(), **common)),
            "chained": generate(PROMPT, target, ChainedSpec(), dict(gamma=3, policy=policy(), **common),
                                DraftContext(storage=NGramStorage(3, vocab), drafter=drafter)),
        }
        for name, (out, rate) in runs.items():
            assert out == expected, name
    assert 0.0 < runs["speculative"][1] < 1.0, "the drafter should be right only sometimes, or the test proves little"


def test_load_model_on_cpu_uses_the_weight_only_kernels(tiny_models):
    from utils.models import load_model

    model, _, _ = load_model(tiny_models["target"], "cpu", "auto", "int4")
    layers = [m for m in model.modules() if isinstance(m, WeightOnlyLinear)]
    assert layers and {m.bits for m in layers} == {4, 8}
    assert model_quantization(model) == "int4"
    out = autoregressive_generate([5, 17, 33], model, max_gen_len=4, eos_tokens_id=EOS_NEVER, use_cache=True)
    assert len(out) == 4
