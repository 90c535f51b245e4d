"""The lean step against transformers' forward, on the embedded SmolLM2-135M (float32): cached passes
over 1, 5 and 8 new positions after a context (``LeanRunner`` and ``KVCacheModel`` with its dynamic
cache, interleaved, medians), and target AR's tokens/s over ``--tokens`` greedy tokens on each;
both on the same kernels (``--kernels``: the model's own linears, or every width on one option).
The greedy tokens of the two must be equal: the script says so, or stops.

    .venv/bin/python scripts/lean_step.py                       # the figures (run alone: ../shared/tools/quiet)
    .venv/bin/python scripts/lean_step.py --context 16 --rounds 2 --tokens 8   # a smoke run
"""
import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WIDTHS = (1, 5, 8)


def pass_seconds(runner, ids: torch.Tensor, context: int, width: int) -> float:
    """One cached pass of ``width`` new positions after ``context`` cached ones, then rolled back."""
    start = time.perf_counter()
    runner(ids[:, : context + width], width)
    seconds = time.perf_counter() - start
    runner.rollback(context)
    return seconds


def greedy(runner, prompt: torch.Tensor, tokens: int) -> tuple:
    """Target AR on ``runner``: (new tokens, seconds), prefill included."""
    ids, start = prompt, time.perf_counter()
    for _ in range(tokens):
        ids = torch.cat([ids, runner(ids)[-1].argmax().view(1, 1)], dim=1)
    return ids[0, prompt.shape[1] :].tolist(), time.perf_counter() - start


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=64, help="cached positions before each timed pass")
    parser.add_argument("--rounds", type=int, default=15, help="timed passes per runner and width (median)")
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens of the target AR run")
    parser.add_argument("--kernels", default="own", choices=("own", "skinny", "prepacked"), help="every width's linears")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*past_key_values.*")
    from runners import KVCacheModel, LeanRunner, set_prepack
    from utils.models import load_embedded

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_embedded()
    if args.kernels != "own" and not set_prepack(model, True, (args.kernels,)):
        sys.exit(f"--kernels {args.kernels}: the model's linears could not take it here")
    makers: Dict[str, Callable] = {"lean": lambda: LeanRunner(model), "transformers": lambda: KVCacheModel(model, cache="dynamic")}
    ids = torch.randint(len(tokenizer), (1, args.context + max(WIDTHS)), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        runners = {name: make() for name, make in makers.items()}
        for runner in runners.values():
            runner(ids[:, : args.context], 1)
            for width in WIDTHS:  # warm-up, outside the clock
                pass_seconds(runner, ids, args.context, width)
        times = {(name, w): [] for name in runners for w in WIDTHS}
        for _ in range(args.rounds):  # interleaved: a slower moment of the machine hits both
            for width in WIDTHS:
                for name, runner in runners.items():
                    times[name, width].append(pass_seconds(runner, ids, args.context, width))
        prompt = torch.tensor([tokenizer.encode("Write a short story about a lighthouse keeper.")])
        ar = {name: greedy(make(), prompt, args.tokens) for name, make in makers.items()}
    if ar["lean"][0] != ar["transformers"][0]:
        sys.exit("the lean forward's greedy tokens differ from transformers' forward's: a bug")
    print(f"embedded SmolLM2-135M · float32 · {torch.get_num_threads()} threads · kernels {args.kernels} · "
          f"context {args.context} · median of {args.rounds} · greedy tokens equal: yes")
    print(f"{'runner':<14}" + "".join(f"{f'{w} pos (ms)':>13}" for w in WIDTHS) + f"{'5/1':>7}{'8/1':>7}{'AR tok/s':>10}")
    for name in runners:
        ms = {w: 1e3 * statistics.median(times[name, w]) for w in WIDTHS}
        print(f"{name:<14}" + "".join(f"{ms[w]:>13.1f}" for w in WIDTHS) + f"{ms[5] / ms[1]:>7.2f}{ms[8] / ms[1]:>7.2f}"
              + f"{args.tokens / ar[name][1]:>10.1f}")


if __name__ == "__main__":
    main()
