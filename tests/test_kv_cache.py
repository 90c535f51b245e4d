"""With the cache on, models are fed only the tokens they have not seen, and caches are rolled back."""
import pytest
import torch

from runners.cache_kind import returned_cache

from conftest import EOS_NEVER, PROMPT, llama, perturbed_copy
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
from sampling import GenerationStats, autoregressive_generate, speculative_generate
from runners import KVCacheModel, prune_cache


class FedTokens:
    """Records how many tokens each forward pass of a model is fed: read at its input embeddings, which
    transformers' forward and the lean one (``runners.lean``) both call with the pass's ids ``[1, r]``."""

    def __init__(self, model):
        self.sizes = []
        self.handle = model.get_input_embeddings().register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        ids = kwargs.get("input", args[0] if args else None)
        self.sizes.append(ids.shape[1])

    def remove(self):
        self.handle.remove()


@pytest.fixture(scope="module")
def models():
    target = llama()
    return target, perturbed_copy(target, 0.2, seed=1)


def test_autoregressive_with_cache_feeds_one_token_per_step(models):
    target, _ = models
    fed = FedTokens(target)
    try:
        out = autoregressive_generate(PROMPT, target, max_gen_len=10, eos_tokens_id=EOS_NEVER, use_cache=True)
    finally:
        fed.remove()
    assert fed.sizes == [len(PROMPT)] + [1] * (len(out) - 1)


def test_speculative_with_cache_never_refeeds_the_prefix(models):
    target, drafter = models
    fed_target, fed_drafter = FedTokens(target), FedTokens(drafter)
    stats = GenerationStats()
    try:
        speculative_generate(PROMPT, drafter, target, gamma=4, max_gen_len=30, eos_tokens_id=EOS_NEVER, use_cache=True, stats=stats)
    finally:
        fed_target.remove()
        fed_drafter.remove()
    # target: the prompt once, then per step the last emitted token plus the drafts
    assert fed_target.sizes[0] == len(PROMPT)
    assert all(size <= 1 + 4 for size in fed_target.sizes[1:])
    assert sum(fed_target.sizes) == len(PROMPT) + stats.generated - 1 + stats.drafted - stats.accepted
    # drafter: after its first call, at most the tokens emitted since its last draft plus one
    assert fed_drafter.sizes[0] == len(PROMPT) + 1
    assert all(size <= 2 for size in fed_drafter.sizes[1:])


def test_ngram_assisted_with_cache_never_refeeds_the_prefix(models):
    target, _ = models
    fed = FedTokens(target)
    stats = GenerationStats()
    try:
        ngram_assisted_speculative_generate(
            PROMPT, NGramStorage(3, 96), target, gamma=3, max_gen_len=30, eos_tokens_id=EOS_NEVER, use_cache=True, stats=stats
        )
    finally:
        fed.remove()
    assert sum(fed.sizes) == len(PROMPT) + stats.generated - 1 + stats.drafted - stats.accepted


def test_without_cache_the_whole_sequence_is_fed(models):
    target, _ = models
    fed = FedTokens(target)
    try:
        autoregressive_generate(PROMPT, target, max_gen_len=5, eos_tokens_id=EOS_NEVER, use_cache=False)
    finally:
        fed.remove()
    assert fed.sizes == [len(PROMPT) + i for i in range(5)]


def test_rollback_gives_the_same_logits_as_a_fresh_pass(models):
    target, _ = models
    ids = torch.tensor([PROMPT + [7, 8, 9, 10]])
    runner = KVCacheModel(target, use_cache=True)
    runner(ids, 4)
    runner.rollback(len(PROMPT) + 1)  # forget 8, 9, 10
    assert runner.cached == len(PROMPT) + 1 and runner.cache.get_seq_length() == len(PROMPT) + 1
    other = torch.tensor([PROMPT + [7, 11, 12]])
    rolled = runner(other, 2)
    fresh = KVCacheModel(target, use_cache=False)(other, 2)
    assert torch.allclose(rolled, fresh, atol=1e-10)


def test_prune_cache_removes_the_last_positions(models):
    target, _ = models
    out = target(torch.tensor([PROMPT]), use_cache=True)
    cache = prune_cache(returned_cache(out), 5)
    assert cache.get_seq_length() == len(PROMPT) - 5
