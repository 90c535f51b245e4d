"""Prompt lookup, chained drafters and draft policies: exact when greedy, lossless when sampling."""
import pytest
import torch

from conftest import EOS_NEVER, PROMPT, llama, perturbed_copy
from drafters import ChainedSpec, DraftContext, PromptLookupSpec
from drafters.prompt_lookup import lookup_continuation
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
from sampling import DraftPolicy, GenerationStats, measure_draft_cost, measure_row_costs, autoregressive_generate, generate, speculative_generate
from test_lossless_sampling import LENGTH, PROCESSORS, PROMPT as TINY_PROMPT, chi_square_pvalue, exact_distribution, sample_many, tiny_pair  # noqa: F401

POLICIES = {
    "fixed": lambda: None,
    "adaptive": lambda: DraftPolicy(adaptive=True),
    "min_draft": lambda: DraftPolicy(min_draft=3),
    "pause": lambda: DraftPolicy(pause_after=1, pause_steps=2),
    "p_min": lambda: DraftPolicy(p_min=0.5),
    "min_gain": lambda: DraftPolicy(min_gain=1.5, pause_steps=2),
    "all": lambda: DraftPolicy(adaptive=True, min_draft=2, pause_after=2, pause_steps=3, p_min=0.3),
    "padded": lambda: DraftPolicy(row_costs=(1.0, 3.0, 3.0, 2.0, 1.5, 1.5, 1.5, 1.5), min_gain=0.5, pause_steps=2),
    "draft_cost": lambda: DraftPolicy(row_costs=(1.0, 1.1, 1.2, 1.2, 1.3), draft_cost=0.4, min_gain=1.0, pause_steps=2),
}


@pytest.fixture(scope="module")
def models():
    target = llama()
    return target, perturbed_copy(target, 0.2, seed=1)


def run_all(target, drafter, policy_factory, use_cache, **kw):
    vocab = target.config.vocab_size
    common = dict(max_gen_len=50, eos_tokens_id=EOS_NEVER, use_cache=use_cache, **kw)
    return {
        "speculative": speculative_generate(PROMPT, drafter, target, gamma=3, policy=policy_factory(), **common)[0],
        "ngram": ngram_assisted_speculative_generate(PROMPT, NGramStorage(3, vocab), target, gamma=3, policy=policy_factory(), **common)[0],
        "pld": generate(PROMPT, target, PromptLookupSpec(num_pred_tokens=4), dict(policy=policy_factory(), **common))[0],
        "chained": generate(PROMPT, target, ChainedSpec(), dict(gamma=3, policy=policy_factory(), **common),
                            DraftContext(storage=NGramStorage(3, vocab), drafter=drafter))[0],
    }


@pytest.mark.parametrize("use_cache", [False, True], ids=["no_cache", "cache"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_greedy_drafting_strategies_equal_autoregressive_under_every_policy(models, policy, use_cache):
    target, drafter = models
    expected = autoregressive_generate(PROMPT, target, max_gen_len=50, eos_tokens_id=EOS_NEVER, use_cache=use_cache)
    for name, out in run_all(target, drafter, POLICIES[policy], use_cache).items():
        assert out == expected, name


@pytest.mark.parametrize("min_ngram, max_ngram, tokens", [(1, 1, 1), (1, 3, 10), (2, 4, 5), (3, 3, 2)])
def test_greedy_prompt_lookup_equals_autoregressive_for_any_parameters(models, min_ngram, max_ngram, tokens):
    target, _ = models
    expected = autoregressive_generate(PROMPT, target, max_gen_len=60, eos_tokens_id=EOS_NEVER, use_cache=True)
    spec = PromptLookupSpec(num_pred_tokens=tokens, max_ngram_size=max_ngram, min_ngram_size=min_ngram)
    out, rate = generate(PROMPT, target, spec, dict(max_gen_len=60, eos_tokens_id=EOS_NEVER, use_cache=True))
    assert out == expected and 0.0 <= rate <= 1.0


def test_lookup_finds_the_earliest_occurrence_of_the_longest_suffix():
    tokens = [1, 2, 3, 9, 1, 2, 3, 8, 5, 2, 3]
    assert lookup_continuation(tokens, 1, 3, 2) == [9, 1]  # "2 3" first seen at 1, followed by 9 1
    assert lookup_continuation([4, 5, 6, 4, 5], 2, 2, 3) == [6, 4, 5]
    assert lookup_continuation([4, 5, 6], 1, 3, 3) == []
    assert lookup_continuation([7, 1, 7], 1, 1, 5) == [1, 7]


def test_prompt_lookup_refuses_bad_parameters(models):
    target, _ = models
    for kwargs in ({"num_pred_tokens": 0}, {"min_ngram_size": 0}, {"min_ngram_size": 3, "max_ngram_size": 2}):
        with pytest.raises(ValueError):
            generate(PROMPT, target, PromptLookupSpec(**kwargs))


def test_adaptive_length_shrinks_after_a_rejection_and_regrows_up_to_gamma():
    policy = DraftPolicy(adaptive=True)
    policy.start(6)
    policy.update(6, 2)
    assert policy.length() == 5
    for _ in range(10):
        policy.update(policy.gamma, 0)
    assert policy.length() == 1
    policy.update(1, 1)
    assert policy.length() == 3
    for _ in range(10):
        policy.update(policy.gamma, policy.gamma)
    assert policy.length() == 6  # gamma is the bound: full acceptance never drafts past it


def test_adaptive_length_may_grow_past_gamma_only_with_auto():
    policy = DraftPolicy(adaptive=True, auto=True, row_costs=(1.0,) * 10, max_gamma=8)
    policy.start(4)
    for _ in range(10):
        policy.update(policy.gamma, policy.gamma)
    assert policy.gamma == 8  # the longest measured pass (9 positions) less its bonus, within max_gamma


def test_pause_after_fruitless_steps_doubles_until_a_draft_pays():
    policy = DraftPolicy(pause_after=2, pause_steps=3)
    policy.start(4)
    policy.update(4, 0)
    policy.update(4, 0)
    assert [policy.length() for _ in range(4)] == [0, 0, 0, 4]
    policy.update(4, 0)  # right after a pause, one fruitless step pauses again, twice as long
    assert [policy.length() for _ in range(7)] == [0] * 6 + [4]
    policy.update(4, 1)  # a draft paid: back to the short pause
    policy.update(4, 0)
    policy.update(4, 0)
    assert [policy.length() for _ in range(4)] == [0, 0, 0, 4]
    assert policy.paused_steps == 12


def test_cost_aware_pause_when_drafting_steps_emit_too_few_tokens():
    policy = DraftPolicy(min_gain=1.5, pause_steps=2)
    policy.start(4)
    policy.update(4, 3)  # 4 tokens: pays
    policy.update(4, 0)  # mean (4 + 1) / 2 = 2.5: still pays
    assert policy.length() == 4
    policy.update(4, 0)  # mean 1.75
    policy.update(4, 0)  # mean 1.375 < 1.5: pause
    assert [policy.length() for _ in range(3)] == [0, 0, 4]
    policy.update(4, 0)  # the probe fails: (1.5 + 1) / 2 < 1.5, twice as long
    assert [policy.length() for _ in range(5)] == [0, 0, 0, 0, 4]
    policy.update(4, 2)  # the probe pays: back to short pauses
    assert policy.next_pause == 2


def test_passes_are_padded_to_the_cheapest_measured_length():
    policy = DraftPolicy(row_costs=(1.0, 1.6, 1.8, 1.6, 1.35, 1.4, 1.5))
    assert [policy.rows(k, 100) for k in range(8)] == [1, 5, 5, 5, 5, 6, 7, 8]
    assert policy.rows(1, 3) == 2  # never past the generation's end
    assert DraftPolicy().rows(2, 100) == 3  # costs unknown: no padding
    assert policy.cost(5) == 1.35 and policy.cost(9) == pytest.approx(1.5 + 2 * 0.5 / 6)


def test_cost_aware_pause_counts_tokens_per_unit_of_measured_cost():
    policy = DraftPolicy(min_gain=0.9, pause_steps=2, row_costs=(1.0, 2.0, 2.0, 2.0, 1.5))
    policy.start(4)
    policy.update(4, 1, rows=5)  # 2 tokens for 1.5: pays
    assert policy.length() == 4
    policy.update(4, 0, rows=5)  # mean (1.33 + 0.67) / 2 = 1.0: still pays
    assert policy.length() == 4
    policy.update(4, 0, rows=5)  # mean 0.83 < 0.9: pause
    assert [policy.length() for _ in range(3)] == [0, 0, 4]


def test_draft_length_maximises_expected_tokens_per_unit_of_cost():
    costs = (1.0, 1.6, 1.8, 1.6, 1.35, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9)
    policy = DraftPolicy(row_costs=costs)
    policy.start(10)
    assert policy.length() == 10  # nothing known yet: gamma
    for _ in range(5):
        policy.update(10, 0, rows=11)
    assert policy.length() == 1  # drafts fail: the shortest of the cheapest passes (padded to 5 positions)
    for _ in range(20):
        policy.update(10, 10, rows=11)
    assert policy.length() == 10  # drafts pay: all of gamma
    policy.start(4)
    for _ in range(20):
        policy.update(4, 4, rows=5)
    assert policy.length() == 4 and policy.length(longest=10) == 10  # with auto the loop asks past gamma
    assert DraftPolicy().length() == 1 and DraftPolicy.expected_tokens(3, 0.5) == 1.875


def test_measured_row_costs_are_relative_to_one_position(models):
    target, _ = models
    costs = DraftPolicy(row_costs=measure_row_costs(target, max_rows=6, context=16, repeats=2)).row_costs
    assert len(costs) == 6 and costs[0] == 1.0 and all(c > 0 for c in costs)


def test_a_drafter_models_measured_cost_makes_a_slow_drafter_pause_and_draft_shorter():
    costs = (1.0, 1.1, 1.1, 1.2, 1.2)
    model, cheap = DraftPolicy(row_costs=costs, draft_cost=0.7, min_gain=1.0, pause_steps=4), DraftPolicy(row_costs=costs, draft_cost=0.7, min_gain=1.0, pause_steps=4)
    model.start(4, cheap=False)
    cheap.start(4, cheap=True)  # n-gram storage, prompt lookup: the drafter's cost is not counted
    assert model.step_cost(4, rows=5) == pytest.approx(1.2 + 4 * 0.7) and cheap.step_cost(4, rows=5) == 1.2
    for policy in (model, cheap):
        policy.update(4, 1, rows=5)  # 2 tokens: pays for the cheap drafter, not for the model (4.0)
    assert model.length() == 0 and cheap.length() > 0
    # depth-blind (by depth, 2 of 4 accepted every step says: draft 2, whatever the cost)
    outcomes = DraftPolicy(row_costs=costs, draft_cost=0.7, by_depth=False)
    outcomes.start(4, cheap=False)
    for _ in range(10):
        outcomes.update(4, 2, rows=5)  # acceptance 2/3: the drafter's passes make short drafts better
    free = DraftPolicy(row_costs=costs, by_depth=False)
    free.start(4, cheap=False)
    for _ in range(10):
        free.update(4, 2, rows=5)
    assert outcomes.length() < free.length() == 4


def test_a_policy_with_memory_remembers_a_useless_drafter_model_and_starts_its_next_generation_paused(models):
    target, _ = models
    useless = llama(seed=99)  # another random model: its drafts are almost never right
    policy = DraftPolicy(row_costs=(1.0, 1.1, 1.1, 1.2, 1.2), draft_cost=0.7, min_gain=1.0, pause_steps=4, remember=True)
    common = dict(gamma=4, max_gen_len=60, eos_tokens_id=EOS_NEVER, use_cache=True, policy=policy)
    reference = autoregressive_generate(PROMPT, target, 60, eos_tokens_id=EOS_NEVER, use_cache=True)
    first, second = GenerationStats(), GenerationStats()
    assert speculative_generate(PROMPT, useless, target, stats=first, **common)[0] == reference
    assert speculative_generate(PROMPT, useless, target, stats=second, **common)[0] == reference
    assert second.paused_steps > first.paused_steps and second.drafted < first.drafted
    fresh = GenerationStats()  # another drafter model is not judged by this one's record
    speculative_generate(PROMPT, perturbed_copy(useless, 0.0, seed=2), target, stats=fresh, **common)
    assert fresh.drafted >= first.drafted


def test_measured_draft_cost_is_relative_to_one_target_pass(models):
    target, drafter = models
    cost = measure_draft_cost(drafter, target, context=16, repeats=3)
    assert 0 < cost < 10 and DraftPolicy(draft_cost=cost).draft_cost == cost


def test_min_draft_drops_short_drafts_and_bad_policies_are_refused():
    assert DraftPolicy(min_draft=3).keep(2) == 0 and DraftPolicy(min_draft=3).keep(3) == 3
    for bad in ({"min_draft": -1}, {"p_min": 1.0}, {"p_min": -0.1}, {"pause_after": 1.5}, {"min_gain": -1},
                {"row_costs": ()}, {"row_costs": (1.0, 0.0)}, {"draft_cost": -0.5}, {"draft_cost": "1"}):
        with pytest.raises(ValueError):
            DraftPolicy(**bad)


def test_pausing_keeps_a_useless_drafter_close_to_plain_decoding(models):
    target, _ = models
    useless = llama(seed=99)  # another random model: its drafts are almost never right
    plain, paused = GenerationStats(), GenerationStats()
    common = dict(gamma=4, max_gen_len=80, eos_tokens_id=EOS_NEVER, use_cache=True)
    speculative_generate(PROMPT, useless, target, stats=plain, **common)
    out, _ = speculative_generate(PROMPT, useless, target, stats=paused, policy=DraftPolicy(pause_after=2, pause_steps=4), **common)
    assert out == autoregressive_generate(PROMPT, target, max_gen_len=80, eos_tokens_id=EOS_NEVER, use_cache=True)
    assert plain.accepted <= 2 and paused.paused_steps > 30
    assert paused.drafted < plain.drafted / 3  # far less drafting (and verifying) work wasted


def test_p_min_stops_the_drafter_when_it_is_not_confident():
    target = llama(init=0.2, seed=3)
    drafter = perturbed_copy(target, 0.3, seed=1)
    free, cut = GenerationStats(), GenerationStats()
    common = dict(gamma=6, max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=True)
    expected = autoregressive_generate(PROMPT, target, max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=True)
    assert speculative_generate(PROMPT, drafter, target, stats=free, **common)[0] == expected
    assert speculative_generate(PROMPT, drafter, target, stats=cut, policy=DraftPolicy(p_min=0.1), **common)[0] == expected
    assert 0 < cut.drafted < free.drafted / 2
    assert cut.acceptance_rate > free.acceptance_rate  # what it still drafts, it drafts well


def test_chained_drafter_uses_the_storage_when_it_knows_and_the_model_otherwise(models):
    target, drafter = models
    stats = GenerationStats()
    generate(PROMPT, target, ChainedSpec(), dict(gamma=4, max_gen_len=60, eos_tokens_id=EOS_NEVER, use_cache=True, stats=stats),
             DraftContext(storage=NGramStorage(3, 96), drafter=drafter))
    ngram_only, model_only = GenerationStats(), GenerationStats()
    ngram_assisted_speculative_generate(PROMPT, NGramStorage(3, 96), target, gamma=4, max_gen_len=60, eos_tokens_id=EOS_NEVER,
                                        use_cache=True, stop_if_unknown=True, stats=ngram_only)
    assert stats.drafted > ngram_only.drafted  # the model filled in where the storage knew nothing
    assert stats.accepted > 0


@pytest.mark.parametrize("use_cache", [False, True], ids=["no_cache", "cache"])
def test_sampled_prompt_lookup_follows_target_distribution(tiny_pair, use_cache):
    target, _ = tiny_pair
    processor = PROCESSORS["multinomial"]
    samples = sample_many(lambda: generate(TINY_PROMPT, target, PromptLookupSpec(num_pred_tokens=2), dict(
        logits_processor=processor, max_gen_len=LENGTH, eos_tokens_id=[], use_cache=use_cache, first_target=False))[0])
    assert chi_square_pvalue(samples, exact_distribution(target, processor)) > 1e-3


@pytest.mark.parametrize("name", ["multinomial", "topk"])
def test_sampled_chained_drafting_follows_target_distribution(tiny_pair, name):
    target, drafter = tiny_pair
    processor = PROCESSORS[name]
    samples = sample_many(lambda: generate(TINY_PROMPT, target, ChainedSpec(filler_top_k=1), dict(
        gamma=2, logits_processor=processor, max_gen_len=LENGTH, eos_tokens_id=[], use_cache=True, first_target=False),
        DraftContext(storage=NGramStorage(2, 4), drafter=drafter))[0])
    assert chi_square_pvalue(samples, exact_distribution(target, processor)) > 1e-3


def test_sampled_speculative_with_adaptive_length_and_p_min_follows_target_distribution(tiny_pair):
    target, drafter = tiny_pair
    processor = PROCESSORS["multinomial"]
    samples = sample_many(lambda: speculative_generate(
        TINY_PROMPT, drafter, target, gamma=1, logits_processor=processor, max_gen_len=LENGTH, eos_tokens_id=[],
        use_cache=True, first_target=False, policy=DraftPolicy(adaptive=True, p_min=0.2))[0])
    assert chi_square_pvalue(samples, exact_distribution(target, processor)) > 1e-3


def test_streamer_sees_every_emitted_token_in_order(models):
    target, drafter = models
    seen = []
    out, _ = speculative_generate(PROMPT, drafter, target, gamma=3, max_gen_len=30, eos_tokens_id=EOS_NEVER, use_cache=True,
                                  streamer=lambda tokens, n_drafted: seen.append((list(tokens), n_drafted)))
    assert [t for tokens, _ in seen for t in tokens] == out
    assert all(0 <= n < len(tokens) for tokens, n in seen)
    streamed = []
    autoregressive_generate(PROMPT, target, max_gen_len=5, eos_tokens_id=EOS_NEVER, streamer=lambda t, n: streamed.extend(t))
    assert len(streamed) == 5
