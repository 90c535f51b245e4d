"""Interleaved A/B of the target's plain decoding: float32 (prepacked) vs int8 vs int4 weights, static vs
dynamic KV cache, and one pass over 1..12 positions. Ratios within one run (the machine is shared).

    .venv/bin/python scripts/ab_decode.py --repeats 3 --new-tokens 64
"""
import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--quantize", default="none,int8,int4")
    p.add_argument("--caches", default="static,dynamic")
    args = p.parse_args()

    import torch

    from sampling import autoregressive_generate
    from runners import KVCacheModel, RunnerConfig
    from utils.models import load_embedded
    from utils.quantization import quantize_cpu

    torch.set_grad_enabled(False)
    base, tokenizer = load_embedded()
    models = {}
    for q in args.quantize.split(","):
        models[q] = base if q == "none" else copy.deepcopy(base)
        if q != "none":
            quantize_cpu(models[q], q)
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    prompt = tokenizer(text).input_ids[: args.prompt_tokens]
    configs = [(q, c) for q in models for c in args.caches.split(",")]
    tps = {c: [] for c in configs}
    rows = {q: {r: [] for r in (1, 2, 4, 8, 12)} for q in models}
    for _ in range(args.repeats + 1):  # the first round warms up
        for q, c in configs:
            start = time.perf_counter()
            out = autoregressive_generate(prompt, models[q], max_gen_len=args.new_tokens, eos_tokens_id=[], use_cache=True,
                                          runner=RunnerConfig(cache=c))
            tps[(q, c)].append(len(out) / (time.perf_counter() - start))
        for q, model in models.items():
            runner = KVCacheModel(model, True, cache="static")
            ids = torch.tensor([prompt[:140]])
            runner(ids[:, :128], 1)
            for r in rows[q]:
                times = []
                for _ in range(3):
                    start = time.perf_counter()
                    runner(ids[:, : 128 + r], r)
                    times.append(time.perf_counter() - start)
                    runner.rollback(128)
                rows[q][r].append(min(times) * 1e3)
    reference = configs[0]
    print(f"target AR, {args.new_tokens} new tokens after {len(prompt)} prompt tokens, median of {args.repeats} interleaved repeats")
    print("| weights | cache | tokens/s | vs " + " ".join(reference) + " |")
    print("| --- | --- | ---: | ---: |")
    for config in configs:
        ratio = statistics.median(a / b for a, b in zip(tps[config][1:], tps[reference][1:]))
        print(f"| {config[0]} | {config[1]} | {statistics.median(tps[config][1:]):.1f} | {ratio:.2f}x |")
    print("\nms per pass over r positions (static cache, 128 cached), best of 3, median over repeats")
    print("| weights | " + " | ".join(f"r={r}" for r in rows[reference[0]]) + " |")
    print("| --- |" + " ---: |" * len(rows[reference[0]]))
    for q in rows:
        print(f"| {q} | " + " | ".join(f"{statistics.median(v[1:]):.1f}" for v in rows[q].values()) + " |")


if __name__ == "__main__":
    main()
