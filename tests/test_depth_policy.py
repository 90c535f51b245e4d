"""The calibrated policy's acceptance by draft depth and by the drafter's evidence (issue 56): a copy
that grows likelier deeper drafts longer than the depth-blind estimate, flat low acceptance still
pauses, a long match is told from a short one, and greedy output stays target AR's."""
import random

import pytest

from drafters import DraftContext, NGramSpec, PromptLookupSpec
from drafters.prompt_lookup import lookup_with_match
from drafters.suffix import SuffixSpec
from ngram_assisted import NGramStorage
from sampling import DraftPolicy, GenerationStats, generate
from sampling.depth_acceptance import DepthAcceptance, bucket
from sampling.tree_decoding import TreeRecord
from sampling.tree_shape import rank_estimates

# a pass over r positions costs 1 + 0.12 (r - 1) one-position passes: as on the project's CPU, 12 measured
COSTS = tuple(1.0 + 0.12 * r for r in range(12))


def _simulate(policy: DraftPolicy, rates, steps: int = 400, seed: int = 0, gamma: int = 10):
    """Run ``policy`` against a drafter whose ``d``-th draft is accepted with ``rates[d - 1]`` given
    the ones before were; returns (mean drafts per drafting step, paused steps, tokens per unit of cost)."""
    rng = random.Random(seed)
    policy.start(gamma)
    drafted = drafting = tokens = cost = 0.0
    for _ in range(steps):
        k = policy.length(policy.bound())
        accepted = 0
        while accepted < k and rng.random() < rates[min(accepted, len(rates) - 1)]:
            accepted += 1
        rows = policy.rows(k, 1 << 30)
        policy.update(k, accepted, rows)
        drafted, drafting = drafted + k, drafting + (k > 0)
        tokens, cost = tokens + accepted + 1, cost + policy.cost(rows)
    return drafted / max(1.0, drafting), policy.paused_steps, tokens / cost


def test_acceptance_rising_with_depth_drafts_longer_than_the_depth_blind_estimate():
    copy = [0.55] + [0.97] * 11  # the first draft is a guess; once it is right, the copy goes on
    deep, deep_paused, deep_rate = _simulate(DraftPolicy(row_costs=COSTS, min_gain=1.0), copy)
    blind, blind_paused, blind_rate = _simulate(DraftPolicy(row_costs=COSTS, min_gain=1.0, by_depth=False), copy)
    assert deep > blind + 1.0 and deep_rate > 1.3 * blind_rate and deep_paused < blind_paused  # fewer noisy pauses
    auto, _, auto_rate = _simulate(DraftPolicy(row_costs=COSTS, min_gain=1.0, auto=True), copy, gamma=4)
    assert auto > 6 and auto_rate > 1.3  # gamma auto goes past gamma, up to the 11 drafts measured


def test_flat_low_acceptance_still_pauses():
    flat = [0.1] * 12
    _, deep_paused, deep_rate = _simulate(DraftPolicy(row_costs=COSTS, min_gain=1.0), flat)
    _, blind_paused, blind_rate = _simulate(DraftPolicy(row_costs=COSTS, min_gain=1.0, by_depth=False), flat)
    assert deep_paused > 300 and deep_paused >= blind_paused - 10 and deep_rate == pytest.approx(blind_rate, abs=0.03)
    assert deep_rate > 0.95  # close to plain decoding (1.0 token per unit of cost)


def test_evidence_buckets_tell_a_long_match_from_a_short_one():
    policy = DraftPolicy(row_costs=COSTS, min_gain=1.0)
    policy.start(10)
    for _ in range(30):  # a long match copies on, a one-token match is a wrong guess
        k = policy.trim(10, [20] * 10, planned=4, limit=1 << 30)
        policy.update(k, k, rows=k + 1)
        k = policy.trim(10, [1] * 10, planned=4, limit=1 << 30)
        policy.update(k, 0, rows=k + 1)
    assert policy.trim(10, [24] * 10, planned=2, limit=1 << 30) == 10
    # a one-token match's depth 1 fails; past it, depth 2 is only known from long matches (pooled)
    assert policy.trim(10, [1] * 10, planned=2, limit=1 << 30) <= 5
    assert policy.trim(10, None, planned=3, limit=1 << 30) == 3  # no evidence: the planned length
    assert policy.depths.rate(1, 0.5, 20) > 0.8 > 0.2 > policy.depths.rate(1, 0.5, 1)
    assert policy.describe(10).count("by draft depth and evidence") == 1


def test_few_observations_do_not_swing_the_estimate():
    depths = DepthAcceptance()
    assert depths.rate(5, 0.6) == 0.6 and depths.rate(5, 0.6, 40) == 0.6  # never seen: the parent's
    depths.observe(3, 2)  # depths 1, 2 accepted, 3 rejected, 4+ not tried
    assert 0.6 < depths.rate(1, 0.6) < 1.0 and 0.0 < depths.rate(3, 0.6) < 0.6
    assert depths.rate(4, 0.6) == depths.rate(3, 0.6)  # never tried: guessed from the depth before it
    assert depths.expected(2, 0.6)[0] == 1.0 and [bucket(e) for e in (0, 1, 3, 4, 20, 500)] == [0, 1, 2, 3, 5, 6]


def test_tree_record_learns_each_depth_toward_its_ranks_rate():
    record = TreeRecord()
    chain = [-1, 0, 1, 2]
    children = [[0], [1], [2], [3], []]
    for _ in range(10):  # the first level fails half the time, deeper levels always follow
        record.update(children, [0, 1, 2, 3])
        record.update(children, [])
    deep = rank_estimates(record.rate, chain)
    assert record.rate(0, 1) < record.rate(0, 3) and deep[3] / deep[2] > 0.9


def test_a_tree_depth_no_longer_reached_fades_to_its_ranks_rate():
    """A long copy ends: once no tree reaches depth 4 again, its cell decays every step (as
    ``DepthAcceptance``'s do for chains) and its estimate returns to the rank's pooled rate rather
    than keeping the copy's promise."""
    record = TreeRecord()
    children = [[0], [1], [2], [3], []]
    for _ in range(10):
        record.update(children, [0, 1, 2, 3])
    assert record.rate(0, 4) > 0.8
    for _ in range(60):  # the first level fails every step: depth 4 is never reached
        record.update(children, [])
    assert record.rate(0) < 0.1 and abs(record.rate(0, 4) - record.rate(0)) < 0.02


def test_prompt_lookup_reports_how_verbatim_its_match_is():
    text = [5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]
    assert lookup_with_match(text, 1, 3, 3) == ([3, 4, 5], 7)  # "5 6 7 8" before "9 1 2" too, up to the start
    assert lookup_with_match([4, 5, 6, 9, 5, 6], 1, 3, 2) == ([9, 5], 2)


SPECS = {
    "pld": lambda: (PromptLookupSpec(num_pred_tokens=10), DraftContext()),
    "nasd": lambda: (NGramSpec(), DraftContext(storage=NGramStorage(3, 96))),
    "suffix": lambda: (SuffixSpec(), DraftContext()),
}


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("auto", [False, True])
def test_greedy_output_with_the_depth_policy_is_target_ar(name, auto):
    from drafting import MODELS, _expected, _model, _runner
    from conftest import EOS_NEVER, PROMPT

    drafted = accepted = 0
    for model in MODELS:
        # the prompt, its greedy continuation, the prompt again: the lookups find long matches to copy
        prompt = list(PROMPT) + list(_expected(model, "dynamic", tuple(PROMPT), 40)) + list(PROMPT)
        for cache in ("dynamic", "off"):
            spec, context = SPECS[name]()
            stats = GenerationStats()
            policy = DraftPolicy(row_costs=COSTS, min_gain=1.0, auto=auto)
            arguments = dict(max_gen_len=32, eos_tokens_id=EOS_NEVER, stats=stats, gamma=4, policy=policy, **_runner(cache))
            out, _ = generate(prompt, _model(model), spec, arguments, context)
            assert out == list(_expected(model, cache, tuple(prompt), 32)), (model, cache)
            drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert accepted > 0


def test_one_fruitless_step_does_not_cut_a_gated_drafter_to_no_draft():
    # the pair's NASD: a first draft that failed made the pooled rate 0, and the gate then drafted nothing
    # for pause_steps steps, through a copy of 8 tokens and one of 25 (code_editing 2002, float32 costs)
    flat = (1.0, 1.01, 1.02, 1.03, 1.04, 1.05)  # verifying 5 drafts costs 5% more than none
    policy = DraftPolicy(row_costs=flat, min_gain=1.0)
    policy.start(4, cheap=True, evidence=True)
    assert policy.gated
    k = policy.trim(5, [2] * 5, planned=5, limit=1 << 30)
    policy.update(k, 0, rows=k + 1)
    assert k > 0 and policy.trim(5, [2] * 5, planned=5, limit=1 << 30) > 0
    for _ in range(12):  # drafts that keep failing are still cut to none, learnt per depth within a few steps
        k = policy.trim(5, [2] * 5, planned=5, limit=1 << 30)
        policy.update(k, 0, rows=k + 1)
    assert policy.trim(5, [2] * 5, planned=5, limit=1 << 30) == 0
    ungated = DraftPolicy(row_costs=flat, min_gain=1.0, gate=False)
    ungated.start(4, cheap=True, evidence=True)
    ungated.update(4, 0, rows=5)
    assert ungated.rate() == 0.0  # the rate is the recent steps' alone where no gate cuts to zero
