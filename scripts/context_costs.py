"""A pass's cost by width at a short context (the start-up measurement's 64) and at a summarization prompt's
(~800): the embedded model on the C step, the two contexts' passes interleaved, the least of ``--reps`` each
(noisy on a shared machine: read the ratios, never the milliseconds), and a prompt's prefill in one-position passes.

    .venv/bin/python scripts/context_costs.py --contexts 64 800 --reps 7
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure.timing import PassTimer  # noqa: E402
from runners import RunnerConfig  # noqa: E402
from utils.models import load_embedded  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[64, 800])
    p.add_argument("--rows", type=int, default=12)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: as set)")
    args = p.parse_args()
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, _ = load_embedded()
    config = RunnerConfig("static", False)
    timers = {c: PassTimer(model, c, args.rows + 1, runner=config) for c in args.contexts}
    best = {(c, r): float("inf") for c in args.contexts for r in range(1, args.rows + 1)}
    for _ in range(args.reps):
        for r in range(1, args.rows + 1):
            for c, timer in timers.items():
                best[c, r] = min(best[c, r], timer.seconds(r))
    for c in args.contexts:
        one = best[c, 1]
        print(f"context {c:4d}: one position {1e3 * one:.2f} ms; by positions 1..{args.rows}: "
              + " ".join(f"{best[c, r] / one:.2f}" for r in range(1, args.rows + 1)))
    longest = max(args.contexts)
    fill = PassTimer(model, 1, longest + 1, runner=config)  # a prompt's one pass over `longest` positions
    prefill = float("inf")
    for _ in range(max(2, args.reps // 3)):
        fill.runner.rollback(0)
        start = time.perf_counter()
        fill.runner(fill.ids[:, :longest], 1)
        prefill = min(prefill, time.perf_counter() - start)
    print(f"prefill of {longest} positions: {1e3 * prefill:.0f} ms = {prefill / best[longest, 1]:.1f} one-position passes at context {longest}")


if __name__ == "__main__":
    main()
