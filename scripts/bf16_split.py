"""Where a token of ``scripts/bf16_step.py``'s target AR goes, float32 against bfloat16 in one run: the embedded
SmolLM2-135M, greedy on the C step, the same prompts (bench_prompts.jsonl, chat template), interleaved round by
round, each dtype's generation split by clocks around the runner's passes into

- the prompt pass (the runner's first call: every prompt position, logits of the last), its share of a token
  (its seconds over the tokens the generation emitted) and its milliseconds per prompt position;
- the one-position passes (every later runner call), and of those the C call made ready
  (``kernels.step_one.OnePass.one``: the C step and its few host lines);
- the host: the generation's wall time less every runner call (the loop in ``sampling.base_decoding``: the
  token from the logits' kept tops, the ids written, the stop test, the runner's set-up).

Milliseconds a token, medians over prompts x rounds of each part's share (each part's own median: the parts need
not add up to the total's). Noisy on a shared machine: a rough A/B, never a result.

    .venv/bin/python scripts/bf16_split.py                              # 6 prompts x 5 rounds, 64 tokens
    .venv/bin/python scripts/bf16_split.py --rounds 1 --prompts 2 --tokens 8   # a smoke run
    .venv/bin/python scripts/bf16_split.py --path dot avx512      # two bfloat16 copies, each on a path forced
"""
import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAMED = {"amx": "AMX", "dot": "DOT", "avx512": "AVX512", "avx2": "AVX2", "scalar": "SCALAR"}  # --path: kernels.bf16's names
PARTS = ("total", "prompt pass", "one-position passes", "C call made ready", "host")
CALLS: List[tuple] = []  # (kind, seconds) of the generation under way: "runner" with the pass's width, or "one"


def clocked() -> None:
    """``LeanRunner.__call__`` and ``OnePass.one`` timed into ``CALLS`` (callees included)."""
    import kernels.step_one as step_one
    import runners.lean as lean

    def wrap(owner, name: str, kind) -> None:
        inner = getattr(owner, name)

        def timed(self, *args, **kwargs):
            what, start = kind(self, args), time.perf_counter()  # the width before the call moves the cache
            try:
                return inner(self, *args, **kwargs)
            finally:
                CALLS.append((what, time.perf_counter() - start))

        setattr(owner, name, timed)

    wrap(lean.LeanRunner, "__call__", lambda runner, args: ("runner", args[0].shape[1] - runner.cached))
    wrap(step_one.OnePass, "one", lambda one, args: ("one", 1))


def split(wall: float, tokens: int) -> Dict[str, float]:
    """One generation's parts in milliseconds a token, from ``CALLS`` and its ``wall`` seconds."""
    runs = [(width, s) for (kind, width), s in CALLS if kind == "runner"]
    prompt = runs[0][1] if runs and runs[0][0] > 1 else 0.0  # a prompt pass runs every prompt position at once
    passes = sum(s for _, s in runs) - prompt
    made_ready = sum(s for (kind, _), s in CALLS if kind == "one")
    host = wall - prompt - passes
    return {k: 1e3 * v / tokens for k, v in zip(PARTS, (wall, prompt, passes, made_ready, host))}


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds over the prompts")
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens a generation")
    parser.add_argument("--prompts", type=int, default=6, help="prompts of bench_prompts.jsonl")
    parser.add_argument("--threads", type=int, default=None, help="torch's threads (default: its own count)")
    parser.add_argument("--path", nargs="*", choices=sorted(NAMED), default=[],
                        help="bfloat16 paths forced, a copy of the model each (default: the one measured here)")
    args = parser.parse_args(argv)
    import kernels.bf16 as bf16

    if args.threads:
        torch.set_num_threads(args.threads)
    from kernels import c_step
    from sampling import autoregressive_generate
    from utils.models import end_tokens, load_embedded

    torch.set_grad_enabled(False)
    clocked()
    model32, tokenizer = load_embedded()
    forced = {f"bf16 {p}": getattr(bf16, NAMED[p]) for p in args.path} or {"bfloat16": None}
    models = {"float32": model32, **{name: copy.deepcopy(model32).to(torch.bfloat16) for name in forced}}
    rows = [json.loads(line) for line in open(ROOT / "bench_prompts.jsonl") if line.strip()][: args.prompts]
    prompts = [tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": r["turns"][0]}], add_generation_prompt=True,
                                                      tokenize=False), add_special_tokens=False).input_ids for r in rows]
    common = dict(max_gen_len=args.tokens, eos_tokens_id=end_tokens(model32, tokenizer), use_cache=True)
    for name, model in models.items():  # warm: each model's step built on its path (forced, or measured), kernels measured
        bf16.FORCED = forced.get(name)
        autoregressive_generate(prompts[0][:8], model, **dict(common, max_gen_len=2))
        print(f"{name}: {c_step.short_label(model)}")
    bf16.FORCED = None  # each step keeps the path it was built on
    cells: Dict[str, List[Dict[str, float]]] = {name: [] for name in models}
    per_position: Dict[str, List[float]] = {name: [] for name in models}
    for round_ in range(args.rounds):
        for i, prompt in enumerate(prompts):
            turn = (round_ * len(prompts) + i) % len(models)  # each model first in turn
            for name, model in list(models.items())[turn:] + list(models.items())[:turn]:
                CALLS.clear()
                start = time.perf_counter()
                out = autoregressive_generate(prompt, model, **common)
                cells[name].append(split(time.perf_counter() - start, len(out)))
                per_position[name].append(1e3 * CALLS[0][1] / len(prompt) if CALLS and CALLS[0][0][0] == "runner" else float("nan"))
    print(f"embedded SmolLM2-135M · {torch.get_num_threads()} threads · {len(prompts)} prompts "
          f"({min(map(len, prompts))}-{max(map(len, prompts))} positions) x {args.rounds} rounds, {args.tokens} tokens · "
          "ms a token, medians (noisy)")
    print(f"{'part':<22}" + "".join(f"{name:>13}" for name in models))
    for part in PARTS:
        value = {name: statistics.median(c[part] for c in cells[name]) for name in models}
        print(f"{part:<22}" + "".join(f"{value[n]:>13.2f}" for n in models))
    total = {name: statistics.median(c["total"] for c in cells[name]) for name in models}
    print("float32 / bfloat16 token (medians): " + ", ".join(f"{n} {total['float32'] / total[n]:.2f}x" for n in forced))
    print("prompt pass, ms a prompt position: " + ", ".join(f"{n} {statistics.median(v):.3f}" for n, v in per_position.items()))


if __name__ == "__main__":
    main()
