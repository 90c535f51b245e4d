"""Counts, no clock: the copying rows under the library's draft policy against candidate rules, on recorded greedy
outputs of the embedded model replayed through the real loop (``policy_trace.replay``'s runner), per category.

    .venv/bin/python scripts/policy_rules.py --prompts ../shared/specbench/question.jsonl \
        --categories qa,writing,roleplay,reasoning,math,coding,stem,humanities --limit 4 --cache /tmp/open.json

Each cell is tokens per unit of verification cost (passes weighed by ``--row-costs``; target AR: 1.000), the row's
drafted and accepted tokens; a rule is a ``DraftPolicy`` subclass below (``library``: the policy as it is).
"""
import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from grounded_counts import ROW_COSTS  # noqa: E402
from policy_trace import Traced, record, replay as trace_replay  # noqa: E402
from sampling import DraftPolicy  # noqa: E402

ROWS = ("ngram:basic", "ngram:onelevel", "pld", "suffix")


class NoPrior(Traced):
    """The gated drafter's pooled rate without a prior once it has trials (the prior only starts it)."""

    def rate(self) -> float:
        return self.hits / self.trials if self.gated and self.trials else super().rate()


class FadedPrior(Traced):
    """The prior as the oldest observation: its pseudo-counts decay with every drafting step, as the trials do."""

    def start(self, *args, **kwargs) -> None:
        super().start(*args, **kwargs)
        self.weight = 1.0

    def update(self, drafted: int, *args, **kwargs) -> None:
        if drafted:
            self.weight *= 0.7
        super().update(drafted, *args, **kwargs)

    def rate(self) -> float:
        if not self.gated:
            return super().rate()
        return (self.hits + 0.5 * self.weight) / (self.trials + self.weight)


class DoublingProbes(Traced):
    """The gate's probes back off as an ungated drafter's pauses do: a failed probe doubles the steps to the next."""

    def trim(self, proposed, evidence, planned, limit):
        self.probing = self.probes()
        return super().trim(proposed, evidence, planned, limit)

    def update(self, drafted: int, accepted: int, *args, **kwargs) -> None:
        probing, self.probing = getattr(self, "probing", False), False
        before = self.next_pause
        super().update(drafted, accepted, *args, **kwargs)
        if self.gated and drafted:
            self.next_pause = min(2 * before, 64) if probing and not accepted else (self.pause_steps if accepted else before)


RULES: Dict[str, Callable[..., DraftPolicy]] = {"library": Traced, "no_prior": NoPrior, "faded_prior": FadedPrior,
                                               "doubling_probes": DoublingProbes}


def replay(entry: dict, row: str, costs, rule: Callable[..., DraftPolicy], gamma: int = 4) -> List[tuple]:
    """One row's steps (drafted, accepted, rows, belief) on a recorded entry under ``rule``'s policy on ``costs``."""
    return trace_replay(entry, row, costs, gamma, rule=rule)


def cost(rows: int, costs) -> float:
    """A pass over ``rows`` positions in one-position passes (linear past the given ones)."""
    return costs[rows - 1] if rows <= len(costs) else costs[-1] + (costs[-1] - costs[0]) / (len(costs) - 1) * (rows - len(costs))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", nargs="+", required=True)
    p.add_argument("--categories", required=True)
    p.add_argument("--limit", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--row-costs", default=",".join(f"{c:g}" for c in ROW_COSTS))
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--rules", default=",".join(RULES), help=f"of {', '.join(RULES)}")
    p.add_argument("--cache", required=True, help="the recorded outputs (written on the first run)")
    args = p.parse_args()
    costs = [float(c) for c in args.row_costs.split(",")]
    entries = record(args.prompts, args.categories, args.limit, args.max_new_tokens, Path(args.cache))
    rows, rules = args.rows.split(","), args.rules.split(",")
    # (rule, row, category) -> [tokens, passes, cost, drafted, accepted]
    table = defaultdict(lambda: [0, 0, 0.0, 0, 0])
    for entry in entries:
        for rule in rules:
            for row in rows:
                steps = replay(entry, row, costs, RULES[rule])
                for key in ((rule, row, entry["category"]), (rule, row, "all")):
                    cell = table[key]
                    cell[0] += len(entry["ref"])
                    cell[1] += len(steps)
                    cell[2] += sum(cost(r, costs) for _, _, r, _ in steps)
                    cell[3] += sum(d for d, *_ in steps)
                    cell[4] += sum(a for _, a, *_ in steps)
    cats = list(dict.fromkeys(e["category"] for e in entries)) + ["all"]
    print(f"costs by positions: {' '.join(f'{c:.2f}' for c in costs)}; cell: tok/cost passes drafted/accepted")
    for row in rows:
        print(f"{row}")
        for rule in rules:
            cells = [table[(rule, row, c)] for c in cats]
            print(f"  {rule:12s} " + "  ".join(f"{c}: {t / u:.3f} {n} {d}/{a}" for c, (t, n, u, d, a) in zip(cats, cells)))


if __name__ == "__main__":
    main()
