"""The prepacked (oneDNN) output projection used on float32 CPU models changes nothing but speed."""
import pytest
import torch

from conftest import EOS_NEVER, PROMPT, llama, perturbed_copy
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
from sampling import autoregressive_generate, speculative_generate
from utils.caching import KVCacheModel, prepacked_head

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN (mkldnn)")


@pytest.fixture(scope="module")
def float32_pair():
    target = llama(vocab=300, init=0.2).to(torch.float32)
    drafter = perturbed_copy(target, 0.2, seed=1).to(torch.float32)
    return target, drafter


def test_prepacked_head_logits_match_the_models_own_head(float32_pair):
    target, _ = float32_pair
    assert prepacked_head(target) is not None
    ids = torch.tensor([PROMPT])
    own = KVCacheModel(target, fast_head=False)(ids, 5)
    fast = KVCacheModel(target, fast_head=True)(ids, 5)
    torch.testing.assert_close(fast, own, rtol=1e-5, atol=1e-5)


def test_model_keeps_its_own_head_after_a_fast_forward(float32_pair):
    target, _ = float32_pair
    head = target.lm_head
    KVCacheModel(target)(torch.tensor([PROMPT]), 1)
    assert target.lm_head is head and type(target.lm_head) is torch.nn.Linear


def test_prepacked_head_follows_a_weight_change():
    target = llama(vocab=300).to(torch.float32)
    ids = torch.tensor([PROMPT])
    KVCacheModel(target)(ids, 1)
    with torch.no_grad():
        target.lm_head.weight.mul_(-1)
    torch.testing.assert_close(KVCacheModel(target)(ids, 3), KVCacheModel(target, fast_head=False)(ids, 3))


def test_prepacked_head_only_for_float32_cpu_linear_heads(monkeypatch):
    assert prepacked_head(llama()) is None  # float64
    model = llama().to(torch.float32)
    assert prepacked_head(model) is not None
    monkeypatch.setenv("SPECDEC_FAST_HEAD", "0")
    assert prepacked_head(model) is None


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_speculative_equals_autoregressive_in_float32_with_fast_head(float32_pair, use_cache):
    target, drafter = float32_pair
    reference = autoregressive_generate(PROMPT, target, 40, eos_tokens_id=EOS_NEVER, use_cache=use_cache)
    out, _ = speculative_generate(PROMPT, drafter, target, gamma=4, max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=use_cache)
    nasd, _ = ngram_assisted_speculative_generate(
        PROMPT, NGramStorage(3, 300), target, gamma=4, max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=use_cache
    )
    assert out == reference and nasd == reference
