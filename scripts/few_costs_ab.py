"""The start-up's costs by positions 1..12 (``measure.timing.PassTimer``'s cached passes, as ``measure_row_costs``
and the kernel measurement time them) of the embedded SmolLM2-135M on the C step, float32 and bfloat16, with
kernels/f32_few.h's few-row loop off (``before``) and on (``few``; or ``--variants``), interleaved in one process: each round, each
dtype, each variant in turn (the order alternating by round) times every width once; medians over the rounds,
each variant's costs relative to its own one-position pass. bfloat16's linears do not read the switch: its two
rows are an A/A of the same code (the noise). Wall time on a shared machine: noisy; with ``--cpu`` the process's
CPU seconds a pass (run with OMP_WAIT_POLICY=passive, so that a thread waiting at a barrier sleeps): every thread's
work summed, which another process's time slices do not lengthen as they do the wall time.

    .venv/bin/python scripts/few_costs_ab.py --rounds 21
    OMP_WAIT_POLICY=passive .venv/bin/python scripts/few_costs_ab.py --rounds 21 --cpu
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
from f32_widths import VARIANTS  # noqa: E402  kernels/f32_few.h's f32_few by name (on, shape, bytes ahead into L2, from rows)


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--widths", type=int, default=12)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--variants", nargs="+", default=["before", "few"], choices=list(VARIANTS))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--least", action="store_true", help="each width's least sample, not the median (another process only adds time)")
    parser.add_argument("--cpu", action="store_true", help="the process's CPU seconds a pass, not the timer's wall seconds")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    from kernels import c_step, skinny
    from measure.timing import PassTimer
    from utils.models import load_embedded

    setter = skinny.library().skinny_set_few32
    setter.argtypes, setter.restype = [ctypes.c_int64] * 5, ctypes.c_int64
    timers = {}
    for dtype in (getattr(torch, d) for d in args.dtypes):
        model = load_embedded(dtype)[0]
        timers[str(dtype).split(".")[1]] = (PassTimer(model, args.context, args.widths), c_step.short_label(model))
    times: Dict[Tuple[str, str, int], List[float]] = {}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for name, (timer, _) in timers.items():
            for variant in (args.variants if round_ % 2 else args.variants[::-1]):
                setter(*VARIANTS[variant], 0)
                for rows in range(1, args.widths + 1):
                    cpu = time.process_time()
                    seconds = timer.seconds(rows)
                    seconds = time.process_time() - cpu if args.cpu else seconds
                    if round_:
                        times.setdefault((name, variant, rows), []).append(seconds)
    setter(*VARIANTS["few"], 0)
    print(f"costs by positions 1..{args.widths} after {args.context} positions, {'least' if args.least else 'median'} of {args.rounds} interleaved rounds ({'CPU' if args.cpu else 'wall'} seconds; noisy)")
    for name, (_, label) in timers.items():
        for variant in args.variants:
            pick = min if args.least else statistics.median
            medians = [pick(times[name, variant, r]) for r in range(1, args.widths + 1)]
            print(f"{name:8} {label}, {variant:6}: one position {1e3 * medians[0]:5.1f} ms; costs "
                  + " ".join(f"{m / medians[0]:.2f}" for m in medians))


if __name__ == "__main__":
    main()
