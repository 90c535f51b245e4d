"""The drafter's output layer cut to part of its rows (``--drafter-head``, ``kernels/head_rows.py``) on the real pair:
(1) acceptance, no clock read: on code-editing prompts, how often the drafter's greedy token is the target AR token,
whole layer against the first N rows plus the prompt's and the output-so-far's tokens (emulated from the whole
layer's logits, which the cut rows equal bit for bit); (2) the drafter's one-position pass by rows, the counts
interleaved round by round, each round's time over the whole layer's (paired). NOISY on a shared machine: read
the paired ratios. Loads the bfloat16 pair (~5 GB).

    .venv/bin/python scripts/drafter_rows.py --prompts 2001,2002,2003 --rows 16384,32768,65536 [--threads 1]
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def agreement(pair, config, context, prompt, counts, length: int) -> dict:
    """count (0: all rows) -> (positions where the drafter's greedy token is target AR's, tokens, target tokens outside the rows)."""
    from runners import make_runner
    from sampling import autoregressive_generate

    out = autoregressive_generate(prompt, pair.target, length, eos_tokens_id=list(pair.end_tokens), use_cache=True, runner=config.runner)
    seq, ends = prompt + out, set(pair.end_tokens)
    logits = make_runner(pair.drafter, True, None, config.drafter_runner)(torch.tensor([seq]), len(out) + 1)[:-1]  # before each token
    found = {}
    for count in counts:
        agree = outside = 0
        for i, token in enumerate(out):
            seen = set(seq[: len(prompt) + i]) | ends
            rows = torch.tensor(sorted(set(range(count)) | {t for t in seen if t >= count})) if count else None
            pick = int(logits[i].argmax()) if rows is None else int(rows[logits[i, rows].argmax()])
            agree += pick == token
            outside += bool(count) and token >= count and token not in seen
        found[count] = (agree, len(out), outside)
    return found


def pass_ratios(drafter, counts, rounds: int) -> dict:
    """count -> (median ms, least ms, median of each round's time over the whole layer's), one-position passes after 124."""
    from drafters.model import drafted_rows
    from runners import LeanRunner

    ids = torch.randint(0, 30000, (1, 125), generator=torch.Generator().manual_seed(0))
    runners = {}
    for count in counts:
        runners[count] = LeanRunner(drafter)
        drafted_rows(runners[count], count)
        runners[count](ids[:, :124], 1)
    times = {count: [] for count in counts}
    for round_ in range(rounds):
        for count in counts if round_ % 2 == 0 else counts[::-1]:
            start = time.perf_counter()
            runners[count](ids, 1)
            times[count].append(time.perf_counter() - start)
            runners[count].rollback(124)
    return {c: (1e3 * statistics.median(t), 1e3 * min(t), statistics.median(a / b for a, b in zip(t, times[0]))) for c, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", default="2001,2002,2003,2004,2005,2006", help="code-editing question ids")
    p.add_argument("--rows", default="16384,32768,49152,65536")
    p.add_argument("--length", type=int, default=96)
    p.add_argument("--rounds", type=int, default=40, help="interleaved rounds of the pass timing (0: none)")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    from app.pair import LoadOptions, load_pair, pair_preset
    from app.session import build_settings, encode

    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    preset = pair_preset()
    pair = load_pair(preset["target"], preset["drafter"], LoadOptions(dtype="bfloat16", drafter_dtype="bfloat16", calibrate=False),
                     say=lambda *a, **k: None)
    config, context = build_settings(pair, "greedy", 4, args.length, say=lambda *a: None, head="full")
    counts = [0] + [int(c) for c in args.rows.split(",")]
    rows = {r["question_id"]: r["turns"][0] for r in map(json.loads, open(ROOT / "prompts" / "code_editing.jsonl"))}
    total = {c: [0, 0, 0] for c in counts}
    for qid in (int(q) for q in args.prompts.split(",")):
        found = agreement(pair, config, context, encode(context.tokenizer, rows[qid], True), counts, args.length)
        print(f"q{qid}: " + " · ".join(f"{c or 'all'}: {a}/{n}" + (f" ({o} outside)" if c else "") for c, (a, n, o) in found.items()), flush=True)
        for c, values in found.items():
            total[c] = [x + y for x, y in zip(total[c], values)]
    print("greedy agreement: " + " · ".join(f"{c or 'all rows'}: {a / n:.3f}" + (f" ({o / n:.3f} of the target's tokens outside)" if c else "")
                                            for c, (a, n, o) in total.items()))
    if args.rounds:
        for c, (median, least, ratio) in pass_ratios(pair.drafter, counts, args.rounds).items():
            print(f"drafter pass, {c or 'all'} rows, {torch.get_num_threads()} thread(s): median {median:.1f} ms, least {least:.1f} ms, "
                  f"paired ratio to all rows {ratio:.3f}")


if __name__ == "__main__":
    main()
