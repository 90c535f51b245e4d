"""Counts of the REPL's drafting rows on the real pair (``--preset pair``) under policy variants: passes,
tokens per pass, drafts per drafting step, steps with no draft, pauses, and the pass widths, for the
policy as the programs run it (costs in the loop, the evidence gate) and with either switched off.
Counts, not clocks: the live variants read the loop's clock (so their choices may move from run to
run), the others decide on the start-up costs alone. One pair process at a time: ~9 GB in float32.

    .venv/bin/python scripts/pair_counts.py --rows ngram,pld --length 96

Every row's tokens are checked against target AR's (greedy).
"""
import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from sampling.config import Observer, Step  # noqa: E402

# docs/results.md's rename prompt (the REPL runs of the pair)
RENAME = ("Rename the variable `x` to `total` in this Python function and return the whole function.\n\n"
          "def add_all(values):\n    x = 0\n    for value in values:\n        x += value\n    return x")
VARIANTS = {"now": {}, "no-gate": {"gate": False}, "no-live": {"live": False}, "before": {"gate": False, "live": False},
            "auto": {"auto": True}}  # auto: --gamma auto (drafts past gamma up to the longest measured pass)


class Steps(Observer):
    """Every step's (drafted, accepted, rows)."""

    def __init__(self) -> None:
        self.steps: List[tuple] = []

    def on_step(self, step: Step) -> None:
        self.steps.append((len(step.proposed), step.accepted, step.rows))


def summary(steps: List[tuple], tokens: int, costs) -> str:
    """One line of counts for a row's steps (``costs``: the start-up relative costs by positions)."""
    drafting = [s for s in steps if s[0] > 0]
    cost = sum(costs[min(r, len(costs)) - 1] for _, _, r in steps)
    widths = Counter(r for _, _, r in steps)
    ks = Counter(min(k, 12) for k, _, _ in steps)
    return (f"passes {len(steps)} tok/pass {tokens / max(1, len(steps)):.2f} drafting {len(drafting)} "
            f"drafts/step {sum(k for k, _, _ in drafting) / max(1, len(drafting)):.2f} "
            f"accepted {sum(a for _, a, _ in steps)} zero-accept {sum(1 for k, a, _ in drafting if a == 0)} "
            f"tokens per start-up unit {tokens / max(cost, 1e-9):.3f}\n      k: {dict(sorted(ks.items()))} widths: {dict(sorted(widths.items()))}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="ngram,pld", help="strategies (keys in strategies.STRATEGIES)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    p.add_argument("--length", type=int, default=96)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prompt", default=RENAME)
    p.add_argument("--code-editing", type=int, help="instead of --prompt: this question_id of prompts/code_editing.jsonl")
    args = p.parse_args()

    from app.pair import LoadOptions, load_pair, pair_preset
    from app.session import build_settings, encode
    from sampling import GenerationStats
    from strategies import STRATEGIES, run_strategy

    preset = pair_preset()
    pair = load_pair(preset["target"], preset["drafter"], LoadOptions(dtype=args.dtype), say=lambda *a, **k: None)
    config, context = build_settings(pair, "greedy", 4, args.length, say=lambda text, *_: print(text))
    config = config.with_(stop_if_unknown=True)  # NASD as the REPL runs it (app.repl.repl.Repl)
    from app.repl.repl import NGRAM_N
    from ngram_assisted import NGramStorage
    from runners.limits import output_vocab_size

    text = args.prompt
    if args.code_editing is not None:
        rows = [json.loads(line) for line in open(Path(__file__).resolve().parents[1] / "prompts" / "code_editing.jsonl")]
        text = next(row["turns"][0] for row in rows if row["question_id"] == args.code_editing)
    prompt = encode(context.tokenizer, text, True)
    by_key = {s.key: s for s in STRATEGIES}
    ref = run_strategy(by_key["target"], prompt, config, context).tokens
    from scripts.grounded_counts import copy_oracle

    print(f"prompt {len(prompt)} tokens, target AR {len(ref)} tokens, copy oracle passes (min n 1) "
          f"{copy_oracle(prompt, list(ref))}; policy: {config.policy}")
    costs = config.policy.row_costs or (1.0,)
    for key in args.rows.split(","):
        for name in args.variants.split(","):
            seen = Steps()
            run = config.with_policy(**VARIANTS[name])
            context.streamer = seen
            context.storage = NGramStorage(NGRAM_N, output_vocab_size(pair.target))  # the REPL's fresh storage: basic, n NGRAM_N
            result = run_strategy(by_key[key], prompt, run, context)
            context.streamer = None
            ok = "exact" if result.tokens == ref else "MISMATCH"
            print(f"{key:6s} {name:8s} {ok} {summary(seen.steps, len(result.tokens), costs)}\n      "
                  f"paused {result.stats.paused_steps}; {getattr(result.stats, 'policy', '')}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
