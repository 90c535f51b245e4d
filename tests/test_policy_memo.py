"""The policy's remembered answers (issue 71: a gated drafter's policy asked the same cost-optimal counts step after
step while its drafts were cut to none): ``DepthAcceptance.expected`` until its cells change, ``DraftPolicy._best``
until the costs or the estimate move. Property: a policy that remembers decides every step as one that forgets
everything before each call, through pauses, probes, live cost refreshes and learning; seeded, a fake clock."""
import random

import pytest

from sampling import DraftPolicy
from sampling.depth_acceptance import DepthAcceptance

COSTS = tuple(1.0 + 0.12 * r for r in range(12))


def _forget(policy: DraftPolicy) -> None:
    policy._bests.clear()
    policy.depths._answers.clear()


def _run(policy: DraftPolicy, seed: int, forget: bool, steps: int = 300) -> list:
    """A gated drafter's steps on ``policy`` (lengths, asks, trims of random evidence, outcomes, clock readings):
    every decision, in order. ``forget``: the remembered answers dropped before each call."""
    rng, decisions = random.Random(seed), []
    policy.start(4, cheap=True, evidence=True)
    hit = 0.05  # open text: drafts rarely accepted; a copy now and then
    for step in range(steps):
        if step % 60 == 30:
            hit = 0.9 if hit < 0.5 else 0.05
        forget and _forget(policy)
        k = policy.length(policy.bound())
        forget and _forget(policy)
        asked = policy.ask(k) if k else 0
        evidence = [rng.choice([0, 1, 2, 3, 5, 9, 17]) for _ in range(asked)]
        forget and _forget(policy)
        kept = policy.trim(asked, evidence, k, 64) if asked else 0
        accepted = 0
        while accepted < kept and rng.random() < hit:
            accepted += 1
        rows = policy.rows(kept, 64)
        forget and _forget(policy)
        policy.update(kept, accepted, rows)
        policy.measured(rows, 0.014 * policy.cost(rows) * rng.uniform(0.9, 1.1), 1e-5 * rng.uniform(1, 3), asked > 0, kept)
        decisions.append((k, asked, kept, accepted, rows, policy.paused))
    return decisions


@pytest.mark.parametrize("auto", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_remembering_policy_decides_as_a_forgetting_one(auto, seed):
    make = lambda: DraftPolicy(row_costs=COSTS, min_gain=1.0, auto=auto, live=True)  # noqa: E731
    remembered, forgot = _run(make(), seed, forget=False), _run(make(), seed, forget=True)
    assert remembered == forgot
    assert sum(kept == 0 and asked > 0 for _, asked, kept, *_ in remembered) > 50  # many steps the gate cut to none
    assert any(kept > 1 for _, _, kept, *_ in remembered)  # and copies drafted long


def test_expected_is_computed_once_until_the_cells_change(monkeypatch):
    depths, computed = DepthAcceptance(), []
    shrunk = DepthAcceptance._shrunk
    monkeypatch.setattr(DepthAcceptance, "_shrunk", lambda self, key, prior: computed.append(key) or shrunk(self, key, prior))
    depths.observe(3, 1, [4, 4, 4])
    first = depths.expected(6, 0.4, [4] * 6)
    asked = len(computed)
    assert depths.expected(6, 0.4, [4] * 6) is first and len(computed) == asked  # remembered: nothing computed
    assert depths.expected(6, 0.5, [4] * 6) != first  # another prior: computed
    depths.observe(2, 2, [4, 4])
    assert depths.expected(6, 0.4, [4] * 6) is not first  # the cells moved: computed anew
