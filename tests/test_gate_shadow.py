"""A gated drafter's cut drafts teach the gate (``DraftPolicy.unverified``): where the gate cut a step's drafts to none,
the plain step's token says whether the first one would have been accepted. Without it, a low rate early held NASD at
no draft through a copy until its probe (the pair's 2001 on costs measured in the loop). Counts on a replayed runner:
no model, no clock; greedy output stays target AR's."""
from typing import List, Tuple

from drafters.ngram import NGramSpec
from drafters.spec import DraftContext
from ngram_assisted import NGramStorage
from sampling import DraftPolicy, GenerationStats, generate
from test_nasd_row_default import VOCAB, _copy_heavy  # 240 prompt ids, three 22-token copies of them
from utils.replayed_runner import ReplayedRunner

# a 2-position pass costs 1.2 one-position passes: at a low early rate one draft does not pay, so the gate cuts to none
COSTS = (1.0, 1.2, 1.34, 1.3, 1.35, 1.3, 1.35, 1.4, 1.45, 1.5, 1.55, 1.6)


def _run(prompt: List[int], ref: List[int]) -> Tuple[int, DraftPolicy]:
    runner = ReplayedRunner(prompt, ref, VOCAB, {i: [t, (t + 1) % VOCAB] for i, t in enumerate(ref)})
    policy = DraftPolicy(min_gain=1.0, row_costs=COSTS, auto=True)
    values = dict(gamma=4, max_gen_len=len(ref), eos_tokens_id=[1], policy=policy, stats=GenerationStats())
    out, _ = generate(prompt, runner, NGramSpec(2, stop_if_unknown=True), values, DraftContext(storage=NGramStorage(8, VOCAB)))
    assert out == ref  # greedy: the target's own tokens, whatever the gate chose
    return runner.forward_passes, policy


def test_a_cut_draft_checked_after_takes_a_copy_sooner(monkeypatch):
    prompt, ref = _copy_heavy(0)
    passes, policy = _run(prompt, ref)
    assert policy.gated and policy.shadowed >= 1
    monkeypatch.setattr(DraftPolicy, "unverified", lambda self, accepted, evidence: None)  # the gate as before
    before, _ = _run(prompt, ref)
    assert passes < before  # 18 against 26 passes
    assert passes <= 20


def test_a_cut_draft_accepted_raises_its_bucket_and_a_rejected_one_does_not():
    policy = DraftPolicy(min_gain=1.0, row_costs=COSTS, auto=True)
    policy.start(4, cheap=True, evidence=True)
    assert policy.gated
    policy.update(2, 0, 3)  # a fruitless first step: a low rate
    low = policy.depths.rate(1, policy.rate(), 7)
    assert policy.trim(11, [7] * 11, 4, 12) == 0  # cut to none at that rate
    for _ in range(3):
        policy.unverified(True, 7)
    assert policy.depths.rate(1, policy.rate(), 7) > low + 0.3
    assert policy.trim(11, [7] * 11, 4, 12) > 0  # a long match now drafts
    rate = policy.rate()
    policy.unverified(False, 7)
    assert policy.rate() < rate


def test_a_policy_without_a_gate_ignores_cut_drafts():
    policy = DraftPolicy(min_gain=1.0, row_costs=COSTS)
    policy.start(4, cheap=False)
    assert not policy.gated
    policy.unverified(True, 7)
    assert (policy.hits, policy.trials, policy.shadowed, len(policy.depths)) == (0.0, 0.0, 0, 0)
