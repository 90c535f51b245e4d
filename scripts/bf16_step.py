"""bfloat16 against float32 weights on the C step, on the embedded SmolLM2-135M, in one run:

- each dtype's read bound: a plain float32 sum over as many bytes as its linear weights (every decoder
  linear and the output layer) take in that dtype;
- target AR (greedy, the C step) in each dtype, interleaved round by round on the same prompts, its
  tokens/s, and the ratio bfloat16 / float32 with its 95% bootstrap interval over prompts and rounds;
- each dtype's one-position pass against its own read bound (the C step's pass / the plain sum);
- whether greedy prompt lookup in bfloat16 emits bfloat16 target AR's tokens (exact by construction).

    ../shared/tools/quiet -- .venv/bin/python scripts/bf16_step.py       # the figures (a timing: run alone)
    .venv/bin/python scripts/bf16_step.py --rounds 1 --tokens 4 --prompts 2   # a smoke run
    ../shared/tools/quiet -- .venv/bin/python scripts/bf16_step.py --path avx512   # another path forced
"""
import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def read_seconds(size: int, rounds: int) -> float:
    """Median seconds of a plain float32 sum over ``size`` bytes (the read bound of a pass over that many
    bytes: torch's own bfloat16 sum widens element by element, far below the memory's speed)."""
    plain = torch.ones(size // 4)
    plain.sum()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        plain.sum()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def weight_bytes(model) -> int:
    """The bytes a pass of ``model`` reads of its linear weights (every decoder linear and the output layer)."""
    found = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]  # before any runner: no wrapper yet
    return sum(m.in_features * m.out_features for m in found) * next(model.parameters()).dtype.itemsize


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds over the prompts")
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens a generation")
    parser.add_argument("--prompts", type=int, default=6, help="prompts of bench_prompts.jsonl")
    parser.add_argument("--path", choices=["amx", "dot", "avx512", "avx2", "scalar"], default=None,
                        help="the bfloat16 path forced (default: the one the C step takes here)")
    args = parser.parse_args(argv)
    import json

    from app.bench.intervals import ratio_cell, ratio_interval
    from drafters import PromptLookupSpec
    from kernels import c_step, skinny
    from sampling import autoregressive_generate, generate
    from utils.models import end_tokens, load_embedded

    if not skinny.available()[0]:
        sys.exit(f"the skinny kernel is not built here: {skinny.available()[1]}")
    import kernels.bf16 as bf16

    bf16.FORCED = {"amx": bf16.AMX, "dot": bf16.DOT, "avx512": bf16.AVX512, "avx2": bf16.AVX2, "scalar": bf16.SCALAR}.get(args.path)
    torch.set_grad_enabled(False)
    model32, tokenizer = load_embedded()
    size32 = weight_bytes(model32)
    model16 = copy.deepcopy(model32).to(torch.bfloat16)
    models = {"float32": model32, "bfloat16": model16}
    rows = [json.loads(line) for line in open(ROOT / "bench_prompts.jsonl") if line.strip()][: args.prompts]
    prompts = [tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": r["turns"][0]}], add_generation_prompt=True,
                                                      tokenize=False), add_special_tokens=False).input_ids for r in rows]
    common = dict(max_gen_len=args.tokens, eos_tokens_id=end_tokens(model32, tokenizer), use_cache=True)
    cells: Dict[str, Dict[tuple, List[float]]] = {name: {} for name in models}
    outputs: Dict[tuple, list] = {}
    for name, model in models.items():  # warm: each dtype's step built, its kernels loaded
        autoregressive_generate(prompts[0][:8], model, **dict(common, max_gen_len=2))
    for round_ in range(args.rounds):
        for i, prompt in enumerate(prompts):
            for name, model in (models.items() if (round_ + i) % 2 == 0 else reversed(list(models.items()))):
                start = time.perf_counter()
                out = autoregressive_generate(prompt, model, **common)
                seconds = time.perf_counter() - start
                cells[name][(i, round_)] = [len(out), seconds]
                outputs[(name, i)] = out
    reads = {"float32": read_seconds(size32, 15), "bfloat16": read_seconds(size32 // 2, 15)}
    lookup_exact = all(generate(p, model16, PromptLookupSpec(), common)[0] == outputs[("bfloat16", i)] for i, p in enumerate(prompts))
    rate = {name: sum(t for t, _ in c.values()) / sum(s for _, s in c.values()) for name, c in cells.items()}
    per_round = [sum(cells["float32"][(i, r)][1] for i in range(len(prompts))) /
                 sum(cells["bfloat16"][(i, r)][1] for i in range(len(prompts))) for r in range(args.rounds)]
    interval = ratio_interval(cells["bfloat16"], cells["float32"])
    print(f"embedded SmolLM2-135M · {torch.get_num_threads()} threads · kernel {skinny.identity()} · "
          f"bfloat16 path: {c_step.short_label(model16)}")
    for name in models:
        size = size32 if name == "float32" else size32 // 2
        print(f"{name}: target AR {rate[name]:.1f} tokens/s ({len(prompts)} prompts x {args.rounds} rounds, {args.tokens} tokens, "
              f"prefill included); read bound {size / 1e6:.0f} MB at {size / reads[name] / 1e9:.1f} GB/s = {reads[name] * 1e3:.2f} ms; "
              f"a token {1e3 / rate[name]:.2f} ms = {1 / rate[name] / reads[name]:.2f}x the read")
    print(f"bfloat16 / float32 target AR: {ratio_cell(statistics.median(per_round), interval)}")
    same = sum(outputs[("bfloat16", i)] == outputs[("float32", i)] for i in range(len(prompts)))
    print(f"greedy bfloat16 prompt lookup = bfloat16 target AR on every prompt: {lookup_exact}; "
          f"bfloat16 target AR = float32's on {same} of {len(prompts)} prompts (another dtype's rounding)")


if __name__ == "__main__":
    main()
