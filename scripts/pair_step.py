"""Where a speculative step's time goes on the real pair (``--preset pair``), within one process: the
drafter's one-position pass against the target's (c), the target's pass by width, the drafting loop's host
time beyond its passes, and both models' prompt passes; then the speculative row and target AR as the REPL
runs them, their steps counted. NOISY on a shared machine: read the ratios, not the seconds. ~9 GB in float32.

    .venv/bin/python scripts/pair_step.py --dtype bfloat16 [--drafter-dtype bfloat16] [--gammas 4,6,8] [--heads full,32768]

``--heads``: the drafter's output rows (``--drafter-head``: full, or a count), each timed and run in turn, interleaved
by gamma, so that an A/B of the drafter's part rows shares the machine's moments. Every speculative run's tokens are
checked against target AR's (greedy).
"""
import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from sampling.config import Observer, Step  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class Steps(Observer):
    """Every step's (drafted, accepted, rows, seconds since the previous step)."""

    def __init__(self) -> None:
        self.steps: List[tuple] = []
        self.last = time.perf_counter()

    def on_step(self, step: Step) -> None:
        now = time.perf_counter()
        self.steps.append((len(step.proposed), step.accepted, step.rows, now - self.last))
        self.last = now


def median_ms(run: Callable[[], None], repeats: int) -> float:
    """Median milliseconds of ``run`` over ``repeats`` calls after one untimed."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def passes(config, target, drafter, prompt: List[int], widths: List[int], repeats: int, heads: List[int]) -> dict:
    """Milliseconds of the prompt pass of each model, the drafter's one-position pass (with each of ``heads``'
    rows, 0: all), its pass plus the processor and the draw (what ``ModelDrafter.propose`` adds a draft), and the
    target's pass by width, each after the prompt, rolled back after every timed pass."""
    from drafters.model import drafted_rows
    from runners import make_runner

    ids = torch.tensor([prompt + [prompt[-1]] * 16], dtype=torch.long)
    out = {}
    for role, model in [("target", target)] + [(f"drafter ({rows or 'all'} rows)", drafter) for rows in heads]:
        runner = make_runner(model, True, None, config.drafter_runner if role != "target" else config.runner)
        if role != "target":
            drafted_rows(runner, heads.pop(0))
        start = time.perf_counter()
        runner(ids[:, : len(prompt)], 1)
        out[f"{role} prompt pass ({len(prompt)} positions)"] = 1e3 * (time.perf_counter() - start)
        cur = len(prompt)
        for width in (widths if role == "target" else [1]):
            def one(width=width):
                runner(ids[:, : cur + width], width)
                runner.rollback(cur)
            out[f"{role} pass, {width} position(s)"] = median_ms(one, repeats)
        if role != "target":
            processor = config.logits_processor()

            def drafted():
                q = processor(runner(ids[:, : cur + 1], 1))
                ids[0, cur + 1] = processor.sample(q)[0, 0]
                runner.rollback(cur)
            out[f"{role} pass + processor + draw"] = median_ms(drafted, repeats)
    return out


def counted(name: str, result, ref, seen: Steps, ar_ms: float) -> str:
    """One row's counts: passes, tokens/step, drafts by step, the steps' time split, and speed over target AR."""
    stats, steps = result.stats, seen.steps
    later = steps[1:]  # the first step runs the prompt too
    ks = Counter(k for k, *_ in steps)
    ok = "exact" if result.tokens == ref else "MISMATCH"
    tokens = len(result.tokens)
    step_ms = 1e3 * statistics.median(s[3] for s in later) if later else 0.0
    return (f"{name}: {ok} {tokens} tokens, {result.seconds:.2f} s, {len(steps)} passes, {tokens / max(1, len(steps)):.2f} tok/pass, "
            f"acceptance {stats.acceptance_rate:.2f}, drafts {dict(sorted(ks.items()))}, first step {1e3 * steps[0][3]:.0f} ms, "
            f"median later step {step_ms:.0f} ms; draft {stats.draft_seconds:.2f} s verify {stats.verify_seconds:.2f} s; "
            f"vs target AR (per token, first step excluded): {ar_ms * tokens / max(1e-9, 1e3 * result.seconds):.2f}x; {stats.policy}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--drafter-dtype", default=None, help="the drafter's dtype (default: the target's)")
    p.add_argument("--length", type=int, default=96)
    p.add_argument("--code-editing", type=int, default=2001)
    p.add_argument("--gammas", default="4", help="speculative rows' gamma bounds, comma-separated ('auto' allowed)")
    p.add_argument("--threads", type=int, default=None, help="torch's threads (default: torch's own)")
    p.add_argument("--heads", default="full", help="the drafter's output rows, comma-separated: full, or a count (--drafter-head)")
    p.add_argument("--widths", default="1,2,3,4,5,6,8,10,12")
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()

    from app.pair import LoadOptions, load_pair, pair_preset
    from app.session import build_settings, encode
    from strategies import STRATEGIES, run_strategy

    if args.threads:
        torch.set_num_threads(args.threads)
    preset = pair_preset()
    options = LoadOptions(dtype=args.dtype, drafter_dtype=args.drafter_dtype)
    pair = load_pair(preset["target"], preset["drafter"], options, say=lambda *a, **k: None)
    print(pair.describe("target"), "\n", pair.describe("drafter"), sep="")
    config, context = build_settings(pair, "greedy", 4, args.length, say=lambda text, *_: print(text))
    rows = [json.loads(line) for line in open(ROOT / "prompts" / "code_editing.jsonl")]
    prompt = encode(context.tokenizer, next(r["turns"][0] for r in rows if r["question_id"] == args.code_editing), True)
    print(f"prompt {len(prompt)} tokens; policy {config.policy}")
    heads = [0 if h == "full" else int(h) for h in args.heads.split(",")]
    if args.repeats > 0:
        timed = passes(config, pair.target, pair.drafter, prompt, [int(w) for w in args.widths.split(",")], args.repeats, list(heads))
        one = timed["target pass, 1 position(s)"]
        for key, ms in timed.items():
            print(f"  {key}: {ms:.1f} ms ({ms / one:.2f} of a target one-position pass)")
    by_key = {s.key: s for s in STRATEGIES}
    seen = Steps()
    context.streamer = seen
    seen.last = time.perf_counter()
    ar = run_strategy(by_key["target"], prompt, config, context)
    ref = list(ar.tokens)
    ar_ms = 1e3 * statistics.median(s[3] for s in seen.steps[1:])
    print(f"target AR: {len(ref)} tokens, {ar.seconds:.2f} s, first step {1e3 * seen.steps[0][3]:.0f} ms, median token {ar_ms:.1f} ms")
    for gamma in args.gammas.split(","):
        for rows in heads:
            run = config.with_policy(auto=True) if gamma == "auto" else config.with_(gamma=int(gamma))
            run = run.with_(drafter_head=rows)
            seen = Steps()
            context.streamer = seen
            seen.last = time.perf_counter()
            result = run_strategy(by_key["speculative"], prompt, run, context)
            print(counted(f"speculative gamma {gamma}, drafter rows {rows or 'all'}", result, ref, seen, ar_ms))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
