"""Issue 72's CUDA target, prepared: each family the compiled step takes, at a published config with
random weights (nothing downloaded), our compiled lean step's target AR against transformers' compiled
static-cache ``generate`` (the target: at least 2.0x), and a drafting row (prompt lookup) on the step
against our target AR (0 disagreements expected). Prints, per model and dtype: how its passes run (the
header's words), tokens/s of each (the median of --repeats timed runs after one untimed) and their
ratio, the graphs the step built at start-up and during the timed runs (0 expected), whether the greedy
tokens of the two forwards match (random weights: near-ties may part them; said, not judged), and the
drafting row's first disagreement with target AR, if any. It claims nothing: a GPU session reads it.

The shapes (``SHAPES``, in ``scripts/family_shapes.py``, shared with the CPU table ``scripts/family_table.py``):
Qwen3-0.6B, Gemma-3-270M and Gemma-3-1B (text models, ``Gemma3ForCausalLM``), OLMo-2-0425-1B, SmolLM3-3B.

On a GPU machine (one call may not hold all five: ``--shapes`` takes a few at a time):

    python3 scripts/gpu/family_bench.py --device cuda --tokens 256 --repeats 3
    python3 scripts/gpu/family_bench.py --device cuda --shapes qwen3-0.6b,gemma3-270m

Rehearsal on CPU (``--tiny``: each shape's features at tiny sizes, the step on inductor, transformers'
``generate`` eager; it measures nothing, it proves the script runs):

    .venv/bin/python scripts/gpu/family_bench.py --tiny --device cpu --dtypes float32 --tokens 8 --repeats 1
"""
import argparse
import sys
from pathlib import Path
from typing import List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from family_shapes import SHAPES, asked_shapes, build, first_difference, prompt_ids  # noqa: E402,F401  (scripts/family_shapes.py)
from step_bench import graphs, timed  # noqa: E402

PLD_DRAFTS = 3  # the drafting row's drafts a step: the step's widths are 1 and 4


def weights_bytes(model) -> int:
    """The bytes of the model's parameters (what one decoding pass reads at least)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def ours(model, prompt: List[int], config, args) -> Tuple[float, List[int], List[int], Tuple[int, int], float]:
    """Our step: its graphs built (widths 1 and the drafting row's), target AR timed, the prompt-lookup
    row run once; returns target AR's seconds and tokens, the row's tokens, the graphs built during the
    timed runs (ours, dynamo's), and the seconds spent building."""
    from drafters import PromptLookupSpec
    from runners import prepare_step
    from sampling import autoregressive_generate, generate

    seconds = prepare_step(model, len(prompt) + args.tokens, lambda text: print(f"  {text}", flush=True),
                           widths=(1, 1 + PLD_DRAFTS), graphs=config.graphs)
    before = graphs()
    common = dict(max_gen_len=args.tokens, eos_tokens_id=[], use_cache=True, runner=config)
    run = lambda: autoregressive_generate(prompt, model, **common)  # noqa: E731
    took, tokens = timed(run, model, args.repeats)
    drafted = generate(prompt, model, PromptLookupSpec(num_pred_tokens=PLD_DRAFTS), common)[0]
    after = graphs()
    return took, tokens, drafted, (after[0] - before[0], after[1] - before[1]), seconds


def theirs(model, prompt: List[int], args) -> Tuple[float, List[int]]:
    """transformers' static-cache ``generate``: compiled by transformers itself on CUDA, eager on CPU."""
    from transformers import StaticCache

    from runners.cache_kind import cache_keyword

    ids = torch.tensor([prompt], device=args.device)
    length = -(-(len(prompt) + args.tokens) // 512) * 512  # peers.py's buckets
    extra = {} if args.device.startswith("cuda") else {"disable_compile": True}
    run = lambda: model.generate(ids, max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False,  # noqa: E731
                                 pad_token_id=0, **{cache_keyword(model): StaticCache(config=model.config, max_cache_len=length)},
                                 **extra)[0, len(prompt):].tolist()
    return timed(run, model, args.repeats)


def bench(name: str, dtype: torch.dtype, args) -> None:
    """One shape in one dtype: the lines described at the top."""
    from runners import RunnerConfig, lean_unsupported

    cuda = args.device.startswith("cuda")
    model = build(name, args.tiny, dtype, args.device)
    label = f"{name}{' (tiny)' if args.tiny else ''} · {str(dtype).removeprefix('torch.')} on {args.device}"
    refused = lean_unsupported(model)
    if refused is not None:
        print(f"{label}: the step cannot take it: {refused}", flush=True)
        return
    config = RunnerConfig(graphs=args.graphs) if cuda else RunnerConfig(forward="step", graphs=args.graphs)
    print(f"{label} · {weights_bytes(model) / 1e9:.2f} GB of weights: {config.describe(model)}", flush=True)
    prompt = prompt_ids(model.config.vocab_size, args.prompt)
    our_time, our_tokens, drafted, built, seconds = ours(model, prompt, config, args)
    hf_time, hf_tokens = theirs(model, prompt, args)
    hf_how = "compiled static-cache generate" if cuda else "static-cache generate, eager (CPU rehearsal)"
    print(f"  ours (the compiled step), target AR: {args.tokens / our_time:.1f} tokens/s; step graphs built in {seconds:.1f} s "
          f"before timing, {built[0]} during the timed runs (dynamo {built[1]})")
    print(f"  transformers' {hf_how}: {args.tokens / hf_time:.1f} tokens/s; ratio ours/theirs {hf_time / our_time:.2f}")
    same = first_difference(our_tokens, hf_tokens)
    print("  greedy tokens, ours and transformers': " + ("the same" if same is None else f"differ from token {same} on"))
    parted = first_difference(drafted, our_tokens)
    print(f"  prompt lookup ({PLD_DRAFTS} drafts) on the step against our target AR: "
          + ("0 disagreements" if parted is None else f"DISAGREES from token {parted}"), flush=True)
    del model
    if cuda:
        torch.cuda.empty_cache()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)} (default: all)")
    p.add_argument("--dtypes", default="bfloat16", help="comma-separated (default bfloat16)")
    p.add_argument("--tokens", type=int, default=256, help="new tokens a run (default 256)")
    p.add_argument("--prompt", type=int, default=64, help="prompt positions (default 64; its second half repeats the first)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs, the median reported (default 3)")
    p.add_argument("--graphs", choices=["regional", "whole"], default="regional", help="how the step makes its graphs")
    p.add_argument("--tiny", action="store_true", help="tiny sizes with each shape's features: a rehearsal, no figure")
    return p


def main(argv: Optional[List[str]] = None) -> None:
    args = parser().parse_args(argv)
    asked_shapes(args.shapes)
    torch.set_grad_enabled(False)
    for name in args.shapes.split(","):
        for dtype in args.dtypes.split(","):
            bench(name, getattr(torch, dtype), args)


if __name__ == "__main__":
    main()
