"""Trace the draft policy on recorded greedy outputs of the embedded model, without a clock: each row's
steps (drafts, accepted, pass width) and what the policy believed (pooled rate, the best length's expected
tokens per unit of cost), through the real loop against ``ReplayedRunner``, on given relative costs.

    .venv/bin/python scripts/policy_trace.py --prompts ../shared/specbench/question.jsonl --categories qa,summarization \
        --row-costs 1,1.2,1.25,1.28,1.3,1.31,1.32,1.33 [--steps]

Tokens per unit of cost (``tok/cost``) is the rows' speed over target AR's when the costs are right and
drafting's host time is nothing (target AR: 1.00). With ``--paid`` the policy starts from ``--row-costs`` and
measures in the loop (``live``) what the passes cost on a clock that only ``--paid`` advances. Records go to ``--cache`` (the outputs, not the prompts).
"""
import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import time  # noqa: E402
from typing import Callable, Optional  # noqa: E402

import torch  # noqa: E402

import sampling.chain_decoding as chain_decoding  # noqa: E402
from drafters import PromptLookupSpec, SuffixSpec  # noqa: E402
from drafters.ngram import NGramSpec  # noqa: E402
from drafters.spec import DraftContext  # noqa: E402
from ngram_assisted.persistence import KINDS  # noqa: E402
from sampling import DraftPolicy, GenerationStats, generate  # noqa: E402
from sampling.config import Observer, Step  # noqa: E402
from utils.replayed_runner import ReplayedRunner  # noqa: E402


class Traced(DraftPolicy):
    """The policy, noting before each step what it believed: the pooled rate and the best expected tokens per unit of cost."""

    def length(self, longest=None, left=None) -> int:
        self.belief = (self.rate() if self.trials else None, self.paused)
        return super().length(longest, left)


class Steps(Observer):
    def __init__(self, policy: Traced) -> None:
        self.policy, self.steps = policy, []

    def on_step(self, step: Step) -> None:
        self.steps.append((len(step.proposed), step.accepted, step.rows, getattr(self.policy, "belief", (None, 0))))
        self.policy.belief = (None, 0)


def record(prompts: List[str], categories: str, limit: int, length: int, cache: Path) -> List[dict]:
    """Per prompt, its tokens, target AR's greedy output and the top 3 tokens at each output position."""
    if cache.exists():
        return json.loads(cache.read_text())
    from app.bench.prompts import load_prompts
    from app.session import encode
    from sampling import autoregressive_generate
    from utils.models import load_embedded

    model, tokenizer = load_embedded()
    rows = []
    for item in load_prompts(prompts, categories, limit):
        prompt = encode(tokenizer, item["turns"][0], True)
        ref = autoregressive_generate(prompt, model, max_gen_len=length, eos_tokens_id=[tokenizer.eos_token_id], use_cache=True)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ref])).logits[0, len(prompt) - 1 : len(prompt) + len(ref) - 1]
        fillers = logits.topk(3, dim=-1).indices.tolist()
        rows.append(dict(category=item["category"], prompt=prompt, ref=ref, fillers=fillers, vocab=int(logits.shape[-1])))
    cache.write_text(json.dumps(rows))
    return rows


class Clock:
    """A clock the loop reads instead of ``time.perf_counter``: only the passes advance it, by their ``paid`` cost."""

    def __init__(self, paid: Callable[[int], float]) -> None:
        self.now, self.paid = 0.0, paid

    def perf_counter(self) -> float:
        return self.now


class PaidRunner(ReplayedRunner):
    """``ReplayedRunner`` whose pass over ``n_last`` positions advances ``clock`` by what it pays (seconds = relative cost)."""

    def __init__(self, clock: Clock, *args) -> None:
        super().__init__(*args)
        self.clock = clock

    def __call__(self, ids, n_last: int = 1):
        self.clock.now += self.clock.paid(n_last)
        return super().__call__(ids, n_last)


def replay(entry: dict, row: str, costs, gamma: int = 4, paid: Optional[Callable[[int], float]] = None,
           rule: Callable[..., DraftPolicy] = None) -> List[tuple]:
    """One row's steps on a recorded entry under the calibrated policy's values on ``costs``; with ``paid`` (the
    relative cost a pass over r positions really takes), the policy is live and the loop's clock reads those."""
    vocab, ref = entry["vocab"], entry["ref"]
    policy = (rule or Traced)(min_gain=1.0, row_costs=tuple(costs), live=paid is not None)
    seen = Steps(policy)
    values = dict(gamma=gamma, max_gen_len=len(ref), eos_tokens_id=[vocab - 1], policy=policy, stats=GenerationStats(), streamer=seen)
    args = (entry["prompt"], ref, vocab, dict(enumerate(entry["fillers"])))
    clock = Clock(paid) if paid is not None else None
    runner = PaidRunner(clock, *args) if clock is not None else ReplayedRunner(*args)
    chain_decoding.time = clock if clock is not None else time
    context = DraftContext()
    if row.startswith("ngram"):
        spec, context = NGramSpec(3), DraftContext(storage=KINDS[row.split(":")[1]](3, vocab))
    else:
        spec = PromptLookupSpec() if row == "pld" else SuffixSpec()
    torch.manual_seed(42)  # a random filler where the n-gram storage knows no context, as the bench seeds
    out, _ = generate(entry["prompt"], runner, spec, values, context)
    assert out == ref, f"{row} left target AR's tokens"
    return seen.steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", nargs="+", required=True)
    p.add_argument("--categories", default="qa")
    p.add_argument("--limit", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--row-costs", default="1,1.2,1.25,1.28,1.3,1.31,1.32,1.33", help="the costs the policy starts from")
    p.add_argument("--paid", help="what passes by positions really cost (default: --row-costs, and the policy not live)")
    p.add_argument("--rows", default="ngram:basic,ngram:onelevel,pld,suffix")
    p.add_argument("--cache", default="/tmp/policy_trace.json")
    p.add_argument("--steps", action="store_true", help="print every step")
    args = p.parse_args()
    costs = [float(c) for c in args.row_costs.split(",")]
    paid = [float(c) for c in args.paid.split(",")] if args.paid else None

    def cost(rows: int, costs=paid or costs) -> float:
        return costs[rows - 1] if rows <= len(costs) else costs[-1] + (costs[-1] - costs[0]) / (len(costs) - 1) * (rows - len(costs))

    entries = record(args.prompts, args.categories, args.limit, args.max_new_tokens, Path(args.cache))
    print(f"costs by positions: {' '.join(f'{c:.2f}' for c in costs)}" + (f", paid {' '.join(f'{c:.2f}' for c in paid)}" if paid else ""))
    for entry in entries:
        print(f"{entry['category']}: prompt {len(entry['prompt'])} tokens, {len(entry['ref'])} new")
        for row in args.rows.split(","):
            steps = replay(entry, row, costs, paid=cost if paid else None)
            units = sum(cost(rows) for _, _, rows, _ in steps)
            drafted = sum(d for d, *_ in steps)
            accepted = sum(a for _, a, *_ in steps)
            print(f"  {row:15s} steps {len(steps):3d}, tokens/step {len(entry['ref']) / len(steps):.2f}, drafts/step "
                  f"{drafted / len(steps):.2f}, accepted {accepted}/{drafted}, tok/cost {len(entry['ref']) / units:.3f}")
            if args.steps:
                print("    " + " ".join(f"{d}/{a}" + (f"@{r}" if r != d + 1 else "") + ("" if b[0] is None else f"({b[0]:.2f})")
                                         for d, a, r, b in steps))


if __name__ == "__main__":
    main()
