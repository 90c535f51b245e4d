"""Limits are honoured and bad arguments are refused before any model call."""
import pytest
import torch

from conftest import EOS_NEVER, PROMPT, llama, perturbed_copy
from ngram_assisted import NGramStorage, OneLevelNGramStorage, ngram_assisted_speculative_generate
from sampling import autoregressive_generate, beam_search_generate, speculative_generate
from utils.logits_processor import (
    GreedyProcessor,
    MultinomialProcessor,
    NucleusProcessor,
    TopKNucleusProcessor,
    TopKProcessor,
)


@pytest.fixture(scope="module")
def models():
    target = llama(window=24)
    return target, perturbed_copy(target, 0.2, seed=1)


def strategies(target, drafter):
    vocab = target.config.vocab_size
    return {
        "autoregressive": lambda **kw: autoregressive_generate(PROMPT, target, **kw),
        "speculative": lambda **kw: speculative_generate(PROMPT, drafter, target, gamma=4, **kw)[0],
        "ngram": lambda **kw: ngram_assisted_speculative_generate(PROMPT, NGramStorage(3, vocab), target, gamma=4, **kw)[0],
        "onelevel": lambda **kw: ngram_assisted_speculative_generate(PROMPT, OneLevelNGramStorage(3, vocab), target, gamma=4, **kw)[0],
    }


@pytest.mark.parametrize("use_cache", [False, True], ids=["no_cache", "cache"])
def test_never_more_than_max_gen_len_new_tokens(models, use_cache):
    for name, run in strategies(*models).items():
        for length in (1, 2, 5, 7):
            assert len(run(max_gen_len=length, eos_tokens_id=EOS_NEVER, use_cache=use_cache)) == length, name


@pytest.mark.parametrize("use_cache", [False, True], ids=["no_cache", "cache"])
def test_generation_stops_at_first_end_token_inclusive(models, use_cache):
    target, drafter = models
    free = autoregressive_generate(PROMPT, target, max_gen_len=12, eos_tokens_id=EOS_NEVER, use_cache=use_cache)
    for position in (0, 3, 7):
        eos = free[position]
        first = free.index(eos)
        for name, run in strategies(target, drafter).items():
            assert run(max_gen_len=12, eos_tokens_id=eos, use_cache=use_cache) == free[: first + 1], name
            assert run(max_gen_len=12, eos_tokens_id=[999, eos], use_cache=use_cache) == free[: first + 1], name


def test_context_window_is_never_exceeded(models):
    # window 24, prompt of 12: at most 12 new tokens whatever max_gen_len says
    for name, run in strategies(*models).items():
        assert len(run(max_gen_len=100, eos_tokens_id=EOS_NEVER, use_cache=True)) == 24 - len(PROMPT), name


def test_prompt_that_fills_the_window_is_refused(models):
    target, drafter = models
    with pytest.raises(ValueError, match="context window"):
        autoregressive_generate(list(range(24)), target)
    with pytest.raises(ValueError, match="context window"):
        speculative_generate(list(range(30)), drafter, target)
    with pytest.raises(ValueError, match="context window"):
        beam_search_generate(list(range(24)), target)


def test_empty_prompt_is_refused(models):
    target, drafter = models
    for call in (
        lambda: autoregressive_generate([], target),
        lambda: speculative_generate([], drafter, target),
        lambda: ngram_assisted_speculative_generate([], NGramStorage(2, 96), target),
        lambda: beam_search_generate([], target),
    ):
        with pytest.raises(ValueError, match="empty"):
            call()


class CountingCalls:
    """Counts the models' passes, at their input embeddings (transformers' forward and the lean one both call them)."""

    def __init__(self, *models):
        self.calls = 0
        self.handles = [m.get_input_embeddings().register_forward_pre_hook(self.hook) for m in models]

    def hook(self, *args):
        self.calls += 1

    def remove(self):
        for h in self.handles:
            h.remove()


@pytest.mark.parametrize(
    "bad",
    [
        {"gamma": 0},
        {"gamma": -2},
        {"max_gen_len": 0},
        {"max_gen_len": 2.5},
    ],
)
def test_bad_generation_arguments_are_refused_before_any_model_call(models, bad):
    target, drafter = models
    counter = CountingCalls(target, drafter)
    try:
        with pytest.raises(ValueError, match=next(iter(bad))):
            speculative_generate(PROMPT, drafter, target, **bad)
        with pytest.raises(ValueError, match=next(iter(bad))):
            ngram_assisted_speculative_generate(PROMPT, NGramStorage(3, 96), target, **bad)
        if "max_gen_len" in bad:
            with pytest.raises(ValueError, match="max_gen_len"):
                autoregressive_generate(PROMPT, target, **bad)
    finally:
        counter.remove()
    assert counter.calls == 0


def test_drafter_with_another_vocabulary_is_refused_before_any_model_call(models):
    target, _ = models
    other = llama(vocab=80)
    counter = CountingCalls(target, other)
    try:
        with pytest.raises(ValueError, match="vocabularies differ"):
            speculative_generate(PROMPT, other, target)
    finally:
        counter.remove()
    assert counter.calls == 0


class Tokenizer80:
    def __len__(self):
        return 80


def test_vocabularies_differing_only_by_padding_rows_use_the_common_part():
    target = llama(vocab=96, seed=0)
    padded = llama(vocab=104, seed=5)  # 8 more output rows than the target, none of them real tokens
    expected = autoregressive_generate(PROMPT, target, max_gen_len=20, eos_tokens_id=EOS_NEVER, use_cache=True)
    out, _ = speculative_generate(PROMPT, padded, target, tokenizer=Tokenizer80(), max_gen_len=20, eos_tokens_id=EOS_NEVER, use_cache=True)
    # the target's choices are restricted to the 96 rows both have, which holds every token here
    assert out == expected


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: GreedyProcessor(0), "temperature"),
        (lambda: MultinomialProcessor(-1.0), "temperature"),
        (lambda: TopKProcessor(1.0, 0), "top_k"),
        (lambda: TopKProcessor(1.0, 2.5), "top_k"),
        (lambda: NucleusProcessor(1.0, 0.0), "top_p"),
        (lambda: NucleusProcessor(1.0, 1.5), "top_p"),
        (lambda: TopKNucleusProcessor(1.0, 0, 0.5), "top_k"),
        (lambda: TopKNucleusProcessor(1.0, 3, -0.1), "top_p"),
        (lambda: NGramStorage(1, 10), "n must be"),
        (lambda: OneLevelNGramStorage(0, 10), "n must be"),
    ],
)
def test_bad_processor_and_storage_arguments_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    "processor",
    [GreedyProcessor(0.7), MultinomialProcessor(1.3), TopKProcessor(1.0, 3), NucleusProcessor(0.9, 0.5), TopKNucleusProcessor(1.0, 4, 0.7)],
    ids=repr,
)
def test_processors_leave_the_callers_logits_unchanged_and_return_distributions(processor):
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    probs = processor(logits)
    assert torch.equal(logits, before)
    assert torch.allclose(probs.sum(-1), torch.ones(3))
    assert processor.sample(probs).shape == (3, 1)


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    assert (TopKProcessor(1.0, 2)(logits) > 0).sum() == 2
    assert (NucleusProcessor(1.0, 0.6)(logits) > 0).tolist() == [[True, True, False, False, False]]
    assert (NucleusProcessor(1.0, 0.45)(logits) > 0).sum() == 1
    assert (TopKNucleusProcessor(1.0, 3, 0.99)(logits) > 0).sum() == 3
    assert GreedyProcessor().sample(GreedyProcessor()(logits)).item() == 0
