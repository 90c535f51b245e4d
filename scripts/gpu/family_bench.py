"""Issue 72's CUDA target, prepared: each family the compiled step takes, at a published config with
random weights (nothing downloaded), our compiled lean step's target AR against transformers' compiled
static-cache ``generate`` (the target: at least 2.0x), and a drafting row (prompt lookup) on the step
against our target AR (0 disagreements expected). Prints, per model and dtype: how its passes run (the
header's words), tokens/s of each (the median of --repeats timed runs after one untimed) and their
ratio, the graphs the step built at start-up and during the timed runs (0 expected), whether the greedy
tokens of the two forwards match (random weights: near-ties may part them; said, not judged), and the
drafting row's first disagreement with target AR, if any. It claims nothing: a GPU session reads it.

The shapes (``SHAPES``: the published configs' sizes, written out here): Qwen3-0.6B, Gemma-3-270M and
Gemma-3-1B (text models, ``Gemma3ForCausalLM``), OLMo-2-0425-1B, SmolLM3-3B.

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
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from step_bench import graphs, timed  # noqa: E402

# name -> (transformers class, its config class, the published config's sizes and features)
SHAPES: Dict[str, Tuple[str, str, dict]] = {
    "qwen3-0.6b": ("Qwen3ForCausalLM", "Qwen3Config", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "gemma3-270m": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, max_position_embeddings=32768, rms_norm_eps=1e-6, query_pre_attn_scalar=256,
        sliding_window=512, tie_word_embeddings=True)),
    "gemma3-1b": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, max_position_embeddings=32768, rms_norm_eps=1e-6, query_pre_attn_scalar=256,
        sliding_window=512, tie_word_embeddings=True)),
    "olmo2-1b": ("Olmo2ForCausalLM", "Olmo2Config", dict(
        vocab_size=100352, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=16, max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    "smollm3-3b": ("SmolLM3ForCausalLM", "SmolLM3Config", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=4, max_position_embeddings=65536, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 5000000.0})),
}
# --tiny: every shape at these sizes, its features kept (Gemma's sliding and full layers, SmolLM3's layer
# without RoPE, a window the rehearsal's sequences pass)
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, num_hidden_layers=2)
TINY_LAYERS = {"Gemma3TextConfig": dict(layer_types=["sliding_attention", "full_attention"], sliding_window=16, head_dim=16),
               "SmolLM3Config": dict(num_hidden_layers=4), "Qwen3Config": dict(head_dim=16)}
PLD_DRAFTS = 3  # the drafting row's drafts a step: the step's widths are 1 and 4


def build(name: str, tiny: bool, dtype: torch.dtype, device: str, seed: int = 0):
    """The shape's model, transformers' own class with random weights (its own initialization, seeded),
    on ``device`` in ``dtype``, SDPA attention (what the lean forward admits)."""
    import transformers

    cls, config_cls, sizes = SHAPES[name]
    settings = {**sizes, **TINY, **TINY_LAYERS.get(config_cls, {})} if tiny else dict(sizes)
    config = getattr(transformers, config_cls)(**settings, attn_implementation="sdpa", pad_token_id=0, bos_token_id=1,
                                               eos_token_id=2)
    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(transformers, cls)(config)
    return model.to(dtype).eval()


def prompt_ids(vocab: int, length: int, seed: int = 1) -> List[int]:
    """A prompt of random ids whose second half repeats its first (so that prompt lookup drafts)."""
    half = torch.randint(3, vocab, (length // 2,), generator=torch.Generator().manual_seed(seed)).tolist()
    return half + half


def first_difference(a: List[int], b: List[int]) -> Optional[int]:
    """The first index where two token lists differ (a length difference counts), or None."""
    found = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return found if found is not None or len(a) == len(b) else min(len(a), len(b))


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
    unknown = [s for s in args.shapes.split(",") if s not in SHAPES]
    if unknown:
        raise SystemExit(f"error: unknown shape(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    torch.set_grad_enabled(False)
    for name in args.shapes.split(","):
        for dtype in args.dtypes.split(","):
            bench(name, getattr(torch, dtype), args)


if __name__ == "__main__":
    main()
