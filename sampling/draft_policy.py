"""How much to draft each step: fixed, adaptive, with a floor, and paused when drafts do not pay;
the calibrated policy built from the measured costs (``measure``).

``DraftPolicy`` decides and learns within a generation (and, with ``remember``, across them);
``PolicySettings`` holds its values alone, frozen (a run's configuration keeps those, and each
generation gets a ``DraftPolicy`` made from them, with the memory its run keeps: ``policy``)."""
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from sampling.depth_acceptance import DepthAcceptance
from sampling.live_costs import LiveCosts
from sampling.policy_checks import checked
from sampling.policy_words import describe

if TYPE_CHECKING:
    from measure.record import Costs

# Cost-aware pausing threshold of the calibrated policy: drafting pauses while a drafting step
# emits fewer tokens than its verification pass costs in single-token passes (1.0 = break-even).
DEFAULT_MIN_GAIN = 1.0
# by depth, the estimate must clear min_gain by this factor to overrule the running mean's dip
CONFIDENT = 1.25
# a gated drafter (cheap, with evidence) is asked every step, cut to 0 drafts where they do not pay, while its host cost (in one-position steps) is below this
GATE_COST = 0.05
# a gated drafter's pooled rate starts from these pseudo-observations (hits, trials): one fruitless step made it 0,
# and the gate drafted nothing until its probe, through the copies after it (scripts/nasd_replay.py); a drafter whose
# drafts are passes (a head, a drafter model) drafts its first step at the length that pays best at this rate
RATE_PRIOR = (0.5, 1.0)


@dataclass
class DraftPolicy:
    """Decides the draft length of each step and learns from the outcome.

    * ``adaptive``: transformers' heuristic, +2 after a step whose drafts were all accepted,
      -1 otherwise (never below 1, never above ``gamma``, nor ``max_gamma``; with ``auto``
      never above the longest measured pass).
    * ``min_draft``: a draft shorter than this is dropped and the step is a plain target step
      (llama.cpp's ``--draft-min``): decided before drafting when the step's length is below it,
      and after drafting only for deterministic drafters (n-gram storage, prompt lookup), whose
      drafts do not depend on any sample; a drafter model always drafts at least this many.
    * ``pause_after`` / ``pause_steps``: after ``pause_after`` consecutive steps with no accepted
      draft, draft nothing for ``pause_steps`` steps. After a pause one more fruitless step is
      enough to pause again, for twice as long, until a draft is accepted; so a strategy whose
      drafts do not pay costs about what plain decoding costs. 0 disables.
    * ``row_costs``: the measured cost of one target pass over r positions, relative to r = 1
      (``measure_row_costs``; index r - 1). With it, a step verifying k drafts runs over more
      positions when that is measured cheaper (on x86 CPUs 2-3 rows cost more than 4-6; the extra
      positions are discarded, so outputs do not change), ``min_gain`` counts tokens per unit
      of cost instead of tokens, and each step drafts the length ``k <= gamma`` that maximises
      expected tokens per unit of cost, ``(1 - a^(k+1)) / (1 - a) / cost(k)`` (Leviathan et al.
      2023, section 3.5), with ``a`` the recent per-draft acceptance rate (cheap drafters may go
      past ``gamma``, up to the longest measured pass). With ``by_depth`` the expected tokens
      come from the chain of each depth's own acceptance instead (``depth_acceptance``), so a
      long verbatim copy drafts long while a drafter whose first drafts fail stays short; a
      cheap drafter that reports its evidence (``Drafter.evidence``: a matched context's length)
      is asked for the step's bound and ``trim`` keeps the cost-optimal count by the acceptance
      of each depth in its evidence's bucket (deterministic drafts only: lossless).
    * ``min_gain``: cost-aware pausing. A drafting step pays when it emits more tokens than its
      verification pass costs in single-token passes. When the running mean of tokens per
      drafting step (divided by the step's relative cost when ``row_costs`` is known; halved
      weight per step) falls below ``min_gain``, drafting pauses as above. With ``row_costs``,
      1.0 is break-even. 0 disables.
    * ``draft_cost``: the measured cost of one pass of a drafter model relative to a one-position target
      pass (``measure_draft_cost``). A step of a drafter that is not cheap (a model, or a chain that may
      use one) costs ``cost(rows) + k * draft_cost`` in the optimal length and ``min_gain`` both.
    * ``p_min``: for drafter models, stop drafting when the drafter's top probability falls
      below it (llama.cpp's ``--draft-p-min``), but never before ``min_draft`` drafts: dropping a
      draft after sampling it would bias sampled output (the acceptance test ``min(1, p/q)``
      assumes each draft was drawn from ``q``, not from ``q`` given that the draft was kept).
    * ``auto`` (the REPL's ``/gamma auto``): the length may go past ``gamma``, up to the longest measured
      pass, and cheap drafters fill padded passes with drafts. Off, ``gamma`` is a hard bound. Needs ``row_costs``.
    * ``live`` (the programs' policy): the costs are measured in the loop too (``LiveCosts``): each step's
      seconds by pass width, and a drafting step's host seconds, from the loop's own clock readings; the
      costs weighed move from the start-up ``row_costs`` toward what the run pays (``measured``), and the
      drafter's host cost counts in every step that asks it. ``chosen()`` names what it measured and chose.
    * a cheap drafter that reports its evidence is *gated*: asked every step, its drafts are cut to
      the cost-optimal count by their evidence, 0 included (no step is paused for it while its host
      cost is under ``GATE_COST`` of a step): a weak match drafts nothing, a verbatim copy drafts
      long, and a copy met after a fruitless stretch is not missed in a pause; a cut first draft is checked against
      the plain step's token (``unverified``). Its first step's length is the
      cost-optimal one by its prior rate (``RATE_PRIOR``), not ``gamma``; so is a drafter's whose drafts are passes
      (``per_draft``: a learned head's first step drafted 4 at 16% acceptance, 2026-12-01).
    * ``remember``: a policy reused across generations keeps each drafter model's record (with ``min_gain``):
      a drafter whose drafts did not pay starts its next generation paused. Off by default, so a result
      depends only on its own prompt and settings; ``forget()`` clears it, ``remembered`` counts it.

    Every control decides from what is known before a step's drafts are drawn (earlier outcomes, measured
    costs, the drafter's confidence in its own prefix), so each keeps greedy output exact and sampled
    output distributed as the target's.
    """

    adaptive: bool = False
    min_draft: int = 0
    pause_after: int = 0
    pause_steps: int = 8
    p_min: float = 0.0
    max_gamma: int = 64
    min_gain: float = 0.0
    row_costs: Tuple[float, ...] | None = None
    draft_cost: float = 0.0
    auto: bool = False
    remember: bool = False
    by_depth: bool = True
    live: bool = False
    gate: bool = True  # False: a cheap drafter with evidence is cut to >= 1 draft and paused as any other (for comparison)
    calibration: str = ""  # how row_costs were obtained, for the record (``calibrated``: the costs' line)

    def __post_init__(self):
        self.row_costs = checked(self)
        self._memory = {}  # drafter key -> (hits, trials, next pause, paying) at its last generation's end
        self.start(1)

    @classmethod
    def calibrated(cls, costs: "Costs", auto: bool = False, min_gain: float = DEFAULT_MIN_GAIN, **policy) -> "DraftPolicy":
        """The REPL's and the benchmark's policy, from measured ``costs`` (``measure.Costs``: the
        start-up record's, or ``measure.measure_costs``'): the verification costs (padded passes,
        cost-optimal lengths, ``auto`` when asked and they are usable), the drafter's cost, cost-aware
        pausing at ``min_gain``, and the costs measured again in the loop (``live``) unless they were
        given (``Finding.source`` "given": ``--row-costs``). Costs not usable: a constant length, and
        ``calibration`` says why."""
        rows = costs.row_costs.value or None
        draft = 0.0 if costs.draft_cost is None else costs.draft_cost.value
        from measure.record import GIVEN

        # costs the user gave (--row-costs) are what the policy weighs, as said: the loop re-measures only measured ones
        policy.setdefault("live", rows is not None and costs.row_costs.source != GIVEN)
        return cls(min_gain=min_gain, row_costs=rows, draft_cost=draft, calibration=costs.row_costs.line,
                   auto=auto and rows is not None, **policy)

    def start(self, gamma: int, cheap: bool = True, drafter_key=None, step_cost: Optional[float] = None,
              evidence: bool = False) -> None:
        """Reset the state for a new generation that drafts ``gamma`` tokens per step; ``cheap``:
        the drafter costs nothing next to a verification pass (n-gram storage, prompt lookup);
        ``step_cost``: a draft's own measured cost (a learned head's), instead of ``draft_cost``;
        ``evidence``: a chain drafter that reports its drafts' evidence (gated when ``cheap``).

        With ``min_gain``, a drafter that is not cheap and has a ``drafter_key`` starts from what
        this policy saw of it in its previous generation (acceptance, pause length, and paused if
        its drafts did not pay): its acceptance is a property of the pair, and each probe of a
        useless drafter model costs its passes plus catching its cache up."""
        self.gamma = gamma
        self.limit = min(self.max_gamma, max(gamma, self.bound() or 0))  # the most drafts a step may ask for
        self.per_draft = 0.0 if cheap else float(self.draft_cost if step_cost is None else step_cost)
        self._step_costs, self._bests = {}, {}  # a count's cost, and ``_best``'s last answers: both until the costs move
        self.gated = self.gate and cheap and evidence and self.by_depth and self.row_costs is not None
        self.live_costs = LiveCosts(self.row_costs, self.per_draft) if self.live and self.row_costs is not None else None
        self.steps = self.drafted_steps = self.drafted_total = 0  # what it chose, for ``chosen``
        self.gate_zeros = 0  # steps in a row the gate cut to no draft
        self.shadowed = 0  # cut first drafts checked against the target's token (``unverified``), for ``chosen``
        self.zero_streak = 0
        self.paused = 0
        self.after_pause = False  # a pause ended and no draft was verified since: the next drafting step is a probe
        self.next_pause = self.pause_steps
        self.paused_steps = 0  # steps spent paused, for the statistics
        self.unit_steps = 0  # one-position steps taken to measure the unit (``length``), for ``chosen``
        self.gain = None  # running mean of tokens emitted per drafting step
        self.hits = self.trials = 0.0  # recent accepted drafts / drafts tried (decaying sums)
        self.depths = DepthAcceptance()  # per depth and evidence, shrunk toward hits / trials
        self._evidence: Optional[List[int]] = None  # the trimmed drafts' evidence, for ``update``
        self._key = drafter_key if self.remember and not cheap and self.min_gain else None
        remembered = self._memory.get(self._key) if self._key is not None else None
        if remembered is not None:
            self.hits, self.trials, self.next_pause, paying = remembered
            if not paying:
                self.paused, self.gain, self.after_pause = self.next_pause, self.min_gain, True  # probe again after the pause

    @property
    def remembered(self) -> int:
        """How many drafter models this policy remembers from earlier generations."""
        return len(self._memory)

    def forget(self) -> None:
        """Forget every drafter's record: the next generation starts as a fresh policy's would."""
        self._memory.clear()

    def bound(self) -> int | None:
        """The most drafts a step may ask for beyond ``gamma`` (``auto``): the longest measured
        pass minus its bonus position; None when ``gamma`` is the bound."""
        return len(self.row_costs) - 1 if self.auto else None

    def describe(self, gamma: int | None = None) -> str:
        """One line naming what the policy does on its own, for headers and labels (with the
        bound on drafts per step when ``gamma`` is given): ``policy_words.describe``."""
        return describe(self, gamma)

    def finish(self) -> None:
        """Called after a generation: remember how a drafter model fared (see ``start``)."""
        if self._key is not None:
            paying = self.paused == 0 and (self.gain is None or self.gain >= self.min_gain)
            self._memory[self._key] = (self.hits, self.trials, self.next_pause, paying)

    def length(self, longest: int | None = None, left: int | None = None) -> int:
        """Drafts to ask for in the coming step (0 while paused). With ``row_costs`` and some
        outcomes seen, the cost-optimal length up to ``longest`` (default ``gamma``). ``left``: the
        tokens the generation may still emit; a drafter whose drafts are passes takes no probe with
        fewer than ``pause_steps`` left (its catch-up and passes cannot be repaid: the pause runs on)."""
        if self.paused > 0 or self.after_pause and self.per_draft and left is not None and left < self.pause_steps:
            self.paused = max(0, self.paused - 1)
            self.paused_steps += 1
            return 0
        if self.live_costs is not None and self.live_costs.stale() and self.trials > 0 and not self._expected_to_pay():
            # drafting's gain is close to its cost, weighed against a unit inferred from wider passes alone: a plain
            # step measures what drafting is weighed against (at most one in ``STALE``'s steps; a clear gain skips it)
            self.unit_steps += 1
            return 0
        if self.row_costs is None or self.trials == 0 and not self.per_draft:
            return self.gamma
        if self.trials == 0:  # drafts that are passes, nothing seen yet: priced at the prior rate, not ``gamma`` blind
            rate = RATE_PRIOR[0] / RATE_PRIOR[1]
            return max(range(1, self.gamma + 1), key=lambda k: (self.expected_tokens(k, rate) / self._cost_of(k), -k))
        return self._best(max(longest or 0, self.gamma))

    def _best(self, most: int, evidence: Optional[Sequence[int]] = None, least: int = 1) -> int:
        """The count in ``least..most`` with the most expected tokens per unit of cost (the shorter on a tie)."""
        rate = self.rate()
        if self.by_depth:
            expected = self.depths.expected(most, rate, evidence)  # the same list while its arguments and cells hold
            known = self._bests.get(least)  # (that list, the count): asked again step after step while the gate cuts to none
            if known is not None and known[0] is expected:
                return known[1]
        else:
            expected = [self.expected_tokens(k, rate) for k in range(most + 1)]
        best = max(range(least, most + 1), key=lambda k: (expected[k] / self._cost_of(k), -k))
        self._bests[least] = (expected, best)
        return best

    def rate(self) -> float:
        """The pooled per-draft acceptance of recent steps; a gated drafter's shrunk toward 1/2 by
        ``RATE_PRIOR`` (the others' zero rate still drafts one token a step, and so learns)."""
        if not self.gated:
            return self.hits / self.trials
        return (self.hits + RATE_PRIOR[0]) / (self.trials + RATE_PRIOR[1])

    def _costs(self) -> Tuple[float, ...] | None:
        """The relative costs by positions the policy weighs: the loop's (``live``), else ``row_costs``."""
        return self.live_costs.costs if self.live_costs is not None else self.row_costs

    def _deep(self) -> bool:
        """Whether lengths are cost-optimal by depth now (measured costs, and some outcomes seen or, for a gated
        drafter, its prior ``RATE_PRIOR``: its first draft is as long as that prior pays for, not ``gamma``)."""
        return self.by_depth and self.row_costs is not None and (self.trials > 0 or self.gated)

    def _expected_to_pay(self) -> bool:
        """By depth: whether the best length's expected tokens per unit of cost clear ``min_gain`` by
        ``CONFIDENT``, which overrules a dip of the short running mean (a long draft's outcomes swing
        between all and nothing); where drafts do not pay (open text) it does not, and pausing is as before."""
        if not self._deep():
            return False
        most = max(self.gamma, self.bound() or 0)
        expected = self.depths.expected(most, self.rate())
        return max(expected[k] / self._cost_of(k) for k in range(1, most + 1)) >= CONFIDENT * self.min_gain

    def _gate_pays(self) -> bool:
        """Whether a gated drafter keeps being asked instead of pausing: its host cost is small."""
        return self.gated and (self.live_costs is None or self.live_costs.draft < GATE_COST)

    def ask(self, planned: int) -> int:
        """Drafts to ask of a cheap drafter that reports its evidence when ``planned`` are planned:
        the step's bound (``gamma``, or ``bound`` with ``auto``), which ``trim`` then cuts."""
        return max(planned, self.gamma, self.bound() or 0) if planned > 0 and self._deep() else planned

    def trim(self, proposed: int, evidence: Optional[Sequence[int]], planned: int, limit: int) -> int:
        """How many of ``proposed`` deterministic drafts to verify (``planned``: ``length``'s count):
        with each draft's ``evidence``, the cost-optimal count by the acceptance of each depth in its
        evidence's bucket, before the first draft of evidence 0 (never below ``min_draft``; a cheap drafter
        with ``auto`` fills the padded pass, of at most ``limit`` positions); without, at most ``planned``.
        Decided from the drafts' evidence alone, never from the target: lossless."""
        self._evidence = None
        if evidence is None or not self._deep() or proposed == 0 or len(evidence) < proposed:
            return min(proposed, planned)
        # evidence 0: nothing backs the draft (NASD's random filler, accepted about once in the vocabulary), and the
        # drafts after it continue a random context: the chain is cut before it, a probe included (it tests nothing)
        proposed = next((i for i, e in enumerate(evidence[:proposed]) if e <= 0), proposed)
        least = 0 if self.gated and not self.probes() else min(proposed, max(1, self.min_draft))
        best = self._best(proposed, evidence, least=least)
        self.gate_cut(best)
        if self.auto and not self.per_draft:
            best = min(proposed, self.rows(best, limit) - 1)
        self._evidence = list(evidence[:best])
        return best

    def probes(self) -> bool:
        """Whether a gated drafter's cut probes this step (at least one draft): after ``next_pause``
        steps in a row cut to none, as a pause ends in a probe (an estimate never tried cannot recover)."""
        return self.gated and self.gate_zeros >= self.next_pause

    def gate_cut(self, kept: int) -> None:
        """Count a gated drafter's cut to ``kept`` drafts (tree nodes): the empty steps in a row."""
        self.gate_zeros = 0 if kept else self.gate_zeros + 1

    def _cost_of(self, drafted: int) -> float:
        """``step_cost(drafted)``, remembered for the generation (it is asked every step)."""
        cost = self._step_costs.get(drafted)
        if cost is None:
            cost = self._step_costs[drafted] = self.step_cost(drafted)
        return cost

    @staticmethod
    def expected_tokens(drafts: int, rate: float) -> float:
        """Tokens a step emits on average when each draft is accepted with probability ``rate``."""
        return drafts + 1.0 if rate >= 1.0 else (1.0 - rate ** (drafts + 1)) / (1.0 - rate)

    def keep(self, drafted: int) -> int:
        """How many of ``drafted`` proposals to verify (0 when fewer than ``min_draft``)."""
        return drafted if drafted >= self.min_draft else 0

    def rows(self, drafted: int, limit: int) -> int:
        """Positions of the pass verifying ``drafted`` drafts: ``drafted + 1``, or up to ``limit``
        when ``row_costs`` says a longer pass is at least 5% cheaper."""
        best, costs = drafted + 1, self._costs()
        if drafted == 0 or costs is None:
            return best
        for rows in range(best + 1, min(limit, len(costs)) + 1):
            if costs[rows - 1] < 0.95 * costs[best - 1]:
                best = rows
        return best

    def cost(self, rows: int) -> float:
        """Relative cost of a pass over ``rows`` positions (1.0 without ``row_costs``: costs unknown)."""
        costs = self._costs()
        if costs is None:
            return 1.0
        if rows <= len(costs):
            return costs[rows - 1]
        slope = (costs[-1] - costs[0]) / max(1, len(costs) - 1)  # linear beyond the measured range
        return costs[-1] + slope * (rows - len(costs))

    def step_cost(self, drafted: int, rows: int | None = None) -> float:
        """Relative cost of a step that drafts ``drafted`` tokens and verifies them over ``rows``
        positions (default: the padded pass ``rows(drafted)``), in one-position target passes."""
        rows = rows if rows is not None else self.rows(drafted, 1 << 30)
        live = self.live_costs
        if self.per_draft and live is not None and live.per_draft is not None:
            return self.cost(rows) + drafted * live.per_draft  # drafts that are passes: priced each, as the loop paid them
        asked = drafted > 0 or self.gated  # a gated drafter is asked, and paid, every step
        return self.cost(rows) + drafted * self.per_draft + (live.draft if asked and live is not None else 0.0)

    def measured(self, rows: int, verify_seconds: float, draft_seconds: float, asked: bool, drafts: int = 0) -> None:
        """The loop's clock readings of a step (``LiveCosts.observe``; ``drafts``: those the drafter made); with ``live`` only."""
        if self.live_costs is not None and self.live_costs.observe(rows, verify_seconds, draft_seconds, asked, drafts):
            self._step_costs, self._bests = {}, {}  # the relative costs moved: lengths are weighed on the new ones

    def unverified(self, accepted: bool, evidence: int) -> None:
        """Learn at depth 1 from a gated first draft that ``trim`` cut, once the target's token is known (ids on the host)."""
        if self.gated:  # used for later steps only: lossless
            if self.by_depth:
                self.depths.observe(1, int(accepted), (evidence,))
            self.hits, self.trials, self.shadowed = 0.7 * self.hits + accepted, 0.7 * self.trials + 1.0, self.shadowed + 1

    def chosen(self) -> str:
        """What the policy chose in its last generation and from what: drafts per drafting step, the
        gate, and the costs it weighed (measured in the loop, or the start-up ones)."""
        if not self.steps:
            return ""
        mean = self.drafted_total / self.drafted_steps if self.drafted_steps else 0.0
        parts = [f"drafted in {self.drafted_steps} of {self.steps} steps, {mean:.1f} drafts each"]
        if self.gated:
            parts.append("gated by evidence" + (f", {self.shadowed} cut drafts checked after" if self.shadowed else ""))
        if self.unit_steps:
            parts.append(f"{self.unit_steps} plain steps to measure the unit")
        if self.live_costs is not None:
            parts.append(self.live_costs.line())
        elif self.row_costs is not None:
            parts.append("start-up costs")
        return "policy chose: " + "; ".join(parts)

    def update(self, drafted: int, accepted: int, rows: int | None = None, made: int | None = None) -> None:
        """Learn from a step that verified ``drafted`` drafts in a pass over ``rows`` positions; ``made``: the
        drafts a drafter whose drafts are passes paid for (a tree's passes, priced each: ``step_cost``)."""
        evidence, self._evidence = self._evidence, None
        self.steps += 1
        if drafted == 0:
            return
        self.after_pause = False
        self.drafted_steps += 1
        self.drafted_total += drafted
        if self.by_depth:
            self.depths.observe(drafted, accepted, evidence if evidence is not None and len(evidence) >= drafted else None)
        self.hits = 0.7 * self.hits + accepted
        self.trials = 0.7 * self.trials + accepted + (accepted < drafted)
        if self.adaptive:
            self.gamma = min(self.gamma + 2, self.limit) if accepted == drafted else max(1, self.gamma - 1)
        if self.min_gain:
            priced = made if made is not None and self.per_draft else drafted  # a cheap drafter's host cost is a step's
            tokens = (accepted + 1) / self.step_cost(priced, rows if rows is not None else drafted + 1)
            self.gain = tokens if self.gain is None else (self.gain + tokens) / 2
            if self.gain >= self.min_gain:  # an expensive drafter backs off from long pauses slowly
                self.next_pause = self.pause_steps if not self.per_draft else max(self.pause_steps, self.next_pause // 2)
            elif not self._expected_to_pay() and not self._gate_pays():
                self.paused, self.gain, self.after_pause = self.next_pause, self.min_gain, True  # probe again after the pause
                self.next_pause = min(2 * self.next_pause, 64)
            return
        if accepted > 0:
            self.zero_streak, self.next_pause = 0, self.pause_steps
            return
        self.zero_streak += 1
        if self.pause_after and self.zero_streak >= self.pause_after:
            self.paused, self.zero_streak, self.after_pause = self.next_pause, self.pause_after - 1, True
            self.next_pause *= 2
