"""Where a token of target AR goes outside the C call: the embedded SmolLM2-135M, greedy, ``--new`` tokens a run,
each runner and step function wrapped by a clock (its mean microseconds a token, callees included; the clocks'
own cost is in them). "C call" is the C step's one call; "CStep()" the step's whole pass around it; "runner()"
the runner's pass; "choose" the token from the logits ("clear_tokens": greedy's int from the row tops, where taken). Noisy on a shared machine: read the lowest of the runs.

    .venv/bin/python scripts/decode_split.py --dtype float32 bfloat16 --runs 5
"""
import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.c_step as c_step  # noqa: E402
import kernels.kept_keys as kept_keys  # noqa: E402
import models.llama as llama  # noqa: E402
import runners.hooks as hooks  # noqa: E402
import runners.lean as lean  # noqa: E402
import runners.rope_table as rope_table  # noqa: E402
import utils.logits_processor as processors  # noqa: E402
from runners import RunnerConfig  # noqa: E402
from sampling import autoregressive_generate  # noqa: E402
from utils.models import load_embedded  # noqa: E402

PROMPT = "Summarize in one sentence: The quick brown fox jumps over the lazy dog."
CLOCKS: Dict[str, float] = {}


def clocked(owner, name: str, key: str, also: tuple = ()) -> None:
    """``owner.name`` (and the same name in the modules ``also`` that imported it) timed into ``CLOCKS[key]``."""
    inner: Callable = getattr(owner, name)
    CLOCKS[key] = 0.0

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            CLOCKS[key] += time.perf_counter() - start

    for place in (owner, *also):
        setattr(place, name, timed)


def wrap_all() -> None:
    clocked(c_step.CStep, "_run", "C call")
    clocked(c_step.CStep, "__call__", "CStep()")
    clocked(c_step.CStep, "bind", "bind")
    clocked(c_step.CStep, "current", "current")
    clocked(kept_keys, "kept", "kept", (c_step,))
    clocked(kept_keys, "passed", "passed", (c_step,))
    clocked(c_step, "step_for", "step_for", (lean,))
    clocked(llama.LlamaForward, "embed", "embed")
    clocked(rope_table.RopeTable, "at", "rope.at")
    clocked(hooks.HookWatch, "hooked", "hooked")
    clocked(lean.LeanRunner, "__call__", "runner()")
    clocked(processors.GreedyProcessor, "choose", "choose")
    if hasattr(processors.GreedyProcessor, "clear_tokens"):  # target AR's int from the pass's row tops, where it has them
        clocked(processors.GreedyProcessor, "clear_tokens", "clear_tokens")


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--new", type=int, default=64, help="new tokens a run")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    wrap_all()
    for name in args.dtype:
        model, tokenizer = load_embedded(getattr(torch, name))
        prompt = tokenizer(PROMPT)["input_ids"]
        for run in range(args.runs + 1):  # run 0 warms up (the step made, the kernels measured)
            for key in CLOCKS:
                CLOCKS[key] = 0.0
            wall = time.perf_counter()
            out = autoregressive_generate(prompt, model, max_gen_len=args.new, eos_tokens_id=[], use_cache=True,
                                          runner=RunnerConfig("static", False))
            wall = time.perf_counter() - wall
            n = len(out)
            outside = CLOCKS["runner()"] - CLOCKS["C call"] + CLOCKS["choose"] + CLOCKS.get("clear_tokens", 0.0)
            if run:
                print(f"{name} run {run}: {1e3 * wall / n:.2f} ms a token, outside the C call {1e6 * outside / n:.0f} us: "
                      + ", ".join(f"{k} {1e6 * v / n:.0f}" for k, v in CLOCKS.items() if k != "C call"), flush=True)


if __name__ == "__main__":
    main()
