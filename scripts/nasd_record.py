"""Record what NASD needs to be replayed without the model: on the real pair (``--preset pair``), per prompt,
the prompt's tokens, target AR's tokens, the target's ``top_k_filler`` most probable tokens at every output
position (what the storage learns as fillers), the start-up row costs, and NASD's own steps as the REPL runs
it (drafts, accepted, rows). ``scripts/nasd_replay.py`` replays storage and drafter variants on that record.
One pair process at a time (~9 GB in float32, ~5 GB in bfloat16).

    .venv/bin/python scripts/nasd_record.py --code-editing 2001,2002,2003 --dtype float32 --out /tmp/nasd.json
"""
import argparse
import json
import os
import sys
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from sampling.config import Observer, Step  # noqa: E402


class Steps(Observer):
    """Every step's (offset of its first new token, drafts, accepted, rows)."""

    def __init__(self) -> None:
        self.steps: List[list] = []

    def on_step(self, step: Step) -> None:
        self.steps.append([step.start - step.prompt_length, list(step.proposed), step.accepted, step.rows])


def load(dtype: str, length: int, given, live: bool):
    """The pair as the REPL loads it (``given``: start-up costs by positions 1..N, no calibration at load; ``live``:
    measured again in the loop, as the calibrated policy does) with the REPL's greedy settings: (pair, config, context)."""
    from app.pair import LoadOptions, load_pair, pair_preset
    from app.repl.repl import AUTO_ROWS
    from app.session import build_settings

    preset = pair_preset()
    pair = load_pair(preset["target"], preset["drafter"], LoadOptions(dtype=dtype, calibrate=given is None, row_costs=given), say=lambda *a, **k: None)
    config, context = build_settings(pair, "greedy", 4, length, say=lambda *a: None)
    config = config.with_(stop_if_unknown=True, auto_rows=AUTO_ROWS)  # the REPL's NASD row when no gamma is given
    if given is not None:  # the calibrated policy on these costs (the REPL's with --row-costs unless ``live``)
        config = config.with_policy(row_costs=given, live=live, min_gain=1.0)
    return pair, config, context


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--code-editing", default="2001", help="question_ids of prompts/code_editing.jsonl, comma separated")
    p.add_argument("--length", type=int, default=96)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--row-costs", default="", help="given start-up costs by positions 1..N, comma separated: no calibration at load")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    given = tuple(float(c) for c in args.row_costs.split(",")) if args.row_costs else None

    import drafters.ngram as ngram
    from app.session import encode
    from app.repl.repl import NGRAM_N
    from ngram_assisted import NGramStorage
    from runners.limits import output_vocab_size
    from strategies import STRATEGIES, run_strategy

    pair, config, context = load(args.dtype, args.length, given, live=False)
    by_key = {s.key: s for s in STRATEGIES}
    rows = {r["question_id"]: r for r in map(json.loads, open(Path(__file__).resolve().parents[1] / "prompts" / "code_editing.jsonl"))}
    fillers: Dict[int, List[int]] = {}
    accept = ngram.NGramDrafter.accept

    def recording(self, tokens, start, n_accepted, fetched):  # the top-k rows the loop hands the drafter, by position
        for i in range(n_accepted + 1):
            if fetched is not None:
                fillers[start + i] = list(fetched[i])
        return accept(self, tokens, start, n_accepted, fetched)

    ngram.NGramDrafter.accept = recording
    record = {"dtype": args.dtype, "length": args.length, "row_costs": list(config.policy.row_costs or ()), "prompts": []}
    for qid in (int(q) for q in args.code_editing.split(",")):
        prompt = encode(context.tokenizer, rows[qid]["turns"][0], True)
        ref = list(run_strategy(by_key["target"], prompt, config, context).tokens)
        fillers.clear()
        seen = Steps()
        context.streamer = seen
        context.storage = NGramStorage(NGRAM_N, output_vocab_size(pair.target))
        out = list(run_strategy(by_key["ngram"], prompt, config, context).tokens)
        context.streamer = None
        assert out == ref, f"{qid}: NASD differs from target AR"
        record["prompts"].append({"question_id": qid, "prompt": prompt, "ref": ref, "steps": seen.steps,
                                  "fillers": {str(k - len(prompt)): v for k, v in sorted(fillers.items())}})
        print(f"{qid}: prompt {len(prompt)} tokens, {len(ref)} new, NASD {len(seen.steps)} passes", flush=True)
    Path(args.out).write_text(json.dumps(record))


if __name__ == "__main__":
    main()
