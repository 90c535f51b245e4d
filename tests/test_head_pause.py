"""What the EAGLE-3 head's row pays beyond target AR where its drafts do not pay (issue 71): a paused step runs no head
pass and is target AR's one-position pass; the head catches up on the pause's positions in one pass on resume and
drafts what a head fed every step drafts from the same hidden states; the policy's first length and its probes
follow the given costs and acceptances (never a clock); greedy output stays target AR's."""
import torch

from conftest import EOS_NEVER, PROMPT, llama
from drafters.eagle import EagleDrafter
from sampling import DraftPolicy, GenerationStats, autoregressive_generate, generate
from sampling.draft_policy import RATE_PRIOR
from test_eagle_row import head_for
from utils.logits_processor import GreedyProcessor

COSTS = (1.00, 1.10, 1.14, 1.18, 1.22)  # the embedded model's verification costs by positions (open3.txt's header)
HEAD_COST = 0.099  # its head step's share of a target pass, as measured at start-up
LENGTH = 40


def pausing_policy() -> DraftPolicy:
    return DraftPolicy(row_costs=COSTS, min_gain=1.0)


def test_a_heads_first_step_drafts_the_length_its_prior_rate_pays_for_not_gamma():
    """Property: before any outcome, a drafter whose drafts are passes drafts the count that maximises expected tokens
    per unit of cost at ``RATE_PRIOR``'s rate (here 2, not gamma's 4: at 16% acceptance the 4 drafts cost 0.3 of a
    pass more than 2 for the same tokens); a drafter whose drafts cost nothing still starts at gamma."""
    rate = RATE_PRIOR[0] / RATE_PRIOR[1]

    def paying(k: int) -> float:
        return (1 - rate ** (k + 1)) / (1 - rate) / (COSTS[k] + k * HEAD_COST)

    policy = pausing_policy()
    policy.start(4, cheap=False, drafter_key=None, step_cost=HEAD_COST)
    assert policy.length() == max(range(1, 5), key=paying) == 2
    policy.start(4, cheap=False, drafter_key=None, step_cost=0.001)  # near-free drafts: longer
    assert policy.length() == max(range(1, 5), key=lambda k: (1 - rate ** (k + 1)) / (1 - rate) / (COSTS[k] + 0.001 * k)) == 3
    policy.start(4, cheap=True)
    assert policy.length() == 4


def test_no_probe_of_a_head_with_fewer_tokens_left_than_the_shortest_pause():
    """Property: after a pause, a probe (one drafting step that costs the head's catch-up and a wider pass) is taken
    only while at least ``pause_steps`` tokens are left to repay it; a cheap drafter probes as before."""
    for cheap, probed in ((False, False), (True, True)):
        policy = pausing_policy()
        policy.start(4, cheap=cheap, drafter_key=None, step_cost=HEAD_COST)
        policy.update(policy.length(left=40), 0, 3)  # a fruitless step: paused for pause_steps
        assert policy.paused == policy.pause_steps
        assert [policy.length(left=20 - i) for i in range(policy.pause_steps)] == [0] * policy.pause_steps
        assert (policy.length(left=policy.pause_steps - 1) > 0) == probed
    policy = pausing_policy()
    policy.start(4, cheap=False, drafter_key=None, step_cost=HEAD_COST)
    policy.update(policy.length(left=40), 0, 3)
    assert [policy.length(left=40) for _ in range(policy.pause_steps)] == [0] * policy.pause_steps
    assert policy.length(left=policy.pause_steps) > 0  # enough left: the probe is taken


class Spy(EagleDrafter):
    """The drafter, noting each step it was asked (the tokens, the features it held, the drafts) and its head passes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked, self.passes, self.feeds, self.inside = [], [], [], False

    def propose(self, ids, tokens, k):
        held = None if self.features is None else self.features[: len(tokens) - 1].clone()
        self.inside = True
        count, q = super().propose(ids, tokens, k)
        self.inside = False
        self.asked.append((list(tokens), held, k, ids[0, len(tokens) : len(tokens) + count].tolist()))
        return count, q

    def _draft_step(self, ids, start, **rows):
        self.passes.append(self.inside)
        if "features" in rows:
            self.feeds.append(ids.shape[0])
        return super()._draft_step(ids, start, **rows)


def paused_run():
    target = llama(layers=4, init=0.1, seed=5)
    head = head_for(target)
    made, stats, policy = [], GenerationStats(), pausing_policy()

    def make(prompt, config):
        made.append(Spy(head, config.processor, config.vocab_size))
        return made[-1]

    common = dict(max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=True)
    out = generate(PROMPT, target, make, {**common, "gamma": 4, "policy": policy, "stats": stats})[0]
    reference = autoregressive_generate(PROMPT, target, **common)
    return target, head, made[0], stats, out, reference


def test_a_paused_head_runs_no_pass_and_the_output_is_target_ar():
    """Property: the head's passes are all made on steps that asked it (none while paused), a pause happened, and the
    greedy output is target AR's."""
    _, _, spy, stats, out, reference = paused_run()
    assert out == reference
    assert stats.paused_steps > 0 and len(spy.asked) < len(stats.emitted_by_step)
    assert spy.passes and all(spy.passes)  # each head pass ran inside a propose: none on a step that did not ask it
    assert len(spy.passes) <= sum(max(1, k) for _, _, k, _ in spy.asked)  # a feed, then one pass a further draft


def test_a_catch_up_after_a_pause_drafts_what_a_head_fed_every_step_drafts():
    """Property: a catch-up after a pause (several positions fed in one head pass) drafts the tokens a head fed one
    position a step drafts, given the same hidden states (the features the drafter held)."""
    _, head, spy, _, _, _ = paused_run()
    assert any(rows > 1 for rows in spy.feeds[1:])  # a catch-up over a pause's positions happened
    checked = 0
    for tokens, held, k, drafts in spy.asked:
        if held is None or not drafts:
            continue
        cur = len(tokens)
        fresh = EagleDrafter(head, GreedyProcessor())
        fresh.compiled, fresh.features, fresh.known = False, held, cur - 1
        ids = torch.zeros((1, cur + k + 1), dtype=torch.long)
        ids[0, :cur] = torch.tensor(tokens)
        for step in range(len(PROMPT) + 1, cur):  # the prompt's positions at once, then one position a step
            fresh._feed(ids[0, fresh.fed + 1 : step], step)
        count, _ = fresh.propose(ids, tokens, k)
        assert ids[0, cur : cur + count].tolist() == drafts
        checked += 1
    assert checked >= 2
