"""Where a step of input-grounded drafting goes, against target AR's, on the embedded model: prompt lookup and
target AR on Spec-Bench prompts, each function on the step's path wrapped by a clock (the C call by pass width and
context, the drafter's search, choosing, the policy, rollback, the kept keys), and the loop's own readings
(``LiveCosts.observe``: each step's drafting and verifying seconds). Noisy on a shared machine: an A/B inside
one process at best, never a result.

    .venv/bin/python scripts/grounded_split.py --categories summarization --limit 1 --runs 3
"""
import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import drafters.prompt_lookup as prompt_lookup  # noqa: E402
import kernels.c_step as c_step  # noqa: E402
import kernels.kept_keys as kept_keys  # noqa: E402
import runners.lean as lean  # noqa: E402
import sampling.draft_policy as draft_policy  # noqa: E402
import sampling.live_costs as live_costs  # noqa: E402
import utils.logits_processor as processors  # noqa: E402
from app.bench.prompts import load_prompts  # noqa: E402
from app.session import encode  # noqa: E402
from drafters import PromptLookupSpec  # noqa: E402
from runners import RunnerConfig  # noqa: E402
from sampling import DraftPolicy, GenerationStats, autoregressive_generate, generate  # noqa: E402
from utils.models import load_embedded  # noqa: E402

# the last session's measured costs by positions 1..12 (t5/grounded.txt), as the bench's policy had them
ROW_COSTS = (1.00, 1.04, 1.06, 1.08, 1.10, 1.14, 1.14, 1.11, 1.17, 1.24, 1.21, 1.24)
CLOCKS: Dict[str, List[float]] = defaultdict(lambda: [0.0, 0])  # key -> [seconds, calls]
STEPS: List[tuple] = []  # (rows, verify s, draft s, drafted)


def clocked(owner, name: str, key, also: tuple = ()) -> None:
    """``owner.name`` (and the same name in ``also``) timed into ``CLOCKS[key(args) or key]``."""
    inner: Callable = getattr(owner, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            cell = CLOCKS[key(*args, **kwargs) if callable(key) else key]
            cell[0] += time.perf_counter() - start
            cell[1] += 1

    for place in (owner, *also):
        setattr(place, name, timed)


def wrap_all() -> None:
    ctx = lambda start: f"{start // 256 * 256}+"  # noqa: E731
    clocked(c_step.CStep, "_run", lambda self, rows, start, *a: f"C call r={rows[0].shape[0]} ctx {ctx(start)}")
    clocked(c_step.CStep, "__call__", lambda self, h, rope, cache, start, *a, **k: f"CStep() r={h.shape[0]}")
    clocked(lean.LeanRunner, "__call__", lambda self, ids, n_last=1: f"runner() r={ids.shape[1] - self.cached}")
    clocked(lean.LeanRunner, "rollback", "rollback")
    clocked(kept_keys, "kept", "kept", (c_step,))
    clocked(kept_keys, "passed", "passed", (c_step,))
    clocked(prompt_lookup, "lookup_with_match", "lookup")
    clocked(processors.GreedyProcessor, "choose", "choose")
    for name in ("length", "ask", "trim", "keep", "rows", "update", "measured", "bound"):
        clocked(draft_policy.DraftPolicy, name, f"policy.{name}")
    inner = live_costs.LiveCosts.observe

    def observe(self, rows, verify, draft, drafted, drafts=0):
        STEPS.append((rows, verify, draft, drafted))
        return inner(self, rows, verify, draft, drafted, drafts)

    live_costs.LiveCosts.observe = observe


def report(label: str, wall: float, tokens: int) -> None:
    print(f"-- {label}: {1e3 * wall / tokens:.2f} ms a token, {tokens} tokens, {1e3 * wall:.0f} ms")
    for key, (seconds, calls) in sorted(CLOCKS.items()):
        if calls:
            print(f"   {key:28s} {calls:5d} calls {1e3 * seconds / calls:8.3f} ms each  {1e3 * seconds:8.1f} ms all")
    if STEPS:
        by = defaultdict(list)
        for rows, verify, draft, drafted in STEPS:
            by[rows].append((verify, draft))
        for rows, cells in sorted(by.items()):
            v = sum(c[0] for c in cells) / len(cells)
            d = sum(c[1] for c in cells) / len(cells)
            print(f"   loop: rows {rows:2d} x{len(cells):3d}: verify {1e3 * v:6.2f} ms, draft {1e3 * d:6.3f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", default="../shared/specbench/question.jsonl")
    p.add_argument("--categories", default="summarization")
    p.add_argument("--limit", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="cProfile the last pld run instead of the clocks")
    args = p.parse_args()
    torch.set_grad_enabled(False)
    model, tokenizer = load_embedded()
    eos = [tokenizer.eos_token_id]
    runner = RunnerConfig("static", False)
    if not args.profile:
        wrap_all()
    for row in load_prompts(args.prompts, args.categories, args.limit):
        prompt = encode(tokenizer, row["turns"][0], True)
        print(f"== {row['category']} {row['question_id']}: {len(prompt)} prompt tokens")
        common = dict(max_gen_len=args.max_new_tokens, eos_tokens_id=eos, use_cache=True, runner=runner)
        ref = autoregressive_generate(prompt, model, **common)  # warm-up
        for run in range(args.runs):
            for label in ("target", "pld"):
                CLOCKS.clear()
                STEPS.clear()
                policy = DraftPolicy(row_costs=ROW_COSTS, min_gain=1.0, live=True, auto=True)
                wall = time.perf_counter()
                if label == "target":
                    out = autoregressive_generate(prompt, model, **common)
                elif args.profile and run == args.runs - 1:
                    import cProfile
                    import pstats
                    prof = cProfile.Profile()
                    prof.enable()
                    out = generate(prompt, model, PromptLookupSpec(10, 3, 1), dict(common, stats=GenerationStats(), policy=policy))[0]
                    prof.disable()
                    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
                else:
                    out = generate(prompt, model, PromptLookupSpec(10, 3, 1), dict(common, stats=GenerationStats(), policy=policy))[0]
                wall = time.perf_counter() - wall
                assert out == ref, f"{label} diverged from target AR"
                report(f"run {run} {label}", wall, len(out))
                if label == "pld" and policy.live_costs is not None:
                    print("   " + policy.live_costs.line())


if __name__ == "__main__":
    main()
