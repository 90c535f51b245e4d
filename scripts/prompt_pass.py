"""The prompt pass and a long context's one-position pass on the embedded SmolLM2-135M (float32):

- a prompt pass (a fresh cache, logits of the last position) over 210 and 769 positions, on the
  C step and on the lean torch forward over the model's own linears (MKL), interleaved, medians,
  with the pass's GFLOP/s (2 * the linear layers' parameters * positions / seconds: the output
  layer counts once, as only the last position's logits are computed);
- a one-position pass after 700 cached positions on the C step (attention over a long context).

    .venv/bin/python scripts/prompt_pass.py                  # the figures (run alone)
    .venv/bin/python scripts/prompt_pass.py --rounds 1 --lengths 70 --context 80   # a smoke run
"""
import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[210, 769], help="prompt passes' positions")
    parser.add_argument("--context", type=int, default=700, help="cached positions before the one-position pass")
    parser.add_argument("--rounds", type=int, default=5, help="timed repeats of each measurement (median)")
    parser.add_argument("--threads", type=int, default=None, help="torch's threads (default: its own count)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from kernels import c_step, skinny
    from runners import LeanRunner, kernels
    from utils.models import load_embedded

    model, tokenizer = load_embedded()
    layers = model.model.layers
    linear = sum(p.numel() for layer in layers for p in layer.parameters() if p.dim() == 2)
    head = model.get_output_embeddings().weight.numel()
    longest = max(max(args.lengths), args.context + 1)
    ids = torch.randint(len(tokenizer), (1, longest), generator=torch.Generator().manual_seed(0))
    plans = {"C step": None, "torch, own (MKL)": False}
    times: Dict[tuple, List[float]] = {(name, n): [] for name in plans for n in args.lengths}
    from kernels.one_copy import held

    with torch.inference_mode(), held(model):  # "own" on the model's own weights (the C step frees them elsewhere)
        runners = {name: LeanRunner(model) for name in plans}
        for round_ in range(args.rounds + 1):  # round 0 warms up, outside the figures
            for name, value in plans.items():
                with kernels(model, value):
                    for n in args.lengths:
                        runners[name].rollback(0)
                        start = time.perf_counter()
                        runners[name](ids[:, :n], 1)
                        if round_:
                            times[name, n].append(time.perf_counter() - start)
        step = runners["C step"]
        assert step.step_passes > 0 and runners["torch, own (MKL)"].step_passes == 0
        step.rollback(0)
        step(ids[:, : args.context], 1)
        one = []
        for round_ in range(args.rounds + 1):
            start = time.perf_counter()
            step(ids[:, : args.context + 1], 1)
            if round_:
                one.append(time.perf_counter() - start)
            step.rollback(args.context)
    print(f"embedded SmolLM2-135M · float32 · {torch.get_num_threads()} threads · kernel {skinny.identity()} "
          f"(AVX width {skinny.library().skinny_simd()}) · C step in chunks of {c_step.CHUNK_ROWS} positions · "
          f"median of {args.rounds}")
    for n in args.lengths:
        flops = 2 * (linear * n + head)
        line = ", ".join(f"{name} {1e3 * statistics.median(times[name, n]):.1f} ms "
                         f"({flops / statistics.median(times[name, n]) / 1e9:.0f} GFLOP/s)" for name in plans)
        print(f"prompt pass of {n} positions: {line}")
    print(f"one-position pass after {args.context} cached positions, C step: {1e3 * statistics.median(one):.2f} ms")


if __name__ == "__main__":
    main()
