"""Host time a token of target AR, ours against transformers', on a tiny random Llama whose compute is
negligible (hidden size 32, 2 layers unless --layers, one thread): what each loop costs around the model. Eager by
default; ``--compile``: our compiled passes against transformers' compiled static-cache ``generate``
(CPU inductor: a minute or two to build, outside the timing). Run it alone:

    ../shared/tools/quiet -- .venv/bin/python scripts/host_overhead.py [--compile] [--device cuda]

``--explain`` times nothing: it prints what dynamo makes of our compiled passes over 1 and 4
positions on the same model (``runners.explain``: graphs, graph breaks and their reasons, ops, guards),
on any device, in seconds; ``--layers 2`` against ``--layers 30`` shows what grows with the layers.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM, StaticCache  # noqa: E402

from runners import RunnerConfig, prepare, synchronize  # noqa: E402
from runners.cache_kind import cache_keyword  # noqa: E402
from sampling import autoregressive_generate  # noqa: E402
from utils.models import load_embedded  # noqa: E402

PROMPT = list(range(1, 17))
EXPLAINED = (1, 4)  # --explain: the decoding pass and a verification pass


def per_token(run, model, new: int, repeats: int = 5) -> float:
    """Milliseconds a token of a run of ``new`` tokens: the median of ``repeats`` timed runs after one untimed."""
    run()
    times = []
    for _ in range(repeats):
        synchronize(model)
        start = time.perf_counter()
        run()
        synchronize(model)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times) / new


def tiny_model(layers: int) -> LlamaForCausalLM:
    """A random Llama whose compute is negligible: hidden size 32, ``layers`` decoder layers."""
    return LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=2,
                                        num_key_value_heads=2, max_position_embeddings=1024)).eval()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--compile", action="store_true", help="the compiled paths (ours: CUDA graphs or inductor; transformers': its own)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (default 2): a cost that grows with them is per layer")
    p.add_argument("--new-tokens", type=int, default=256, help="tokens a run (default 256)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs, the median reported (default 5)")
    p.add_argument("--embedded", action="store_true", help="the embedded SmolLM2-135M (30 layers) instead of the tiny model (--layers is then ignored)")
    p.add_argument("--explain", action="store_true", help="time nothing: torch._dynamo.explain of our compiled passes over 1 and 4 positions")
    args = p.parse_args()
    new = args.new_tokens
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = tiny_model(args.layers) if not args.embedded else load_embedded()[0]
    model = model.to(args.device)
    if args.explain:
        from runners.explain import explain_pass

        for rows in EXPLAINED:
            print("\n".join(explain_pass(model, rows).lines()), flush=True)
        return
    ids = torch.tensor([PROMPT], device=args.device)
    ours = lambda cache: lambda: autoregressive_generate(PROMPT, model, max_gen_len=new, eos_tokens_id=[], use_cache=True,  # noqa: E731
                                                         runner=RunnerConfig(cache, args.compile))
    hf_extra = lambda: {}  # noqa: E731
    if args.compile:
        prepare(model, len(PROMPT) + new)
        config = CompileConfig(fullgraph=False, dynamic=False, mode="default")
        config._compile_all_devices = True
        own = {} if args.device.startswith("cuda") else {"compile_config": config}  # on CUDA transformers compiles by itself, as the peer
        hf_extra = lambda: {cache_keyword(model): StaticCache(config=model.config, max_cache_len=512), **own}  # noqa: E731
    runs = {"ours, static cache": ours("static")} if args.compile else {"ours, static cache": ours("static"), "ours, dynamic cache": ours("dynamic")}
    runs["transformers generate" + (", static cache, compiled" if args.compile else "")] = lambda: model.generate(
        ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0, **hf_extra())
    for name, run in runs.items():
        print(f"{name}: {per_token(run, model, new, args.repeats):.3f} ms a token ({new} tokens, median of {args.repeats})", flush=True)


if __name__ == "__main__":
    main()
