"""The C step's key blocks kept beside the cache (``kernels.kept_keys``) against a fresh transposition every
pass, on the embedded SmolLM2-135M (float32): one-position passes after a context, the two interleaved in one
process (each pass rolled back, each on its own runner's cache), their logits compared bit for bit; medians of the wall time and, with
``--profile`` (the ``-DSTEP_PROFILE`` build), of the step's CPU time by part (linears, attention, the rest:
the transposition is in the rest, the kept blocks' reads in attention).

    .venv/bin/python scripts/kept_keys_ab.py --context 400 800 --rounds 40 [--profile]   # alone: ../shared/tools/quiet
"""
import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARTS = ("linears", "attention", "rest")


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, nargs="+", default=[400, 800], help="cached positions before each timed pass")
    parser.add_argument("--rounds", type=int, default=40, help="timed pairs (medians)")
    parser.add_argument("--profile", action="store_true", help="the profiling build: CPU ms by part too")
    parser.add_argument("--march", default="native", help="the library built for this -march (haswell: the AVX2 build)")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    from kernels import skinny

    skinny.FLAGS = tuple(f"-march={args.march}" if f == "-march=native" else f for f in skinny.FLAGS)  # its own library file
    if args.profile:
        skinny.FLAGS = (*skinny.FLAGS, "-DSTEP_PROFILE")  # its own library file (the flags are in its name)
    library = skinny.library()
    import kernels.kept_keys as kept_keys
    from runners import LeanRunner
    from utils.models import load_embedded

    model, tokenizer = load_embedded(torch.float32)
    parts = (ctypes.c_double * len(PARTS))()
    print(f"embedded SmolLM2-135M · float32 · {torch.get_num_threads()} threads · one-position passes · median of {args.rounds}")
    for context in args.context:
        ids = torch.randint(len(tokenizer), (1, context + 1), generator=torch.Generator().manual_seed(0))
        runners = {keep: LeanRunner(model) for keep in (True, False)}  # a cache each: passes with keeping off drop a cache's blocks
        for keep, runner in runners.items():
            kept_keys.KEEP = keep
            runner(ids[:, :context], 1)
        walls: Dict[bool, List[float]] = {True: [], False: []}
        split: Dict[bool, List[List[float]]] = {True: [], False: []}
        for round_ in range(args.rounds + 1):  # round 0 warms up; the order alternates
            logits = {}
            for keep in (True, False) if round_ % 2 else (False, True):
                kept_keys.KEEP, runner = keep, runners[keep]
                if args.profile:
                    library.c_step_profile(parts)
                start = time.perf_counter()
                logits[keep] = runner(ids, 1)
                wall = time.perf_counter() - start
                if args.profile:
                    library.c_step_profile(parts)
                if round_:
                    walls[keep].append(wall), split[keep].append(list(parts))
                runner.rollback(context)
            if not torch.equal(logits[True], logits[False]):
                sys.exit(f"context {context}: the kept blocks' logits differ from a fresh transposition's: a bug")
        kept_keys.KEEP = True
        for keep in (True, False):
            line = f"context {context}, {'kept blocks' if keep else 'fresh every pass'}: {1e3 * statistics.median(walls[keep]):.2f} ms wall"
            if args.profile:
                ms = [1e3 * statistics.median(s[p] for s in split[keep]) for p in range(len(PARTS))]
                line += "; CPU ms " + ", ".join(f"{name} {m:.2f}" for name, m in zip(PARTS, ms)) + f", all {sum(ms):.2f}"
            print(line)
    print("logits: equal bit for bit in every pair")


if __name__ == "__main__":
    main()
