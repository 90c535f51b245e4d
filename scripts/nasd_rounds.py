"""Count NASD's steps round after round on the real pair, beside prompt lookup: per step the drafts asked of the
storage, proposed, verified and accepted, the pass's positions, the step's host seconds outside the pass (drafting,
the policy, the fillers' learning) and its wall seconds; per round the policy's own line (``DraftPolicy.chosen``).
The rows run as the REPL's do (NASD under gamma auto, a fresh n 8 storage each round), in ABBA order. Counts are
what to compare; seconds beside other work are noise. One pair process at a time (~9 GB in float32).

    .venv/bin/python scripts/nasd_rounds.py --code-editing 2001 --dtype float32 --rounds 3 --out /tmp/rounds.json
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from sampling.config import Observer, Step  # noqa: E402


class Timed:
    """Seconds spent in the wrapped methods since the last ``take``."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}

    def wrap(self, owner, name: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)

    def take(self) -> Dict[str, float]:
        taken, self.seconds = self.seconds, {}
        return taken


class Steps(Observer):
    """Each step: offset, drafts verified, accepted, rows, wall seconds since the previous step, host seconds by part."""

    def __init__(self, timed: Timed) -> None:
        self.timed, self.steps, self.last = timed, [], time.perf_counter()

    def on_step(self, step: Step) -> None:
        now = time.perf_counter()
        self.steps.append({"offset": step.start - step.prompt_length, "drafts": len(step.proposed), "accepted": step.accepted,
                           "rows": step.rows, "wall": now - self.last, "host": self.timed.take()})
        self.last = now


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--code-editing", type=int, default=2001, help="a question_id of prompts/code_editing.jsonl")
    p.add_argument("--length", type=int, default=96)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rows", default="ngram,pld")
    p.add_argument("--row-costs", default="", help="given start-up costs by positions 1..N, comma separated: no calibration "
                   "at load, and the loop measures them again as the programs' calibrated policy does")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    given = tuple(float(c) for c in args.row_costs.split(",")) if args.row_costs else None

    import drafters.ngram as ngram
    import sampling.chain_decoding as chain
    import drafters.prompt_lookup as lookup
    from app.repl.repl import NGRAM_N
    from app.session import encode
    from nasd_record import load
    from ngram_assisted import NGramStorage
    from runners.limits import output_vocab_size
    from sampling import draft_policy
    from strategies import STRATEGIES, run_strategy

    # as a measured start-up's policy (``DraftPolicy.calibrated``): given costs are measured again in the loop
    pair, config, context = load(args.dtype, args.length, given, live=True)
    timed = Timed()
    for name in ("propose", "accept", "fetch_logits", "evidence"):
        timed.wrap(ngram.NGramDrafter, name)
    for name in ("length", "ask", "trim", "update", "measured"):
        timed.wrap(draft_policy.DraftPolicy, name)
    timed.wrap(chain, "_verified")  # the tensor path: a softmax over every verified row (the fillers' ranks unclear)
    for cls in (c for c in vars(lookup).values() if isinstance(c, type) and "propose" in vars(c)):
        timed.wrap(cls, "propose")
    by_key = {s.key: s for s in STRATEGIES}
    rows = {r["question_id"]: r for r in map(json.loads, open(Path(__file__).resolve().parents[1] / "prompts" / "code_editing.jsonl"))}
    prompt = encode(context.tokenizer, rows[args.code_editing]["turns"][0], True)
    ar = run_strategy(by_key["target"], prompt, config, context)
    ref = list(ar.tokens)
    record = {"dtype": args.dtype, "row_costs": list(config.policy.row_costs or ()), "target_seconds": [ar.seconds], "rounds": []}
    keys = args.rows.split(",")
    for number in range(args.rounds):
        for key in keys if number % 2 == 0 else keys[::-1]:
            context.storage = NGramStorage(NGRAM_N, output_vocab_size(pair.target))
            seen = Steps(timed)
            context.streamer = seen
            timed.take()
            seen.last = time.perf_counter()
            result = run_strategy(by_key[key], prompt, config, context)
            context.streamer = None
            assert list(result.tokens) == ref, f"{key} differs from target AR"
            record["rounds"].append({"row": key, "round": number, "seconds": result.seconds, "policy": result.stats.policy,
                                     "steps": seen.steps})
            drafted = sum(s["drafts"] for s in seen.steps)
            print(f"round {number} {key}: {result.seconds:.2f} s, {len(seen.steps)} passes, {drafted} drafted, "
                  f"{sum(s['accepted'] for s in seen.steps)} accepted; {result.stats.policy}", flush=True)
        ar = run_strategy(by_key["target"], prompt, config, context)
        record["target_seconds"].append(ar.seconds)
        print(f"round {number} target AR: {ar.seconds:.2f} s", flush=True)
    Path(args.out).write_text(json.dumps(record))


if __name__ == "__main__":
    main()
