"""Greedy speculative output equals greedy autoregressive output, token for token."""
import pytest

from conftest import EOS_NEVER, PROMPT
from ngram_assisted import NGramStorage, OneLevelNGramStorage, ngram_assisted_speculative_generate
from sampling import (
    GenerationStats,
    autoregressive_generate,
    autoregressive_generate_encoder_decoder,
    speculative_generate,
    speculative_generate_encoder_decoder,
)

LENGTH = 40


@pytest.mark.parametrize("use_cache", [False, True], ids=["no_cache", "cache"])
@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_greedy_speculative_equals_autoregressive(pair, use_cache, gamma):
    target, drafter = pair
    expected = autoregressive_generate(PROMPT, target, max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=use_cache)
    stats = GenerationStats()
    out, rate = speculative_generate(
        PROMPT, drafter, target, gamma=gamma, max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=use_cache, stats=stats
    )
    assert out == expected
    assert 0.0 < rate < 1.0, "the drafter should be right only sometimes, or the test proves little"
    assert rate == stats.acceptance_rate
    assert stats.generated == LENGTH and stats.target_forward_passes < LENGTH


@pytest.mark.parametrize("first_target", [True, False])
def test_greedy_speculative_equals_autoregressive_without_first_target_step(pair, first_target):
    target, drafter = pair
    expected = autoregressive_generate(PROMPT, target, max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=True)
    out, _ = speculative_generate(
        PROMPT, drafter, target, gamma=4, max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=True, first_target=first_target
    )
    assert out == expected


@pytest.mark.parametrize("storage_type", [NGramStorage, OneLevelNGramStorage])
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("filler_top_k", [1, 3])
@pytest.mark.parametrize("stop_if_unknown", [False, True])
@pytest.mark.parametrize("use_cache", [False, True], ids=["no_cache", "cache"])
def test_greedy_ngram_assisted_equals_autoregressive(pair, storage_type, n, filler_top_k, stop_if_unknown, use_cache):
    target, _ = pair
    expected = autoregressive_generate(PROMPT, target, max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=use_cache)
    vocab = target.config.vocab_size
    for gamma in (1, 5):
        out, rate = ngram_assisted_speculative_generate(
            PROMPT, storage_type(n, vocab), target, gamma=gamma, filler_top_k=filler_top_k, max_gen_len=LENGTH,
            eos_tokens_id=EOS_NEVER, use_cache=use_cache, stop_if_unknown=stop_if_unknown,
        )
        assert out == expected
        assert 0.0 <= rate <= 1.0


def test_ngram_drafts_are_accepted_on_repetitive_text(pair):
    """A greedy tiny model falls into loops; the storage learns them, so drafts get accepted."""
    target, _ = pair
    stats = GenerationStats()
    ngram_assisted_speculative_generate(
        PROMPT, NGramStorage(3, target.config.vocab_size), target, gamma=4, max_gen_len=80, eos_tokens_id=EOS_NEVER,
        use_cache=True, stats=stats,
    )
    assert stats.accepted > 0 and stats.mean_accepted_tokens > 1.0


@pytest.mark.parametrize("use_cache", [False, True], ids=["no_cache", "cache"])
@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_encoder_decoder_speculative_equals_autoregressive(t5_pair, use_cache, gamma):
    target, drafter = t5_pair
    expected = autoregressive_generate_encoder_decoder(PROMPT, target, max_gen_len=30, eos_tokens_id=EOS_NEVER, use_cache=use_cache)
    out, rate = speculative_generate_encoder_decoder(
        PROMPT, drafter, target, gamma=gamma, max_gen_len=30, eos_tokens_id=EOS_NEVER, use_cache=use_cache
    )
    assert out == expected and len(out) == 30
    assert 0.0 <= rate <= 1.0


def test_cache_on_and_off_give_identical_output(pair):
    target, drafter = pair
    for use_cache in (False, True):
        out = speculative_generate(PROMPT, drafter, target, gamma=3, max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=use_cache)
        if use_cache:
            assert out == previous
        previous = out
