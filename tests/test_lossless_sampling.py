"""Sampled speculative output follows the target's own distribution (chi-square against exact enumeration)."""
import itertools
from collections import Counter

import pytest
import torch

from conftest import llama
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
from sampling import autoregressive_generate, speculative_generate
from utils.logits_processor import MultinomialProcessor, NucleusProcessor, TopKProcessor

# 625 generations a test (sample_many: test_eagle, test_drafting_strategies and test_suffix draw as
# many): the power checks still see their biased samplers far past their 1e-6 (skip_sample_adjustment:
# 4e-25, 4e-66 at 1,250; the drafter's own distribution: 0 at both; test_eagle's head that skips the
# residual: 2e-13, 9e-31 at 1,250), where a passing test needs p > 1e-3; 2,500 and 1,250 gave the same
# verdicts at four and two times the cost (issue 70: the suite within 10 minutes)
VOCAB, LENGTH, RUNS = 4, 3, 625
PROMPT = [1, 2, 3, 1, 2]


@pytest.fixture(scope="module")
def tiny_pair():
    """Target and drafter with a 4-token vocabulary and clearly different distributions."""
    return llama(vocab=VOCAB, init=0.3, seed=3), llama(vocab=VOCAB, init=0.3, seed=4)


@torch.no_grad()
def exact_distribution(model, processor, prompt=PROMPT, length=LENGTH, vocab=VOCAB) -> dict:
    """Probability of every continuation of ``length`` tokens over ids ``0..vocab-1``, by enumeration: one pass
    per prefix, the masses multiplied in order."""
    probs = {(): 1.0}
    for _ in range(length):
        grown = {}
        for prefix, mass in probs.items():
            p = processor(model(torch.tensor([prompt + list(prefix)])).logits[0, -1]).tolist()
            for token in range(vocab):
                grown[prefix + (token,)] = mass * p[token]
        probs = grown
    return probs


def chi_square_pvalue(samples: list, probs: dict) -> float:
    """Pearson's test; cells expected fewer than 5 times are pooled."""
    counts, n = Counter(samples), len(samples)
    observed, expected, pool_o, pool_e = [], [], 0, 0.0
    for cell, p in probs.items():
        if n * p < 5:
            pool_o, pool_e = pool_o + counts[cell], pool_e + n * p
        else:
            observed.append(counts[cell])
            expected.append(n * p)
    if pool_e > 0:
        observed.append(pool_o)
        expected.append(pool_e)
    assert sum(counts[c] for c in counts if c not in probs) == 0, "impossible continuation generated"
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    dof = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))


def sample_many(generate) -> list:
    torch.manual_seed(1234)
    return [tuple(generate()) for _ in range(RUNS)]


PROCESSORS = {
    "multinomial": MultinomialProcessor(1.0),
    "topk": TopKProcessor(0.8, 3),
    "nucleus": NucleusProcessor(1.2, 0.8),
}


# processor x cache, as test_cross_tokenizer's grid: the cache changes only how the runners compute logits (every
# processor draws the same seeded tokens with and without it, below; greedy exact in both modes elsewhere), the
# processor only how a token is drawn from them; multinomial (no token truncated) meets both modes, each mode a
# truncating processor too, every processor once (2026-11-30: 6 cells -> 4, ~8 CPU s, single run, noisy)
SAMPLED_GRID = [("multinomial", False), ("multinomial", True), ("nucleus", False), ("topk", True)]


def test_the_sampled_grid_meets_every_processor_and_both_cache_modes():
    assert {name for name, _ in SAMPLED_GRID} == set(PROCESSORS)
    for use_cache in (False, True):
        met = {name for name, cached in SAMPLED_GRID if cached == use_cache}
        assert "multinomial" in met and met - {"multinomial"}, use_cache


@pytest.mark.parametrize("name,use_cache", SAMPLED_GRID, ids=[f"{name}-{'cache' if on else 'no_cache'}" for name, on in SAMPLED_GRID])
def test_sampled_speculative_follows_target_distribution(tiny_pair, name, use_cache):
    target, drafter = tiny_pair
    processor = PROCESSORS[name]
    samples = sample_many(lambda: speculative_generate(
        PROMPT, drafter, target, gamma=2, logits_processor=processor, max_gen_len=LENGTH, eos_tokens_id=[],
        use_cache=use_cache, first_target=False,
    )[0])
    assert chi_square_pvalue(samples, exact_distribution(target, processor)) > 1e-3


def test_skip_sample_adjustment_is_detectably_lossy(tiny_pair):
    """The test above has the power to see a biased sampler: without the residual, it fails."""
    target, drafter = tiny_pair
    processor = PROCESSORS["multinomial"]
    samples = sample_many(lambda: speculative_generate(
        PROMPT, drafter, target, gamma=2, logits_processor=processor, max_gen_len=LENGTH, eos_tokens_id=[],
        use_cache=True, first_target=False, skip_sample_adjustment=True,
    )[0])
    assert chi_square_pvalue(samples, exact_distribution(target, processor)) < 1e-6


def test_sampling_from_the_drafter_is_detectably_different(tiny_pair):
    target, drafter = tiny_pair
    processor = PROCESSORS["multinomial"]
    samples = sample_many(lambda: autoregressive_generate(PROMPT, drafter, LENGTH, processor, eos_tokens_id=[], use_cache=True))
    assert chi_square_pvalue(samples, exact_distribution(target, processor)) < 1e-6


@pytest.mark.parametrize("use_cache", [False, True], ids=["no_cache", "cache"])
@pytest.mark.parametrize("name", ["multinomial", "topk"])
def test_sampled_ngram_assisted_follows_target_distribution(tiny_pair, name, use_cache):
    target, _ = tiny_pair
    processor = PROCESSORS[name]
    stats_accepted = []

    def run():
        out, rate = ngram_assisted_speculative_generate(
            PROMPT, NGramStorage(2, VOCAB), target, gamma=2, filler_top_k=1, logits_processor=processor,
            max_gen_len=LENGTH, eos_tokens_id=[], use_cache=use_cache, first_target=False,
        )
        stats_accepted.append(rate)
        return out

    samples = sample_many(run)
    assert sum(stats_accepted) > 0, "some drafts must be accepted for the test to mean anything"
    assert chi_square_pvalue(samples, exact_distribution(target, processor)) > 1e-3


@pytest.mark.parametrize("name", sorted(PROCESSORS))
def test_sampled_output_identical_with_and_without_cache(tiny_pair, name):
    """Every processor draws the same seeded tokens with and without the cache: what lets SAMPLED_GRID meet each
    processor in one cache mode only (the chi-square of one mode is the other's)."""
    target, drafter = tiny_pair
    outputs = []
    for use_cache in (False, True):
        torch.manual_seed(7)
        outputs.append([
            speculative_generate(PROMPT, drafter, target, gamma=3, logits_processor=PROCESSORS[name], max_gen_len=20,
                                 eos_tokens_id=[], use_cache=use_cache)[0]
            for _ in range(5)
        ])
    assert outputs[0] == outputs[1]


def test_exact_distribution_sums_to_one(tiny_pair):
    assert abs(sum(exact_distribution(tiny_pair[0], PROCESSORS["nucleus"]).values()) - 1) < 1e-9
    assert all(len(c) == LENGTH for c in itertools.islice(exact_distribution(tiny_pair[0], PROCESSORS["topk"]), 3))
