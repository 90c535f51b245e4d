"""The draft policy's costs measured in the loop (``sampling.live_costs``) and the evidence gate of cheap
drafters: each decision is a pure function of the given seconds and acceptance outcomes (no clock is
read here), and a live, gated policy keeps greedy output target AR's."""
import pytest

from sampling import DraftPolicy, GenerationStats, generate
from sampling.live_costs import PRIOR, REFRESH, LiveCosts

COSTS = tuple(1.0 + 0.05 * r for r in range(12))  # start-up: a pass over r positions costs 1 + 0.05 (r - 1)


def test_one_width_seen_alone_keeps_the_startup_costs():
    live = LiveCosts(COSTS)
    for _ in range(3 * REFRESH):
        live.observe(5, 0.030, 0.0, False)  # whatever its seconds, nothing relative is learned from one width
    assert live.costs == pytest.approx(COSTS) and live.draft == 0.0
    assert live.seconds == pytest.approx(0.030 / COSTS[4])


def test_wide_passes_dearer_in_the_loop_move_the_costs_toward_what_the_run_pays():
    live = LiveCosts(COSTS)
    for _ in range(4 * REFRESH):  # the run pays 2x for five positions (the start-up measured 1.2x), 1 ms drafting
        live.observe(1, 0.010, 0.0, False)
        live.observe(5, 0.020, 0.001, True)
    assert 1.6 < live.costs[4] < 2.0  # shrunk toward 1.2 by PRIOR pseudo-observations, but mostly the run's
    assert live.costs[0] == 1.0 and live.costs[2] == pytest.approx((1 + (live.costs[4] / COSTS[4] - 1) / 2) * COSTS[2])
    assert live.costs[7] == pytest.approx(COSTS[7] * live.costs[4] / COSTS[4])  # past the widths seen: the nearest one's ratio
    assert live.draft == pytest.approx(0.1) and live.seconds == pytest.approx(0.010)
    assert "costs in the loop over 64 steps: a one-position step 10.0 ms" in live.line() and "drafting 0.100" in live.line()


def _model_drafter(seconds_a_draft: float, live: bool = True) -> DraftPolicy:
    """A policy for a drafter model whose drafts cost 0.33 of a one-position pass at start-up and
    ``seconds_a_draft`` (with a 10 ms one-position step) in the loop; 9 of 10 drafts accepted, by depth blind."""
    policy = DraftPolicy(row_costs=COSTS, draft_cost=0.33, min_gain=1.0, live=live, by_depth=False)
    policy.start(11, cheap=False)
    for _ in range(12):
        policy.update(10, 9, 11)
    for _ in range(4 * REFRESH):
        k = policy.length()
        policy.measured(1, 0.010, 0.0, False)
        policy.measured(k + 1, 0.010 * COSTS[k], k * seconds_a_draft, True, k)
    return policy


def test_a_drafter_models_drafts_are_priced_each_as_the_loop_paid_them_never_twice():
    """A drafting step's seconds are its drafts (a model's passes): priced per draft, not also as a fixed cost a
    step. Counted twice, a fixed cost of about k drafts was amortized over longer drafts: the policy drafted
    longer than its start-up costs, where the loop paid exactly those, say to draft (the pair drafted 6-11 a step)."""
    startup, paid = _model_drafter(0.0033, live=False), _model_drafter(0.0033)
    assert paid.live_costs.per_draft == pytest.approx(0.33) and paid.length() == startup.length() < 11
    assert paid.step_cost(4) == pytest.approx(COSTS[4] + 4 * 0.33) and "a draft 0.330 of a step" in paid.chosen()
    cheaper = _model_drafter(0.0020)  # its drafts cost less in the loop (a drafter head cut to part of its rows)
    assert cheaper.live_costs.per_draft < 0.25 and cheaper.length() > startup.length()


def test_the_refresh_happens_every_refresh_steps_only():
    live = LiveCosts(COSTS)
    refreshed = [live.observe(1 + i % 2, 0.01 * (1 + i % 2), 0.0, False) for i in range(2 * REFRESH)]
    assert refreshed == [(i + 1) % REFRESH == 0 for i in range(2 * REFRESH)]
    assert PRIOR > 0


def _policy(live_seconds, **options) -> DraftPolicy:
    """A live policy that saw 12 steps of 3 accepted out of 4 drafts, and the given (rows, seconds) steps."""
    policy = DraftPolicy(row_costs=COSTS, min_gain=1.0, live=True, by_depth=False, **options)
    policy.start(8)
    for _ in range(12):
        policy.update(4, 3, 5)
    for rows, seconds in live_seconds:
        policy.measured(rows, seconds, 0.0, True)
    return policy


def test_the_policy_drafts_shorter_when_the_loop_measures_wide_passes_dear():
    startup = _policy([])
    cheap = _policy([(1, 0.010), (9, 0.0101)] * (2 * REFRESH))  # nine positions cost what one does
    dear = _policy([(1, 0.010), (9, 0.030)] * (2 * REFRESH))  # nine positions cost 3x one
    assert dear.length() < startup.length() <= cheap.length()
    assert dear.cost(9) > 2.0 and cheap.cost(9) < 1.2
    assert "costs measured in the loop" in dear.describe(8)


def test_without_live_the_loop_seconds_change_nothing():
    fixed = DraftPolicy(row_costs=COSTS, min_gain=1.0, by_depth=False)
    fixed.start(8)
    for _ in range(4 * REFRESH):
        fixed.measured(9, 1.0, 0.5, True)
    assert fixed.live_costs is None and fixed.cost(9) == COSTS[8]


STEEP = tuple(1.0 + 0.12 * r for r in range(12))  # a pass over r positions costs 1 + 0.12 (r - 1): drafts are dear


def _trimmed(policy: DraftPolicy, evidence: int, copies: bool, steps: int) -> list:
    """The drafts ``policy`` keeps in ``steps`` steps of a match of ``evidence`` tokens that is copied whole, or whose first draft fails."""
    kept = []
    for _ in range(steps):
        k = policy.trim(10, [evidence] * 10, planned=4, limit=1 << 30)
        policy.update(k, k if copies else 0, k + 1)
        kept.append(k)
    return kept


def test_the_gate_cuts_failing_weak_matches_to_nothing_and_probes_without_pausing():
    policy = DraftPolicy(row_costs=STEEP, min_gain=1.0)
    policy.start(10, cheap=True, evidence=True)
    assert policy.gated and _trimmed(policy, 32, True, 8)[-1] == 10  # a verbatim copy drafts to the bound
    weak = _trimmed(policy, 1, False, 40)  # then one-token matches whose first draft fails, step after step
    assert weak[-30:].count(0) >= 26 and max(weak[-30:]) == 1  # cut to nothing, one draft a probe (never an estimate left untried)
    assert policy.paused == 0 and policy.paused_steps == 0  # the drafter is asked every step: no copy is missed in a pause
    assert _trimmed(policy, 32, True, 1) == [10]  # the next verbatim copy drafts long at once


def test_an_ungated_drafter_still_pauses_on_flat_failure():
    policy = DraftPolicy(row_costs=COSTS, min_gain=1.0)
    policy.start(4, cheap=True, evidence=False)
    for _ in range(6):
        policy.update(policy.length(), 0, 5)
    assert not policy.gated and policy.paused > 0


@pytest.mark.parametrize("name", ["pld", "nasd", "suffix"])
def test_greedy_output_with_a_live_gated_policy_is_target_ar(name):
    from conftest import EOS_NEVER, PROMPT
    from drafting import MODELS, _expected, _model, _runner
    from test_depth_policy import SPECS

    chose = []
    for model in MODELS:
        prompt = list(PROMPT) + list(_expected(model, "dynamic", tuple(PROMPT), 40)) + list(PROMPT)
        spec, context = SPECS[name]()
        stats = GenerationStats()
        policy = DraftPolicy(row_costs=COSTS, min_gain=1.0, live=True)
        arguments = dict(max_gen_len=32, eos_tokens_id=EOS_NEVER, stats=stats, gamma=4, policy=policy, **_runner("dynamic"))
        out, _ = generate(prompt, _model(model), spec, arguments, context)
        assert out == list(_expected(model, "dynamic", tuple(prompt), 32)), model
        chose.append(stats.policy)
    assert all(line.startswith("policy chose: drafted in ") and "costs in the loop" in line for line in chose)


class _Spy(DraftPolicy):
    """A live policy that records the widths the loop reports to it (``measured``)."""

    def measured(self, rows, verify_seconds, draft_seconds, asked, drafts=0):
        self.seen.append(rows)
        super().measured(rows, verify_seconds, draft_seconds, asked, drafts)


@pytest.mark.parametrize("trees", [False, True])
def test_the_prompt_pass_is_never_measured_as_a_step(trees):
    """The first pass also runs the prompt (its seconds are the prompt's, not a step's): counted, it
    inflated the mean of its width (one position after a first target step) against every other."""
    from conftest import EOS_NEVER, PROMPT
    from drafting import MODELS, _model, _runner
    from test_depth_policy import SPECS

    spec, context = SPECS["nasd"]()
    policy = _Spy(row_costs=COSTS, min_gain=1.0, live=True)
    policy.seen = []
    stats = GenerationStats()
    arguments = dict(max_gen_len=16, eos_tokens_id=EOS_NEVER, stats=stats, gamma=4, policy=policy, trees=trees,
                     first_target=True, **_runner("dynamic"))
    if trees:
        from drafters import NGramTreeSpec

        spec = NGramTreeSpec(tree_size=4)
    generate(list(PROMPT), _model(next(iter(MODELS))), spec, arguments, context)
    assert len(policy.seen) == stats.target_forward_passes - 1  # every step but the first, whose pass held the prompt


def test_costs_the_user_gave_are_weighed_as_given_and_measured_ones_again_in_the_loop():
    """``--row-costs`` means what it says: a policy on given costs never reads the loop's clock (so a REPL
    session on given costs decides alike on every run); one on measured costs measures them again."""
    from measure.record import GIVEN, MEASURED, Costs, Finding

    rows = (1.0, 1.05, 1.1, 1.2)
    given = DraftPolicy.calibrated(Costs(Finding(rows, "given, not measured", GIVEN)))
    measured = DraftPolicy.calibrated(Costs(Finding(rows, "measured", MEASURED)))
    assert not given.live and given.live_costs is None and given.row_costs == rows
    assert measured.live and measured.live_costs is not None


class _Clock:
    """The loop's clock, advanced only by what the test says a pass costs (``unit`` seconds a one-position pass)."""

    def __init__(self, unit: float = 0.010):
        self.now, self.unit = 0.0, unit

    def perf_counter(self) -> float:
        return self.now


class _PricedTarget:
    """A target runner whose passes advance ``clock`` by ``COSTS`` of their width (delegates all else)."""

    def __init__(self, runner, clock: _Clock):
        self.runner, self.clock = runner, clock

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def __call__(self, ids, n_last=1):
        self.clock.now += self.clock.unit * COSTS[n_last - 1]
        return self.runner(ids, n_last)

    def tree_pass(self, ids, cur, nodes, parents):
        self.clock.now += self.clock.unit * COSTS[len(nodes)]
        return self.runner.tree_pass(ids, cur, nodes, parents)


def _oracle_tree(expected, prompt_length: int, clock: _Clock, price: float):
    """A drafter model's tree (not cheap): target AR's next two tokens as a chain, a wrong sibling beside the
    first; two levels, two passes (``Drafter.tree_drafts``' default), each costing ``price`` of a one-position pass."""
    from drafters.base import Drafter

    class Oracle(Drafter):
        cheap, supports_trees = False, True

        def propose_tree(self, tokens, budget):
            clock.now += 2 * price * clock.unit
            at = len(tokens) - prompt_length
            right = list(expected[at : at + 2])
            wrong = (right[0] + 1) % 512
            return ([right[0], wrong] + right[1:])[:budget], [-1, -1, 0][: min(budget, len(right) + 1)]

    return Oracle()


def _tree_run(price: float, monkeypatch) -> tuple:
    """A greedy tree run whose drafter's two passes cost ``price`` each in the loop (0.55 at start-up): (output, expected, policy, stats)."""
    from conftest import llama
    from runners import KVCacheModel
    from sampling import autoregressive_generate, tree_decoding
    from sampling.config import GenerationConfig
    from sampling.tree_decoding import draft_tree_and_verify

    model, prompt, length = llama(), [5, 17, 33, 5, 17, 40, 2, 9], 60
    expected = autoregressive_generate(prompt, model, length + 2, eos_tokens_id=[], use_cache=True)
    clock = _Clock()
    monkeypatch.setattr(tree_decoding, "time", clock)
    policy = DraftPolicy(row_costs=COSTS, draft_cost=0.55, min_gain=1.0, live=True)
    stats = GenerationStats()
    config = GenerationConfig(max_gen_len=length, gamma=3, use_cache=True, first_target=True, trees=True, policy=policy, stats=stats)
    target = _PricedTarget(KVCacheModel(model, True), clock)
    out = draft_tree_and_verify(prompt, target, _oracle_tree(expected, len(prompt), clock, price), config)
    return out, expected[:length], policy, stats


def test_the_tree_loop_prices_a_drafter_models_passes_each_as_the_chain_loop_does(monkeypatch):
    """A tree drafter's passes are its drafts (``Drafter.tree_drafts``), priced each as the loop paid them, not
    also as a fixed cost a step: at 0.55 of a step a draft, a step of three tokens for a three-position pass and
    two drafts pays (1.1 + 2 x 0.55 = 2.2) and the loop keeps drafting; counted twice (3.3), it paused. At 1.5
    a draft the same trees do not pay and it pauses. The loop's seconds are given (a clock the passes advance)."""
    for price, pays in ((0.55, True), (1.5, False)):
        out, expected, policy, stats = _tree_run(price, monkeypatch)
        assert out == expected  # greedy: target AR's tokens, drafting or paused
        per_draft = policy.live_costs.per_draft  # shrunk toward the start-up 0.55 by PRIOR pseudo-drafts
        assert per_draft == pytest.approx(0.55) if pays else 1.2 < per_draft < 1.5
        assert f"a draft {per_draft:.3f} of a step" in policy.chosen()
        assert (stats.paused_steps == 0) == pays, (price, stats.paused_steps, policy.chosen())
