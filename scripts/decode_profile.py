"""Where a decoding or verification pass's time goes at each context on the C step: the embedded SmolLM2-135M
(float32), a cache filled once to the longest context, then at each of ``--contexts`` cached slots a pass of
each of ``--rows`` positions (1: decoding; 5, 8: verifying drafts; every position's logits, as a verification
asks), rolled back after it; contexts and widths interleaved within a round, medians over ``--rounds``.
Each pass's wall time, and its split into the linears, attention and the rest by a profiling build of the
library (``-DSTEP_PROFILE``: the CPU seconds by part of the busiest thread, which an imbalance between the threads
shows, where a sum over them would not); beside it the bytes a pass reads at least (the weights once, the keys
and values of every slot), and the wall time and the bytes as ratios to the shortest context's (how much more
a slot costs than its bytes). Variants of the same bits interleaved in each round: ``--split-from`` (c_step.c's
SPLIT_FROM; 100000: attention never split across the threads) x ``--prefetch`` (0: no software prefetches) x ``--few``
(kernels/f32_few.h's few-row loop: ``before`` off, ``few`` on, or one of its parts; scripts/f32_widths.py's VARIANTS).

CPU seconds split the pass only with ``OMP_WAIT_POLICY=passive`` (a thread waiting at a barrier sleeps); the
wall times are a pass's as runs see it without it (threads spin at a barrier). Noisy on a shared machine.

    OMP_WAIT_POLICY=passive .venv/bin/python scripts/decode_profile.py --contexts 16 256 512 768 1024 --rows 1 5 8 \
        --split-from 128 100000 --prefetch 1 0
"""
import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARTS = ("linears", "attention", "the rest")


def bytes_read(config, context: int) -> int:
    """Bytes a float32 pass reads at least: every weight once (the output layer's too) and the keys (their
    kept blocks) and values of ``context`` slots in every layer."""
    H, I, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    D = H // config.num_attention_heads
    Hq, Hkv = config.num_attention_heads, config.num_key_value_heads
    weights = layers * (H * (Hq + 2 * Hkv) * D + Hq * D * H + 3 * H * I) + config.vocab_size * H
    return 4 * (weights + layers * Hkv * D * 2 * context)


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[16, 256, 512, 768, 1024])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 5, 8])
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds (medians)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--split-from", type=int, nargs="+", default=[128],
                        help="c_step.c's SPLIT_FROM variants, interleaved (a huge one: never split; the same bits)")
    parser.add_argument("--prefetch", type=int, nargs="+", default=[1], help="attention's software prefetches (0: none), interleaved")
    parser.add_argument("--few", nargs="+", default=["few"], help="kernels/f32_few.h's variants (scripts/f32_widths.py's VARIANTS), interleaved")
    parser.add_argument("--march", default="native", help="the library built for this -march (haswell: the AVX2 build)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    from kernels import skinny

    skinny.FLAGS = tuple(f"-march={args.march}" if f == "-march=native" else f for f in skinny.FLAGS)
    skinny.FLAGS = (*skinny.FLAGS, "-DSTEP_PROFILE")  # its own library file (the flags are in its name)
    library = skinny.library()
    library.c_step_profile.restype = ctypes.c_int
    from runners import LeanRunner
    from utils.models import load_embedded

    model, tokenizer = load_embedded(torch.float32)
    longest = max(args.contexts) + max(args.rows)
    ids = torch.randint(len(tokenizer), (1, longest), generator=torch.Generator().manual_seed(0))
    runner = LeanRunner(model)
    runner(ids, 1)  # the cache filled once: each pass below rewrites slots with the same values
    parts = (ctypes.c_double * len(PARTS))()
    walls: Dict[Tuple[int, int, int], List[float]] = {}
    split: Dict[Tuple[int, int, int], List[List[float]]] = {}
    split_from = ctypes.c_int.in_dll(library, "c_step_split_from")
    prefetch = ctypes.c_int.in_dll(library, "c_step_prefetch")
    from f32_widths import VARIANTS

    library.skinny_set_few32.argtypes, library.skinny_set_few32.restype = [ctypes.c_int64] * 5, ctypes.c_int64
    variants = [(f, p, v) for f in args.split_from for p in args.prefetch for v in args.few]
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for c in sorted(args.contexts, reverse=True):  # each a rollback of the one before (a round's first: refilled)
            if runner.cached < c:
                runner(ids[:, :c], 1)
            for r in args.rows:
                for f in variants:
                    split_from.value, prefetch.value = f[:2]
                    library.skinny_set_few32(*VARIANTS[f[2]], 0)
                    runner.rollback(c)
                    library.c_step_profile(parts)
                    wall = time.perf_counter()
                    runner(ids[:, : c + r], r)
                    wall = time.perf_counter() - wall
                    library.c_step_busiest(parts)  # the busiest thread's: what the threads' imbalance costs
                    if round_:
                        walls.setdefault((c, r, f), []).append(wall)
                        split.setdefault((c, r, f), []).append(list(parts))
                    library.c_step_profile(parts)  # zeroed
    print(f"embedded SmolLM2-135M · float32 · {args.threads} threads · median of {args.rounds}")
    short = min(args.contexts)
    for r, f in ((r, f) for r in args.rows for f in variants):
        for c in args.contexts:
            median = [statistics.median(s[p] for s in split[c, r, f]) for p in range(len(PARTS))]
            shares = ", ".join(f"{name} {1e3 * s:.2f}" for name, s in zip(PARTS, median))  # the busiest thread's
            wall = statistics.median(walls[c, r, f])
            print(f"{r} positions at {c:4d} slots, split from {f[0]}, prefetch {f[1]}, {f[2]}: {1e3 * wall:6.2f} ms wall, x{wall / statistics.median(walls[short, r, f]):.3f} "
                  f"(bytes {bytes_read(model.config, c) / 1e6:.0f} MB, x{bytes_read(model.config, c) / bytes_read(model.config, short):.3f}); "
                  f"busiest thread's CPU ms: {shares}")


if __name__ == "__main__":
    main()
