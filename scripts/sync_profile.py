"""Where a one-position pass's time goes between its sync points, on the embedded SmolLM2-135M, float32 and bfloat16:
a profiling build of the C step (``-DSTEP_PROFILE -DSTEP_PROFILE_WALL``: each thread's wall seconds by part, and its
seconds waiting at the linears' barriers, ``kernels/step_profile.h``'s SYNC), a cached pass at ``--context`` slots,
at each of ``--bridges`` (``kernels/step_bridge.h``'s bytes, set at run time: the same bits), interleaved in each
round, medians over ``--rounds``, over their fastest quarter, and the fastest pass's split. Per pass: the wall time and the C call's (of it,
until its team's last thread began, and after the team, the logits' tops); a thread's mean wall ms in the linears
(a bridge's prefetches included), attention, the rest (norms, RoPE and the keys' blocks, the activation, the
output layer's finish) and at the linears' barriers, and the most one thread waited (``--cpu``: a thread's CPU ms
instead). ``--deals``: each of the linears' shares (``kernels/deal.h``: 0 static, 1 the ends stolen; set at run
time, the same bits), each with every bridge. Noisy on a shared machine: a thread put off its core by another process shows as the other's wait.

    .venv/bin/python scripts/sync_profile.py --bridges 0 65536 --rounds 21
    .venv/bin/python scripts/sync_profile.py --bridges 0 --deals 0 1 --rounds 41
"""
import argparse
import copy
import ctypes
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARTS = ("linears", "attention", "the rest")


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bridges", type=int, nargs="+", default=[0, 65536], help="bytes of the next linear's share prefetched")
    parser.add_argument("--deals", type=int, nargs="+", default=[0], help="the linears' shares: 0 static, 1 the ends stolen")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cpu", action="store_true", help="each thread's CPU seconds by part, not wall (run with "
                        "OMP_WAIT_POLICY=passive: a waiting thread sleeps; a busy machine's time slicing unseen)")
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16"], default=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    from kernels import skinny

    wall = () if args.cpu else ("-DSTEP_PROFILE_WALL",)
    skinny.FLAGS = (*skinny.FLAGS, "-DSTEP_PROFILE", *wall)  # its own library file (the flags name it)
    library = skinny.library()
    from runners import LeanRunner
    from utils.models import load_embedded

    base, tokenizer = load_embedded(torch.float32)
    ids = torch.randint(len(tokenizer), (1, args.context + 1), generator=torch.Generator().manual_seed(0))
    runners = {}
    for name in args.dtypes:
        runners[name] = LeanRunner(copy.deepcopy(base).to(torch.bfloat16) if name == "bfloat16" else base)
        runners[name](ids[:, : args.context], 1)
    parts, waits, call = (ctypes.c_double * len(PARTS))(), (ctypes.c_double * args.threads)(), (ctypes.c_double * 3)()
    found: Dict[Tuple[str, int, int], List[Tuple[float, ...]]] = {}
    settings = [(deal, b) for deal in args.deals for b in args.bridges]
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for name, runner in runners.items():
            for deal, b in settings if round_ % 2 else reversed(settings):
                library.c_step_set_bridge(b)
                library.skinny_set_deal(deal)
                library.c_step_profile(parts), library.c_step_waited(waits, args.threads), library.c_step_called(call)  # zeroed
                start = time.perf_counter()
                runner(ids, 1)
                wall = time.perf_counter() - start
                runner.rollback(args.context)
                library.c_step_profile(parts), library.c_step_waited(waits, args.threads), library.c_step_called(call)
                if round_:
                    each = [p / args.threads for p in parts]
                    found.setdefault((name, deal, b), []).append((wall, *each, sum(waits) / args.threads, max(waits), *call))
    print(f"embedded SmolLM2-135M · {args.threads} threads · {args.context} cached · median of {args.rounds} · {'CPU' if args.cpu else 'wall'} ms by part")
    for (name, deal, b), rows in found.items():
        quiet = min(rows)  # the fastest pass's split: the quietest moment the machine gave
        quarter = sorted(rows)[: max(1, len(rows) // 4)]  # the fastest quarter's medians: a busy machine's bursts left out
        for label, row in (("median", [statistics.median(r[i] for r in rows) for i in range(9)]),
                           ("quarter", [statistics.median(r[i] for r in quarter) for i in range(9)]), ("fastest", quiet)):
            wall, linears, attention, rest, wait, most, inside, woken, tops = (1e3 * v for v in row)
            print(f"{name:8} deal {deal} bridge {b:7d} B, {label:7}: pass {wall:6.2f}, in c_step {inside:6.2f} (team woken {woken:5.3f}, "
                  f"tops {tops:5.3f}); a thread's linears {linears:6.2f}, attention {attention:5.2f}, the rest {rest:5.2f}, "
                  f"at the barriers {wait:5.2f} (the most waiting {most:5.2f})")


if __name__ == "__main__":
    main()
