"""Deterministic counts of input-grounded drafting on the embedded model, per category and row: passes,
tokens per pass, draft lengths, steps that found no draft, accepted drafts by draft length, and the
copy oracle (how many of target AR's tokens a perfect copier from the prompt and the output so far
could have drafted). No clock is read: these are counts, the same on every machine (greedy, the C step).

    .venv/bin/python scripts/grounded_counts.py --prompts ../shared/specbench/question.jsonl \
        --categories summarization,rag --limit 4 --max-new-tokens 64

The rows run with the calibrated policy on fixed, given verification costs (``--row-costs``), so that
nothing depends on a measurement; every row's tokens are checked against target AR's.
"""
import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.bench.prompts import load_prompts  # noqa: E402
from app.session import encode  # noqa: E402
from drafters import CopyTreeSpec, PromptLookupSpec, SuffixSpec  # noqa: E402
from ngram_assisted import NGramStorage, OneLevelNGramStorage, ngram_assisted_speculative_generate  # noqa: E402
from sampling import DraftPolicy, GenerationStats, autoregressive_generate, generate  # noqa: E402
from sampling.config import Observer, Step  # noqa: E402
from utils.models import load_embedded  # noqa: E402

# the README session's measured costs by positions 1..12 (fixed here: counts must not move with a clock)
ROW_COSTS = (1.00, 1.05, 1.15, 1.17, 1.20, 1.25, 1.33, 1.39, 1.42, 1.46, 1.57, 1.63)


class Steps(Observer):
    """Every step's (drafted, accepted, rows)."""

    def __init__(self) -> None:
        self.steps: List[tuple] = []

    def on_step(self, step: Step) -> None:
        self.steps.append((len(step.proposed), step.accepted, step.rows))


def copy_oracle(prompt: List[int], out: List[int], min_n: int = 1, cap: int = 64) -> int:
    """Passes a greedy run of ``out`` would take with a perfect copier: at each position, the longest
    run of ``out`` that continues some earlier occurrence of the context's last ``min_n``+ tokens."""
    seq, passes, i = list(prompt), 0, 0
    while i < len(out):
        best = 0
        for start in range(len(seq) - min_n + 1):
            if seq[start : start + min_n] != seq[len(seq) - min_n :] or start + min_n >= len(seq):
                continue
            run = 0
            while run < cap and i + run < len(out) and start + min_n + run < len(seq) and seq[start + min_n + run] == out[i + run]:
                run += 1
            best = max(best, run)
        step = min(best, len(out) - i - 1) + 1
        seq += out[i : i + step]
        i += step
        passes += 1
    return passes


ROWS = ("pld", "ngram", "suffix", "tree_suffix", "tree_copy", "onelevel")  # onelevel: NASD on the bench's other storage


class GatedTrees(DraftPolicy):
    """An experiment, not the library's rule: a tree drafter that reports evidence is gated as a chain
    one is (never paused while cheap; ``choose_nodes`` still cuts each tree by the costs)."""

    def start(self, gamma: int, cheap: bool = True, drafter_key=None, step_cost=None, evidence: bool = False) -> None:
        super().start(gamma, cheap, drafter_key, step_cost, evidence=True)


def policy_maker(costs, gate: bool, tree_gate: bool = False):
    """A row name -> a fresh policy on the given ``costs`` (gated or not; ``GatedTrees`` for tree_suffix where asked)."""
    return lambda name: (GatedTrees if tree_gate and name == "tree_suffix" else DraftPolicy)(row_costs=costs, min_gain=1.0, gate=gate)


def row_runs(prompt: List[int], model, tokenizer, eos, new: int, policy_for, rows=ROWS[:3]) -> Dict[str, tuple]:
    """Each row's (tokens, steps) on ``prompt`` (a tree step's drafts: its nodes), each row's policy ``policy_for(name)``."""
    common = dict(max_gen_len=new, eos_tokens_id=eos, use_cache=True, tokenizer=tokenizer)
    runs = {}
    for name in rows:
        seen, stats = Steps(), GenerationStats()
        policy = policy_for(name)
        args = dict(common, stats=stats, policy=policy, streamer=seen)
        if name == "pld":
            out = generate(prompt, model, PromptLookupSpec(10, 3, 1), args)[0]
        elif name == "suffix":
            out = generate(prompt, model, SuffixSpec(), args)[0]
        elif name == "tree_suffix":  # the REPL's and the benchmark's tree row: up to tree_size 16 nodes a pass
            out = generate(prompt, model, SuffixSpec(trees=True), dict(args, gamma=16))[0]
        elif name == "tree_copy":  # the library's copy tree, gated by its nodes' evidence, tree_size 16
            out = generate(prompt, model, CopyTreeSpec(), args)[0]
        else:  # NASD as the bench builds it: a fresh storage, gamma 4, filler top-3 (a seeded random filler on unknown context)
            torch.manual_seed(42)
            storage = (OneLevelNGramStorage if name == "onelevel" else NGramStorage)(3, model.config.vocab_size)
            out = ngram_assisted_speculative_generate(prompt, storage, model, gamma=4,
                                                      filler_top_k=3, first_target=True, **args)[0]
        runs[name] = (out, seen.steps)
    return runs


def prompt_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The prompts counted (Spec-Bench's file read in place, its categories, how many, tokens each)."""
    p.add_argument("--prompts", default="../shared/specbench/question.jsonl")
    p.add_argument("--categories", default="summarization,rag")
    p.add_argument("--limit", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    return p


def main() -> None:
    p = prompt_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--row-costs", default=",".join(f"{c:g}" for c in ROW_COSTS))
    p.add_argument("--priced", default=None, help="the costs that price the steps (default: --row-costs): a policy on "
                   "one curve priced by another, e.g. the start-up's short-context curve against a long prompt's")
    p.add_argument("--rows", default=",".join(ROWS[:3]), help=f"of {', '.join(ROWS)}")
    p.add_argument("--tree-gate", action="store_true", help="tree_suffix gated as chains are (GatedTrees: an experiment)")
    p.add_argument("--no-gate", action="store_true", help="the policy without the evidence gate (as before it)")
    args = p.parse_args()
    costs = tuple(float(c) for c in args.row_costs.split(","))
    priced = tuple(float(c) for c in args.priced.split(",")) if args.priced else costs
    model, tokenizer = load_embedded()
    eos = tokenizer.eos_token_id
    table = defaultdict(lambda: defaultdict(Counter))
    for row in load_prompts(args.prompts, args.categories, args.limit):
        cat = row["category"]
        prompt = encode(tokenizer, row["turns"][0], True)
        ref = autoregressive_generate(prompt, model, max_gen_len=args.max_new_tokens, eos_tokens_id=eos, use_cache=True)
        t = table[cat]
        t["all"]["prompts"] += 1
        t["all"]["prompt_tokens"] += len(prompt)
        t["all"]["new_tokens"] += len(ref)
        t["oracle"]["passes"] += copy_oracle(prompt, ref)
        t["oracle2"]["passes"] += copy_oracle(prompt, ref, min_n=2)
        for name, (out, steps) in row_runs(prompt, model, tokenizer, eos, args.max_new_tokens,
                                               policy_maker(costs, not args.no_gate, args.tree_gate), args.rows.split(",")).items():
            c = t[name]
            c["mismatch"] += out != ref
            c["passes"] += len(steps)
            c["tokens"] += len(out)
            for k, n, rows in steps:
                c["drafting"] += k > 0
                c["drafted"] += k
                c["accepted"] += n
                c["rows"] += rows
                c["cost"] += priced[min(rows, len(priced)) - 1]  # the step's cost in one-position passes, by the pricing costs
                c[f"k{min(k, 10)}"] += 1
                c[f"k{min(k, 10)}acc"] += n
                c["zero_acc"] += k > 0 and n == 0
    for cat, t in table.items():
        a = t["all"]
        print(f"== {cat}: {a['prompts']} prompts, prompt tokens {a['prompt_tokens'] / a['prompts']:.0f} avg, new {a['new_tokens']}")
        print(f"   copy oracle passes (min n 1): {t['oracle']['passes']}, (min n 2): {t['oracle2']['passes']}")
        for name in args.rows.split(","):
            c = t[name]
            ks = " ".join(f"k{k}:{c[f'k{k}']}/{c[f'k{k}acc']}" for k in range(11) if c[f"k{k}"])
            print(f"   {name:6s} passes {c['passes']} tok/pass {c['tokens'] / c['passes']:.2f} drafting {c['drafting']} "
                  f"drafted {c['drafted']} accepted {c['accepted']} zero-accept {c['zero_acc']} rows {c['rows']} "
                  f"tokens per unit of cost {c['tokens'] / c['cost']:.3f} "
                  f"mismatch {c['mismatch']}\n          steps by k (count/accepted): {ks}")


if __name__ == "__main__":
    main()
