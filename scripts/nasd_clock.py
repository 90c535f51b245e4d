"""Replay NASD on a record of ``scripts/nasd_record.py`` under the programs' policy *with costs measured in the loop*
(``DraftPolicy(live=True)``), against a simulated clock: each pass of ``r`` positions takes ``unit * paid(r)`` seconds
times a lognormal noise of ``--sigma`` (seeded), each drafting step ``--host`` of a unit. The decisions the live costs
drive (draft lengths, padded widths, the gate's cuts, the plain steps that measure the unit) are counted seed by seed:
how much of a run's passes moves with the noise of the clock alone. No model, no real clock.

    .venv/bin/python scripts/nasd_clock.py /tmp/nasd.json --seeds 8 --sigma 0.1 [--scale 1.3] [--before]
"""
import argparse
import json
import random
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import List, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sampling.chain_decoding as chain  # noqa: E402
from app.repl.repl import NGRAM_N  # noqa: E402
from drafters.ngram import NGramSpec  # noqa: E402
from drafters.prompt_lookup import PromptLookupSpec  # noqa: E402
from drafters.spec import DraftContext  # noqa: E402
from ngram_assisted import NGramStorage  # noqa: E402
from sampling import DraftPolicy, GenerationStats, generate  # noqa: E402
from utils.replayed_runner import ReplayedRunner  # noqa: E402
from scripts.nasd_replay import VOCAB, Steps  # noqa: E402


class Clock:
    """A clock that a ``ClockedRunner``'s passes and the drafting steps move, in seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class ClockedRunner(ReplayedRunner):
    """``ReplayedRunner`` whose pass of ``r`` positions moves ``clock`` by ``unit * paid(r) * noise``."""

    def __init__(self, prompt, ref, fillers, clock: Clock, paid: Sequence[float], sigma: float, seed: int, unit: float = 0.125):
        super().__init__(prompt, ref, VOCAB, fillers)
        self.clock, self.paid, self.sigma, self.unit, self.rng = clock, paid, sigma, unit, random.Random(seed)

    def __call__(self, ids, n_last: int = 1):
        rows = min(n_last, len(self.paid))
        self.clock.now += self.unit * self.paid[rows - 1] * self.rng.lognormvariate(0.0, self.sigma)
        return super().__call__(ids, n_last)


def run(entry: dict, costs: Sequence[float], paid: Sequence[float], sigma: float, seed: int, host: float, lookup: bool = False,
        **options) -> dict:
    """One generation under the live policy on the simulated clock: its steps, its simulated seconds, the policy's line.
    ``lookup``: the prompt lookup row (its defaults, gamma 4) instead of NASD's (n 8, gamma auto)."""
    clock = Clock()
    fillers = {int(k): v[:3] for k, v in entry["fillers"].items()}
    runner = ClockedRunner(entry["prompt"], entry["ref"], fillers, clock, paid, sigma, seed)
    drafter_propose = NGramDrafterPropose(clock, host * runner.unit)
    policy = DraftPolicy(**{"min_gain": 1.0, "row_costs": tuple(costs), "live": True, "auto": not lookup, **options})
    seen, stats = Steps(), GenerationStats()
    values = dict(gamma=4, max_gen_len=len(entry["ref"]), eos_tokens_id=[VOCAB - 1], policy=policy, stats=stats, streamer=seen)
    saved = chain.time
    chain.time = SimpleNamespace(perf_counter=clock.perf_counter)
    try:
        with drafter_propose:
            spec = PromptLookupSpec() if lookup else NGramSpec(3, stop_if_unknown=True)
            out, _ = generate(entry["prompt"], runner, spec, values, DraftContext(storage=NGramStorage(NGRAM_N, VOCAB)))
    finally:
        chain.time = saved
    assert out == entry["ref"], "the replay left target AR's tokens"
    return {"steps": seen.steps, "seconds": clock.now, "policy": stats.policy}


class NGramDrafterPropose:
    """Within it, each ``NGramDrafter.propose`` moves the clock by ``seconds`` (the drafting step's host work)."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds

    def __enter__(self):
        import drafters.ngram as ngram

        self.owner, self.inner = ngram.NGramDrafter, ngram.NGramDrafter.propose
        clock, seconds, inner = self.clock, self.seconds, self.inner

        def propose(drafter, ids, tokens, k):
            clock.now += seconds
            return inner(drafter, ids, tokens, k)

        self.owner.propose = propose
        return self

    def __exit__(self, *exc) -> None:
        self.owner.propose = self.inner


def summary(steps: List[tuple]) -> str:
    drafting = [s for s in steps if s[1] > 0]
    widths = sorted({s[3] for s in drafting})
    return (f"passes {len(steps):3d} (drafting {len(drafting):2d}, plain {len(steps) - len(drafting):2d}), drafted "
            f"{sum(s[1] for s in steps):3d}, accepted {sum(s[2] for s in steps):3d}, widths {widths}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("record")
    p.add_argument("--seeds", type=int, default=6)
    p.add_argument("--sigma", type=float, default=0.1, help="the lognormal noise of each pass's seconds")
    p.add_argument("--host", type=float, default=0.01, help="a drafting step's host work, in one-position passes")
    p.add_argument("--scale", type=float, default=1.0, help="what a run pays for passes past one position, over the start-up costs")
    p.add_argument("--lookup", action="store_true", help="the prompt lookup row instead of NASD's")
    p.add_argument("--before", action="store_true", help="the gate as before: a cut draft teaches nothing (DraftPolicy.unverified off)")
    args = p.parse_args()
    if args.before:
        DraftPolicy.unverified = lambda self, accepted, evidence: None
    record = json.load(open(args.record))
    costs = record["row_costs"]
    paid = [c * (args.scale if rows > 1 else 1.0) for rows, c in enumerate(costs, start=1)]
    for entry in record["prompts"]:
        print(f"{entry['question_id']}: start-up costs {' '.join(f'{c:.2f}' for c in costs)}, paid x{args.scale} past one position, "
              f"noise sigma {args.sigma}")
        for seed in range(args.seeds):
            out = run(entry, costs, paid, args.sigma, seed, args.host, args.lookup)
            print(f"  seed {seed}: {summary(out['steps'])}, {out['seconds']:.2f} s simulated")
            print(f"    {out['policy']}")


if __name__ == "__main__":
    main()
