"""Where a speculative step's time goes on the real pair (``--preset pair``), from the passes of real runs: every pass
of both models' runners is timed where it runs (``LeanRunner.__call__``, wrapped), so a step splits into the
drafter's passes (by width), the target's verification pass (by width), and the host: the step's wall time
less its passes (the processor, the choice, the sync, rollbacks, the policy, the drafter's own Python), given
in wall milliseconds and in the main thread's CPU milliseconds outside the passes (``time.thread_time``: what
the host's Python costs, a machine busy with others counting less in it). Target AR, the speculative row under
gamma auto and under ``--gamma``, interleaved round by round; every run's tokens checked against target AR's
(greedy). Each run's first step and the drafter's prompt pass are left out of the split, and said apart. NOISY on a shared machine: read ratios
within a round. Loads the bfloat16 pair (~5 GB).

    .venv/bin/python scripts/pair_split.py [--rounds 3] [--gamma 4] [--heads auto,full] [--length 96]
"""
import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from sampling.config import Observer, Step  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WIDEST = 16  # a pass over more new positions is a prompt's


class Passes:
    """Every pass of a ``LeanRunner`` while installed: (which model, new positions, start, end, main thread's CPU s,
    seconds in the C step's call: the rest of the pass is its Python around it)."""

    def __init__(self, target) -> None:
        from kernels.c_step import CStep
        from runners.lean import LeanRunner

        self.target, self.seen, self.own, self.c_call, self.in_c = target, [], LeanRunner.__call__, CStep._run, 0.0
        passes = self

        def timed(runner, ids, n_last=1):
            width, cpu, start, c = ids.shape[1] - runner.cached, time.thread_time(), time.perf_counter(), passes.in_c
            out = passes.own(runner, ids, n_last)
            passes.seen.append((runner.model is passes.target, width, start, time.perf_counter(), time.thread_time() - cpu, passes.in_c - c))
            return out

        def called(step, *args):
            start = time.perf_counter()
            passes.c_call(step, *args)
            passes.in_c += time.perf_counter() - start

        LeanRunner.__call__, CStep._run = timed, called


class Steps(Observer):
    """Each step's end time (perf_counter) and the main thread's CPU time then."""

    def __init__(self) -> None:
        self.ends: List[Tuple[float, float]] = []

    def on_step(self, step: Step) -> None:
        self.ends.append((time.perf_counter(), time.thread_time()))


def split(passes: Passes, steps: Steps, since: int) -> Dict[str, float]:
    """The steps after the first: their count, wall ms, each model's pass ms by width (sum, count), and the host's
    wall and CPU ms (the steps' less their passes')."""
    (t0, c0), (t1, c1) = steps.ends[0], steps.ends[-1]
    inside = [p for p in passes.seen[since:] if t0 <= p[2] and p[3] <= t1]
    prompts = [p for p in inside if p[1] > WIDEST]  # the drafter's prompt pass, in its first drafting step: left out
    inside = [p for p in inside if p[1] <= WIDEST]
    out: Dict[str, float] = {"steps": len(steps.ends) - 1, "wall": 1e3 * (t1 - t0 - sum(p[3] - p[2] for p in prompts))}
    by = defaultdict(lambda: [0.0, 0, 0.0])
    for is_target, width, start, end, _, c in inside:
        cell = by[("target" if is_target else "drafter", width)]
        cell[0] += 1e3 * (end - start)
        cell[1] += 1
        cell[2] += 1e3 * c
    out["by"] = dict(by)
    out["host"] = out["wall"] - sum(1e3 * (p[3] - p[2]) for p in inside)
    out["host_cpu"] = 1e3 * (c1 - c0 - sum(p[4] for p in inside + prompts))
    return out


def line(name: str, found: Dict, tokens: int, ar_one: float) -> str:
    """One run's split, per step, each part also in one-position target passes of the same round (``ar_one`` ms)."""
    n = max(1, found["steps"])
    parts = []
    for (role, width), (ms, count, c) in sorted(found["by"].items()):
        parts.append(f"{role} x{width}: {count / n:.2f}/step {ms / count:.1f} ms ({ms / count / ar_one:.3f}, {(ms - c) / count:.2f} ms outside C)")
    return (f"{name}: {found['steps']} steps, {tokens} tokens, {found['wall'] / n:.1f} ms/step; "
            + "; ".join(parts) + f"; host {found['host'] / n:.2f} ms/step ({found['host'] / n / ar_one:.3f}),"
            f" host CPU {found['host_cpu'] / n:.2f} ms/step")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--length", type=int, default=96)
    p.add_argument("--code-editing", type=int, default=2001)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--heads", default="auto,full", help="the drafter's rows, comma-separated: auto, full, or a count")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()

    from app.pair import LoadOptions, load_pair, pair_preset
    from app.session import build_settings, drafter_head, encode
    from strategies import STRATEGIES, run_strategy

    preset = pair_preset()
    pair = load_pair(preset["target"], preset["drafter"], LoadOptions(dtype="bfloat16", drafter_dtype="bfloat16"),
                     say=lambda *a, **k: None)
    config, context = build_settings(pair, "greedy", args.gamma, args.length, say=lambda text, *_: print(text))
    rows = [json.loads(row) for row in open(ROOT / "prompts" / "code_editing.jsonl")]
    prompt = encode(context.tokenizer, next(r["turns"][0] for r in rows if r["question_id"] == args.code_editing), True)
    by_key = {s.key: s for s in STRATEGIES}
    passes = Passes(pair.target)
    runs = [("target AR", "target", config)]
    for head in args.heads.split(","):
        rows_ = drafter_head(head, pair)
        if config.policy.row_costs:  # gamma auto needs plausible measured costs (a busy machine's may not be)
            runs.append((f"speculative gamma auto, head {rows_ or 'all'}", "speculative", config.with_policy(auto=True).with_(drafter_head=rows_)))
        runs.append((f"speculative gamma {args.gamma}, head {rows_ or 'all'}", "speculative", config.with_(drafter_head=rows_)))
    ref = None
    for round_ in range(args.rounds):
        ar_one = None
        for name, key, run in runs if round_ % 2 == 0 else [runs[0]] + runs[:0:-1]:
            steps, since = Steps(), len(passes.seen)
            context.streamer = steps
            result = run_strategy(by_key[key], prompt, run, context)
            found = split(passes, steps, since)
            if key == "target":
                ref = ref or list(result.tokens)
                ms, count, _ = found["by"][("target", 1)]
                ar_one = ms / count
            ok = "exact" if list(result.tokens) == ref else "MISMATCH"
            prompts = 1e3 * result.seconds - found["wall"]  # the first step, and the drafter's prompt pass: both prompt passes
            print(f"[round {round_}] {ok} " + line(name, found, len(result.tokens), ar_one)
                  + f"; {len(result.tokens) / result.seconds:.1f} tok/s, {prompts:.0f} ms of them outside the steps (the prompt passes)" + (f"; {result.stats.policy}" if key != "target" else ""), flush=True)
    print(f"threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
