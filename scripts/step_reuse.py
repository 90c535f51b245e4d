"""What a runner's first pass pays for its C step on the embedded model: a step made again
(``CStep(model)`` on a model already released, what every generate call paid before
``kernels.step_pool``), against the kept step's per-runner check (``shared_step``), and the part of
either that is the output layer's check by value (``kernels.skinny.holds``). Medians of ``--rounds``,
in ms, on torch's threads (``--threads``). Take it on a quiet machine:

    ../shared/tools/quiet -- .venv/bin/python scripts/step_reuse.py --rounds 9
"""
import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def median_ms(run: Callable[[], object], rounds: int) -> float:
    """The median wall time of ``run`` over ``rounds`` calls, in ms."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from kernels import skinny
    from kernels.c_step import CStep
    from kernels.step_pool import shared_step
    from utils.models import load_embedded

    model = load_embedded()[0]
    started = time.perf_counter()
    step = shared_step(model)  # the first: the layers released, the step kept
    first = (time.perf_counter() - started) * 1e3
    made = median_ms(lambda: CStep(model), args.rounds)
    shared_step(model)  # kept again (a CStep made since does not replace it)
    kept = median_ms(lambda: shared_step(model), args.rounds)
    assert shared_step(model) is shared_step(model), "the kept step is reused"
    holds = median_ms(lambda: skinny.holds(step.head, step.output.weight), args.rounds)
    print(f"threads {args.threads} · first step {first:.0f} ms (blocks the layers) · a step made again {made:.1f} ms · "
          f"the kept step's check {kept:.1f} ms, of which the output layer's by value {holds:.1f} ms")


if __name__ == "__main__":
    main()
