"""Our target AR on the prompts of ``../shared/tools/openvino-anchor`` (the OpenVINO GenAI probe), like for like:
the same 12 Spec-Bench first turns as the project's token ids (its ``ids_main.json``: 8 open, 4 grounded), 64 new
tokens with eos ignored, prefill included, 2 threads, the median of 3 runs a prompt, and its summary: the sum of
new tokens over the sum of median walls, per set. Two paths: the notebook default (``autoregressive_generate`` on
the model as loaded) and the programs' (after ``choose_kernels``, as the REPL and the benchmark run).

    OV_WORK=~/.cache/specdec-ov-probe .venv/bin/python scripts/anchor_ar.py        # run alone: ../shared/tools/quiet
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OPEN = (81, 91, 101, 111, 121, 131, 141, 151)  # the probe's open questions, one per category
GROUNDED = (241, 242, 481, 482)  # its summarization and rag questions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=os.environ.get("OV_WORK", str(Path.home() / ".cache/specdec-ov-probe")))
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=int, default=0, help="at most this many prompts a set (0: all)")
    args = parser.parse_args()
    from measure import choose_kernels
    from sampling import autoregressive_generate
    from utils.models import load_embedded

    torch.set_num_threads(args.threads)
    ids = {int(k): v for k, v in json.load(open(Path(args.work) / "ids_main.json")).items()}
    sets = {"open": OPEN, "grounded": GROUNDED}
    if args.limit:
        sets = {name: qids[: args.limit] for name, qids in sets.items()}
    model, _ = load_embedded()

    def run(prompt):
        start = time.perf_counter()
        out = autoregressive_generate(prompt, model, args.tokens, eos_tokens_id=-1, use_cache=True)
        return time.perf_counter() - start, out

    paths = {}
    run(ids[OPEN[0]][:16])  # warm-up, untimed
    paths["notebook default (model as loaded)"] = {name: [[run(ids[q]) for _ in range(args.reps)] for q in qids]
                                                   for name, qids in sets.items()}
    _, line = choose_kernels(model)
    print(f"choose_kernels: {line}")
    run(ids[OPEN[0]][:16])
    paths["after choose_kernels (REPL, bench)"] = {name: [[run(ids[q]) for _ in range(args.reps)] for q in qids]
                                                   for name, qids in sets.items()}
    print(f"embedded SmolLM2-135M · float32 · {args.threads} threads · {args.tokens} new tokens, eos ignored, "
          f"prefill included · median of {args.reps}")
    tokens = {}
    for path, by_set in paths.items():
        for name, prompts in by_set.items():
            walls = [statistics.median(w for w, _ in runs) for runs in prompts]
            new = sum(len(runs[0][1]) for runs in prompts)
            tokens.setdefault(name, []).append([runs[0][1] for runs in prompts])
            print(f"[{path}] {name}: {new / sum(walls):.2f} tok/s (aggregate over {len(prompts)} prompts)")
    for name, (a, b) in tokens.items():
        print(f"{name}: the two paths' tokens {'equal' if a == b else 'differ'}")


if __name__ == "__main__":
    main()
