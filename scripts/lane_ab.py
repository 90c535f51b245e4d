"""A verification pass on the decided lane against the full pass (``runners.lean_lane``), on the embedded
SmolLM2-135M: the same pass of ``--rows`` positions at the same slots, one side then the other in ABBA order in
one process, ``--rounds`` rounds; per side the median wall and process CPU milliseconds of a pass, its host part
(the wall outside the ``c_step`` call, timed around it on both sides alike), and the median of the rounds'
differences (lane minus full). The full side runs with a lane that has recorded nothing (the runner's
own is kept aside), so the lane side's record stays valid between them. Checks the two sides' logits bit for bit.

    ../shared/tools/quiet -- .venv/bin/python scripts/lane_ab.py [--rows 4] [--rounds 300] [--dtype bfloat16] [--threads 1]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from runners import LeanRunner  # noqa: E402
from kernels.step_one import one_pass  # noqa: E402
from runners.lean_lane import Lane  # noqa: E402
from utils.models import load_embedded  # noqa: E402

PROMPT = [(37 * i + 11) % 30000 for i in range(40)]  # token ids: the pass's cost does not depend on which


INSIDE = [0.0]  # seconds inside ``c_step`` calls since the last reset


def clocked(call):
    """``call`` (a ctypes function) timed into ``INSIDE``."""
    def run(*args):
        begin = time.perf_counter()
        try:
            return call(*args)
        finally:
            INSIDE[0] += time.perf_counter() - begin
    return run


def timed(runner: LeanRunner, ids: torch.Tensor, start: int, rows: int):
    """One pass of ``rows`` positions from slot ``start``: (logits, (wall, process CPU, host wall) ms)."""
    runner.rollback(start)
    INSIDE[0] = 0.0
    wall, cpu = time.perf_counter(), time.process_time()
    logits = runner(ids[:, : start + rows], rows)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return logits, (1e3 * wall, 1e3 * cpu, 1e3 * (wall - INSIDE[0]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=4, help="positions a pass (2..12; default 4)")
    p.add_argument("--rounds", type=int, default=300, help="ABBA rounds (default 300)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=0, help="torch's (and the step's) threads (default: as set)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, _ = load_embedded(getattr(torch, args.dtype))
    runner = LeanRunner(model)
    ids = torch.tensor([PROMPT + [(53 * i + 7) % 30000 for i in range(args.rows + 1)]])
    start = len(PROMPT)
    runner(ids[:, :start], 1)
    runner(ids[:, : start + 1], 1)  # a full pass after the prompt's: the lane recorded
    runner(ids[:, : start + 2], 1)  # the lane's first pass: its call made ready, then both sides' C calls clocked
    decided = runner.lane
    library, lane_call = runner.step.library, one_pass(runner.step)
    library.c_step, lane_call.call = clocked(library.c_step), clocked(lane_call.call)
    sides = {"lane": decided, "full": Lane()}
    found = {name: [] for name in sides}
    first = {}
    for i in range(args.rounds):
        for name in (("lane", "full") if i % 2 == 0 else ("full", "lane")):
            runner.lane = sides[name] if name == "lane" else Lane()  # a fresh one: key None, the full pass
            logits, times = timed(runner, ids, start, args.rows)
            first.setdefault(name, logits.clone())
            found[name].append(times)
    runner.lane = decided
    if not torch.equal(first["lane"], first["full"]):
        raise SystemExit("the lane's logits differ from the full pass's")
    if decided.passes < args.rounds:
        raise SystemExit(f"the lane ran {decided.passes} of {args.rounds} passes")
    print(f"{args.dtype}, {args.rows} positions at slot {start}, {args.rounds} ABBA rounds, {torch.get_num_threads()} threads")
    for k, what in enumerate(("wall", "process CPU", "host (wall outside c_step)")):
        lane = statistics.median(x[k] for x in found["lane"])
        full = statistics.median(x[k] for x in found["full"])
        diff = statistics.median(a[k] - b[k] for a, b in zip(found["lane"], found["full"]))
        print(f"  {what}: lane {lane:.3f} ms, full {full:.3f} ms, median difference {diff:+.3f} ms ({lane / full:.3f}x)")


if __name__ == "__main__":
    main()
