"""Target AR on the embedded SmolLM2-135M: our compiled lean step (``runners.step.StepRunner``, one CUDA
graph per pass width and key bucket, CUDA's default) against transformers' compiled static-cache ``generate``, in float32 and bfloat16.
Prints tokens/s of each (the median of --repeats timed runs after one untimed), the graphs our step built
at start-up and during the timed runs (0 expected), and whether the greedy tokens match.

On a GPU machine (what a GPU session runs; docs/gpu.md, "The compiled lean step"):

    python3 scripts/gpu/step_bench.py --device cuda --tokens 256 --repeats 5

Rehearsal on CPU (inductor's default mode, transformers' generate eager, tiny sizes; it measures nothing):

    .venv/bin/python scripts/gpu/step_bench.py --device cpu --dtypes float32 --tokens 8 --repeats 1
"""
import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

from runners import RunnerConfig, compile_events, prepare_step, synchronize  # noqa: E402
from runners.cache_kind import cache_keyword  # noqa: E402
from sampling import autoregressive_generate  # noqa: E402
from utils.models import load_embedded  # noqa: E402

PROMPT = "Write a short Python function that checks whether a number is prime, and explain it."


def timed(run: Callable[[], List[int]], model, repeats: int) -> Tuple[float, List[int]]:
    """The median seconds of ``repeats`` runs after one untimed (compiling, recording), and the tokens."""
    tokens = run()
    times = []
    for _ in range(repeats):
        synchronize(model)
        clock = time.perf_counter()
        tokens = run()
        synchronize(model)
        times.append(time.perf_counter() - clock)
    return statistics.median(times), tokens


def graphs() -> Tuple[int, int]:
    """Graphs built so far: our ``compile_events`` and dynamo's own count."""
    return len(compile_events), counters["stats"]["unique_graphs"]


def bench(dtype: torch.dtype, args) -> None:
    model, tokenizer = load_embedded(dtype)
    model = model.to(args.device)
    cuda = args.device.startswith("cuda")
    text = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    new = args.tokens
    # on CUDA the step is this family's default runner; on CPU it is asked for by name
    config = RunnerConfig(graphs=args.graphs) if cuda else RunnerConfig(forward="step", graphs=args.graphs)
    assert config.step_for(model), config.describe(model)
    start = graphs()
    widths = tuple(int(w) for w in args.widths.split(","))
    seconds = prepare_step(model, len(prompt) + new, lambda text: print(f"  {text}", flush=True), widths=widths,
                           graphs=config.graphs)
    prepared = graphs()
    ours = lambda: autoregressive_generate(prompt, model, max_gen_len=new, eos_tokens_id=[], use_cache=True, runner=config)  # noqa: E731
    our_time, our_tokens = timed(ours, model, args.repeats)
    after = graphs()
    from transformers import StaticCache

    ids = torch.tensor([prompt], device=args.device)
    length = -(-(len(prompt) + new) // 512) * 512  # peers.py's buckets
    extra = {} if cuda else {"disable_compile": True}  # CUDA: transformers compiles its static-cache step itself
    hf = lambda: model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,  # noqa: E731
                                **{cache_keyword(model): StaticCache(config=model.config, max_cache_len=length)},
                                **extra)[0, len(prompt):].tolist()
    hf_time, hf_tokens = timed(hf, model, args.repeats)
    same = next((i for i, (a, b) in enumerate(zip(our_tokens, hf_tokens)) if a != b), None)
    print(f"{str(dtype).removeprefix('torch.')} on {args.device}: {config.describe(model)}")
    print(f"  ours (StepRunner), target AR: {new / our_time:.1f} tokens/s; graphs built at start-up "
          f"{prepared[0] - start[0]} (dynamo {prepared[1] - start[1]}) in {seconds:.1f} s, during the timed runs "
          f"{after[0] - prepared[0]} (dynamo {after[1] - prepared[1]})")
    hf_how = "compiled static-cache generate" if cuda else "static-cache generate, eager (CPU rehearsal)"
    print(f"  transformers' {hf_how}: {new / hf_time:.1f} tokens/s; ratio ours/theirs {hf_time / our_time:.2f}")
    print("  greedy tokens: " + ("the same" if same is None else f"differ from token {same} on"), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated (default float32,bfloat16)")
    p.add_argument("--tokens", type=int, default=256, help="new tokens a run (default 256)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs, the median reported (default 5)")
    p.add_argument("--widths", default="1", help="pass widths to build (default 1: target AR decodes one position a pass)")
    p.add_argument("--graphs", choices=["regional", "whole"], default="regional",
                   help="how the step makes its graphs (RunnerConfig.graphs; default regional)")
    args = p.parse_args()
    torch.set_grad_enabled(False)
    for name in args.dtypes.split(","):
        bench(getattr(torch, name), args)


if __name__ == "__main__":
    main()
