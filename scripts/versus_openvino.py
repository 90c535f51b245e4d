"""Ours against OpenVINO GenAI in one run, like for like, in float32 and in bfloat16 (issue 71's targets).

The prompts of ``../shared/tools/openvino-anchor`` (its ``ids_main.json``: 8 open and 4 grounded Spec-Bench first
turns as the project's token ids), 2 threads, eos ignored, prefill included. For each dtype:

- ours: the embedded SmolLM2-135M in that dtype, after ``choose_kernels`` (as the REPL and the benchmark run it),
  greedy target AR (``autoregressive_generate``);
- OpenVINO: ``scripts/openvino_worker.py`` in the anchor's venv on the anchor's float32 IR, with float32 inference
  for our float32, and for our bfloat16 its bf16 inference precision where the CPU has bf16 (its default there),
  float32 elsewhere; its KV cache in that precision (bf16 inference refuses a float32 one; ours is in the model's dtype too,
  so both read the same cache bytes: before 2026-12-02 ours was float32 in both dtypes);
- interleaved prompt by prompt, the order flipped every round: the time to the first token (a generation of one
  token) of the five longest prompts, and whole runs of ``--tokens`` new tokens on every prompt.

It prints tokens/s per set and the ratio ours / OpenVINO with its 95% bootstrap interval over prompts and rounds,
each long prompt's first-token time and the ratio, and how many greedy outputs are equal (another engine's
rounding may part them: said, not judged).

    ../shared/tools/quiet -- env OV_WORK=$HOME/.cache/specdec-ov-probe .venv/bin/python scripts/versus_openvino.py
    OV_WORK=$HOME/.cache/specdec-ov-probe .venv/bin/python scripts/versus_openvino.py --rounds 1 --tokens 4 --limit 1
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OPEN = (81, 91, 101, 111, 121, 131, 141, 151)  # the anchor's open questions, one per category
GROUNDED = (241, 242, 481, 482)  # its summarization and rag questions
LONG = 5  # the first-token comparison: this many longest prompts


def cpu_has_bf16() -> bool:
    """Whether the CPU says it has bfloat16 arithmetic (avx512_bf16 or AMX's), where OpenVINO defaults to it."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def tokens_per_second(cells) -> float:
    """Summed tokens over summed seconds of ``[tokens, seconds]`` cells."""
    cells = list(cells)
    return sum(t for t, _ in cells) / sum(s for _, s in cells)


def force_bf16_path(name: str | None) -> None:
    """Our bfloat16 path forced by its ``--bf16-path`` name (None: the measured one); the header says "forced"."""
    from kernels import bf16

    if name:
        bf16.FORCED = {"amx": bf16.AMX, "dot": bf16.DOT, "avx512": bf16.AVX512, "avx2": bf16.AVX2, "scalar": bf16.SCALAR}[name]


def parse(argv: List[str] | None) -> argparse.Namespace:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=os.environ.get("OV_WORK", str(Path.home() / ".cache/specdec-ov-probe")))
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--limit", type=int, default=0, help="at most this many prompts a set (0: all)")
    parser.add_argument("--bf16-path", choices=["amx", "dot", "avx512", "avx2", "scalar"], default=None,
                        help="our bfloat16 path forced (default: the one the C step measures and takes here)")
    return parser.parse_args(argv)


def main(argv: List[str] | None = None) -> None:
    args = parse(argv)
    import json

    from app.bench.intervals import ratio_cell, ratio_interval
    from kernels import c_step
    from measure import choose_kernels
    from peers_openvino import Worker
    from sampling import autoregressive_generate
    from utils.models import load_embedded

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    force_bf16_path(args.bf16_path)
    work = Path(args.work)
    ids = {int(k): v for k, v in json.loads((work / "ids_main.json").read_text()).items()}
    sets = {"open": OPEN, "grounded": GROUNDED}
    if args.limit:
        sets = {name: qids[: args.limit] for name, qids in sets.items()}
    asked = [q for qids in sets.values() for q in qids]
    long = sorted(asked, key=lambda q: -len(ids[q]))[:LONG]
    print(f"{cpu_name()} · {args.threads} threads · {args.tokens} new tokens, eos ignored, prefill included · "
          f"{args.rounds} rounds, order flipped each round")
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        precision = "bf16" if dtype == torch.bfloat16 and cpu_has_bf16() else "f32"
        model, _ = load_embedded(dtype)
        _, line = choose_kernels(model)
        worker = Worker(work / "ir", args.threads, python=work / "venv" / "bin" / "python", precision=precision)

        def ours(prompt: List[int], tokens: int) -> Tuple[float, list]:
            start = time.perf_counter()
            out = autoregressive_generate(prompt, model, tokens, eos_tokens_id=-1, use_cache=True)
            return time.perf_counter() - start, out

        def theirs(prompt: List[int], tokens: int) -> Tuple[float, list]:
            answer = worker.ask({"op": "generate", "prompt": prompt, "max_new_tokens": tokens})
            return answer["seconds"], answer["tokens"]

        engines = {"ours": ours, "openvino": theirs}
        try:
            for run in engines.values():  # warm: kernels loaded, the pipeline built
                run(ids[asked[0]][:16], 2)
            runs: Dict[str, Dict[tuple, List[float]]] = {name: {} for name in engines}
            firsts: Dict[str, Dict[int, List[float]]] = {name: {q: [] for q in long} for name in engines}
            outputs: Dict[tuple, list] = {}
            for round_ in range(args.rounds):
                for i, q in enumerate(asked):
                    order = list(engines.items()) if (round_ + i) % 2 == 0 else list(engines.items())[::-1]
                    for name, run in order:
                        if q in long:
                            firsts[name][q].append(run(ids[q], 1)[0])
                        seconds, out = run(ids[q], args.tokens)
                        runs[name][(q, round_)] = [len(out), seconds]
                        outputs[(name, q)] = out
        finally:
            worker.close()
        print(f"\n## {dtype_name} · ours: {c_step.short_label(model)}; {line} · OpenVINO: {precision} inference and KV cache")
        for name, qids in sets.items():
            mine = {k: v for k, v in runs["ours"].items() if k[0] in qids}
            other = {k: v for k, v in runs["openvino"].items() if k[0] in qids}
            rate = {"ours": tokens_per_second(mine.values()), "openvino": tokens_per_second(other.values())}
            per_round = [tokens_per_second(v for k, v in mine.items() if k[1] == r) /
                         tokens_per_second(v for k, v in other.items() if k[1] == r) for r in range(args.rounds)]
            print(f"{name} ({len(qids)} prompts): ours {rate['ours']:.1f} tok/s, OpenVINO {rate['openvino']:.1f} tok/s; "
                  f"ours / OpenVINO {ratio_cell(statistics.median(per_round), ratio_interval(mine, other))}")
        print("| prompt | tokens | ours first token (ms) | OpenVINO (ms) | ours / OpenVINO |")
        print("|---|---:|---:|---:|---:|")
        for q in sorted(long, key=lambda q: len(ids[q])):
            a, b = (statistics.median(firsts[n][q]) * 1e3 for n in engines)
            print(f"| {q} | {len(ids[q])} | {a:,.0f} | {b:,.0f} | {a / b:.2f}x |")
        same = sum(outputs[("ours", q)] == outputs[("openvino", q)] for q in asked)
        print(f"greedy outputs equal on {same} of {len(asked)} prompts (another engine's rounding may part them)")
        del model


if __name__ == "__main__":
    main()
