"""The static KV cache: preallocated, written by position, rolled back by moving the position; every
strategy greedy exact with it (Llama, GPT-2, a sliding-window Mistral), regrowth included."""
import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

import runners.static
import runners as caching
from conftest import EOS_NEVER, PROMPT, gpt2, llama, perturbed_copy, t5
from drafters import ChainedSpec, DraftContext, PromptLookupSpec
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
from sampling import (
    autoregressive_generate,
    autoregressive_generate_encoder_decoder,
    generate,
    speculative_generate,
    speculative_generate_encoder_decoder,
)
from runners import KVCacheModel, RunnerConfig

LENGTH = 60


def mistral(window=8):
    torch.manual_seed(0)
    config = MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, sliding_window=window, max_position_embeddings=512)
    return MistralForCausalLM(config).to(torch.float64).eval()


MODELS = {"llama": llama, "gpt2": gpt2, "mistral_window8": mistral}


@pytest.fixture(scope="module", params=sorted(MODELS))
def family(request):
    target = MODELS[request.param]()
    return target, perturbed_copy(target, 0.2 if request.param != "gpt2" else 1.0, seed=1)


@pytest.fixture
def small_slack(monkeypatch):
    """Preallocate only 8 positions beyond the first pass, so that generations regrow the cache."""
    monkeypatch.setattr(runners.static, "STATIC_SLACK", 8)
    monkeypatch.setattr(runners.static, "STATIC_ROUND", 8)


def run_all(target, drafter, use_cache, cache=None):
    vocab = target.config.vocab_size
    common = dict(max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=use_cache, runner=RunnerConfig(cache=cache))
    return {
        "target": autoregressive_generate(PROMPT, target, **common),
        "speculative": speculative_generate(PROMPT, drafter, target, gamma=3, **common)[0],
        "ngram": ngram_assisted_speculative_generate(PROMPT, NGramStorage(3, vocab), target, gamma=5, **common)[0],
        "pld": generate(PROMPT, target, PromptLookupSpec(num_pred_tokens=6), common)[0],
        "chained": generate(PROMPT, target, ChainedSpec(), {**common, "gamma": 3},
                            DraftContext(storage=NGramStorage(3, vocab), drafter=drafter))[0],
    }


def test_every_strategy_with_the_static_cache_equals_target_ar_without_cache(family, small_slack):
    target, drafter = family
    expected = autoregressive_generate(PROMPT, target, max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=False)
    for kind in ("static", "dynamic"):
        for name, out in run_all(target, drafter, use_cache=True, cache=kind).items():
            assert out == expected, (kind, name)


def test_static_runner_rolls_back_by_moving_the_position_and_regrows(small_slack):
    target = mistral()
    runner = KVCacheModel(target, use_cache=True, cache="static")
    ids = torch.tensor([PROMPT + list(range(20, 40))])
    runner(ids[:, : len(PROMPT)], 1)
    assert runner.cache_kind == "static" and runner.capacity == 24  # 12 + 8, rounded up to 8
    keys = runner.cache.layers[0].keys
    runner(ids[:, : len(PROMPT) + 4], 4)
    runner.rollback(len(PROMPT) + 1)
    assert runner.cache.layers[0].keys is keys, "a rollback does not reallocate"
    assert int(runner.cache.layers[0].cumulative_length) == len(PROMPT) + 1
    rolled = runner(ids, 19)  # past the capacity: regrown, what it held copied
    assert runner.capacity >= ids.shape[1]
    fresh = KVCacheModel(target, use_cache=False)(ids, 19)
    assert torch.allclose(rolled, fresh, atol=1e-10)


@pytest.mark.parametrize("use_cache", [False, True], ids=["no_cache", "cache"])
def test_encoder_decoder_models_keep_the_dynamic_cache(use_cache):
    target = t5()
    drafter = perturbed_copy(target, 0.5, seed=1)
    runner = KVCacheModel(target, use_cache=True, encoder_input_ids=PROMPT, cache="static")
    assert runner.cache_kind == "dynamic"
    expected = autoregressive_generate_encoder_decoder(PROMPT, target, max_gen_len=20, eos_tokens_id=EOS_NEVER, use_cache=False)
    out, _ = speculative_generate_encoder_decoder(PROMPT, drafter, target, gamma=3, max_gen_len=20, eos_tokens_id=EOS_NEVER,
                                                  use_cache=use_cache, runner=RunnerConfig(cache="static"))
    assert out == expected


def test_cache_choice_is_validated_and_defaults_by_device():
    target = llama()
    with pytest.raises(ValueError):
        KVCacheModel(target, cache="paged")
    with pytest.raises(ValueError):
        RunnerConfig(cache="paged")
    assert KVCacheModel(target).cache_kind == caching.DEFAULT_CPU_CACHE
    assert KVCacheModel(target, cache="dynamic").cache_kind == "dynamic"
    assert not any(name.startswith("_specdec") for name in vars(target)), "no setting is stored on the model"


def test_the_header_names_the_cache_the_runners_use():
    """session.describe prints runner_cache: a model that cannot take the static cache is said to run the dynamic one."""
    from session import describe

    for model, expected in ((t5(), "dynamic"), (llama(), "static")):
        runner = RunnerConfig(cache="static")
        assert runner.cache_for(model) == expected == KVCacheModel(model, cache="static").cache_kind
        assert f"{expected} KV cache" in describe(model, "tiny", "none", runner=runner)


def lfm2():
    """A tiny LFM2: a convolution layer beside an attention layer, whose cache transformers' ``StaticCache``
    holds as no plain key/value store (``runners.static.static_cache`` makes none)."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    torch.manual_seed(0)
    config = Lfm2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, layer_types=["conv", "full_attention"], max_position_embeddings=256)
    return Lfm2ForCausalLM(config).to(torch.float64).eval()


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compile"])
def test_a_model_with_no_plain_key_value_cache_is_said_to_run_the_dynamic_cache_it_runs(compile):
    """Asked for the static cache (and compiled passes, refused: it runs eagerly), a model whose cache is no
    plain key/value store runs the dynamic one: ``cache_for``, the runner's ``cache_kind`` before and after
    a pass, and the header all say so (they said static while the runner fell back to dynamic)."""
    from session import describe

    model = lfm2()
    config = RunnerConfig(cache="static", compile=compile)
    runner = caching.make_runner(model, True, None, config)
    said = (config.cache_for(model), runner.cache_kind)
    runner(torch.tensor([PROMPT]), 1)
    assert said == (runner.cache_kind, runner.cache_kind) == ("dynamic", "dynamic")
    assert "dynamic KV cache · eager" in describe(model, "tiny", "none", runner=config)
