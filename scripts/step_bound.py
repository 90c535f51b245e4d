"""The C step against the machine's memory bound, on the embedded SmolLM2-135M (float32):

- the bound: a plain sum over as many bytes as the model's linear weights (its read speed, GB/s);
- the linears alone: every weight matrix of a pass through the skinny kernel on its blocked copy
  (q/k/v and gate/up fused, the output layer last), as the step calls them, at 1, 5 and 8 rows;
- whole cached passes over 1, 5 and 8 positions after a context: the C step, and the lean torch
  forward on the model's own linears (MKL) and on oneDNN's prepacked ones (interleaved, medians);
- target AR's tokens/s on the step and on the model's own linears, and whether their greedy tokens agree.

    .venv/bin/python scripts/step_bound.py                   # the figures (run alone: ../shared/tools/quiet)
    .venv/bin/python scripts/step_bound.py --rounds 2 --tokens 8 --context 16   # a smoke run
"""
import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lean_step import greedy  # noqa: E402  (scripts/lean_step.py: target AR on a runner, timed)

WIDTHS = (1, 5, 8)


def median_seconds(run: Callable[[], object], rounds: int) -> float:
    run()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def linear_sweeps(model, rows: int):
    """A call that runs every linear of one pass of ``model`` on ``rows`` rows, as the step does."""
    from kernels import skinny
    from kernels.blocked import blocked, fused

    library = skinny.library()
    body, calls = model.model, []
    for layer in body.layers:
        a, m = layer.self_attn, layer.mlp
        for weights in ([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], [a.o_proj.weight],
                        [m.gate_proj.weight, m.up_proj.weight], [m.down_proj.weight]):
            packed = fused(weights) if len(weights) > 1 else blocked(weights[0])
            n, k = sum(w.shape[0] for w in weights), weights[0].shape[1]
            calls.append((torch.randn(rows, k), packed, torch.empty(rows, n)))
    head = model.get_output_embeddings().weight
    calls.append((torch.randn(rows, head.shape[1]), blocked(head), torch.empty(rows, head.shape[0])))
    threads = torch.get_num_threads()

    def run():
        for x, packed, out in calls:
            skinny.run_linear(library, x, packed, None, out, threads)
    return run, sum(packed.numel() * 4 for _, packed, _ in calls)


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=64, help="cached positions before each timed pass")
    parser.add_argument("--rounds", type=int, default=15, help="timed repeats of each measurement (median)")
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens of the target AR runs")
    args = parser.parse_args(argv)
    from kernels import skinny
    from runners import LeanRunner, kernels
    from utils.models import load_embedded

    if not skinny.available()[0]:
        sys.exit(f"the skinny kernel is not built here: {skinny.available()[1]}")
    from kernels.one_copy import held

    model, tokenizer = load_embedded()
    with torch.inference_mode(), held(model):  # "own" on the model's own weights (the C step frees them elsewhere)
        sweeps = {w: linear_sweeps(model, w) for w in WIDTHS}
        size = sweeps[1][1]
        plain = torch.ones(size // 4)
        read = median_seconds(lambda: plain.sum(), args.rounds)
        del plain
        linears = {w: median_seconds(sweeps[w][0], args.rounds) for w in WIDTHS}
        ids = torch.randint(len(tokenizer), (1, args.context + max(WIDTHS)), generator=torch.Generator().manual_seed(0))
        plans = {"C step": None, "torch, own (MKL)": False, "torch, prepacked (oneDNN)": True}
        runners = {name: LeanRunner(model) for name in plans}
        times: Dict[tuple, List[float]] = {(name, w): [] for name in plans for w in WIDTHS}
        for round_ in range(args.rounds + 1):  # interleaved; round 0 warms up, outside the figures
            for name, value in plans.items():
                with kernels(model, value):
                    runner = runners[name]
                    if round_ == 0:
                        runner(ids[:, : args.context], 1)
                    for w in WIDTHS:
                        start = time.perf_counter()
                        runner(ids[:, : args.context + w], w)
                        if round_:
                            times[name, w].append(time.perf_counter() - start)
                        runner.rollback(args.context)
        assert runners["C step"].step_passes > 0 and runners["torch, own (MKL)"].step_passes == 0
        prompt = torch.tensor([tokenizer.encode("Write a short story about a lighthouse keeper.")])
        ar = {}
        for name, value in (("C step", None), ("torch, own (MKL)", False)):
            with kernels(model, value):
                ar[name] = greedy(LeanRunner(model), prompt, args.tokens)
    bound = read  # seconds to read the weights once at the plain sum's speed
    print(f"embedded SmolLM2-135M · float32 · {torch.get_num_threads()} threads · kernel {skinny.identity()} "
          f"(AVX width {skinny.library().skinny_simd()}) · median of {args.rounds}")
    print(f"bound: a plain sum reads {size / 1e6:.0f} MB at {size / read / 1e9:.1f} GB/s: {bound * 1e3:.1f} ms a pass")
    for w in WIDTHS:
        print(f"linears alone, {w} row(s): {linears[w] * 1e3:.1f} ms, {size / linears[w] / 1e9:.1f} GB/s, "
              f"{linears[w] / bound:.2f}x the bound")
    print(f"{'pass':<28}" + "".join(f"{f'{w} pos (ms)':>13}" for w in WIDTHS) + f"{'5/1':>7}{'8/1':>7}{'x bound':>9}")
    for name in plans:
        ms = {w: 1e3 * statistics.median(times[name, w]) for w in WIDTHS}
        print(f"{name:<28}" + "".join(f"{ms[w]:>13.1f}" for w in WIDTHS) + f"{ms[5] / ms[1]:>7.2f}{ms[8] / ms[1]:>7.2f}"
              f"{ms[1] / 1e3 / bound:>9.2f}")
    step_ms = 1e3 * statistics.median(times["C step", 1])
    print(f"the step around its linears: {step_ms - linears[1] * 1e3:.1f} ms a one-position pass")
    same = ar["C step"][0] == ar["torch, own (MKL)"][0]
    first = next((i for i, (a, b) in enumerate(zip(*(ar[n][0] for n in ar))) if a != b), None)
    for name, (tokens, seconds) in ar.items():
        print(f"target AR, {name}: {len(tokens) / seconds:.1f} tokens/s over {len(tokens)} tokens (prefill included)")
    print("greedy tokens of the two: " + ("equal" if same else f"differ from token {first} (another kernel's rounding)"))


if __name__ == "__main__":
    main()
