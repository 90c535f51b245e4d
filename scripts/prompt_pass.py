"""The prompt pass and a long context's one-position pass on the embedded SmolLM2-135M (float32, or
bfloat16 with ``--dtype bfloat16``: its path's many-row variants, ``kernels/skinny_bf16_rows.c``), beside
the cores' float32 FMA peak (``measure.peak``: clock x FMA units x lanes x 2, each part's source named):

- a prompt pass (a fresh cache, logits of the last position) over each of ``--lengths`` positions on the
  C step under each prompt plan asked (``--tiles``: the many-row GEMM's variants, ``kernels/skinny_tiles.c``;
  ``--chunks``: positions per C call) and on the lean torch forward over the model's own linears (MKL),
  interleaved, medians, with the pass's GFLOP/s (2 * the linear layers' parameters * positions / seconds:
  the output layer counts once, as only the last position's logits are computed; attention not counted)
  and its share of the peak;
- each variant's GFLOP/s on the linears alone (one decoder layer's q/k/v, o, gate/up and down over 256
  positions, a layer per sample in turn: what the start-up measurement times, ``measure.prompt``);
- a one-position pass after 700 cached positions on the C step (attention over a long context).

    .venv/bin/python scripts/prompt_pass.py                                   # the default plan (run alone)
    .venv/bin/python scripts/prompt_pass.py --tiles all --chunks 128 256 512 --lengths 210 660 671 767 769
    .venv/bin/python scripts/prompt_pass.py --rounds 1 --lengths 70 --context 80 --tiles all   # a smoke run
    .venv/bin/python scripts/prompt_pass.py --dtype bfloat16 --tiles all [--path avx512]  # bfloat16 (run alone)
"""
import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse(argv: List[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[210, 769], help="prompt passes' positions")
    parser.add_argument("--context", type=int, default=700, help="cached positions before the one-position pass")
    parser.add_argument("--rounds", type=int, default=5, help="timed repeats of each measurement (median)")
    parser.add_argument("--threads", type=int, default=None, help="torch's threads (default: its own count)")
    parser.add_argument("--tiles", nargs="+", default=["0"], help="the many-row variants to run the prompt on: indices, or all")
    parser.add_argument("--chunks", type=int, nargs="+", default=[256], help="chunk lengths (positions per C call)")
    parser.add_argument("--no-torch", action="store_true", help="leave out the torch forward on MKL")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the weights' dtype")
    parser.add_argument("--path", choices=["amx", "dot", "avx512", "avx2", "scalar"], default=None,
                        help="bfloat16: the path forced (default: the one the C step takes here)")
    return parser.parse_args(argv)


def prompt_passes(model, ids, plans: Dict[str, object], lengths: List[int], rounds: int,
                  variants: Dict[str, int] | None = None) -> Dict[Tuple[str, int], List[float]]:
    """Seconds of each plan's prompt pass over each length, ``rounds`` interleaved rounds after a warm-up.
    A plan: a ``PromptPlan`` (the C step), or False (the model's own linears, the torch forward);
    ``variants``: a bfloat16 plan's many-row variant of the path (``kernels.bf16.FORCED_TILE``, set per plan)."""
    import kernels.bf16 as bf16
    from kernels.prompt_gemm import set_plan
    from runners import LeanRunner, kernels

    times: Dict[Tuple[str, int], List[float]] = {(name, n): [] for name in plans for n in lengths}
    runners = {name: LeanRunner(model) for name in plans}
    for round_ in range(rounds + 1):  # round 0 warms up, outside the figures
        for name, plan in plans.items():
            if plan is not False:
                set_plan(model, plan)
            if variants and name in variants:
                bf16.FORCED_TILE = variants[name]
            with kernels(model, False if plan is False else None):
                for n in lengths:
                    runners[name].rollback(0)
                    start = time.perf_counter()
                    runners[name](ids[:, :n], 1)
                    if round_:
                        times[name, n].append(time.perf_counter() - start)
    for name, plan in plans.items():
        assert (runners[name].step_passes > 0) == (plan is not False), name
    return times


def linears_alone(model, tiles, rounds: int) -> Dict[int, float]:
    """Each variant's GFLOP/s on one layer's linears over 256 positions (``measure.prompt``'s samples), medians."""
    from kernels import skinny
    from kernels.c_step import CStep
    from measure.prompt import ROWS, layer_seconds

    run, flops = layer_seconds(CStep(model), skinny.library(), torch.get_num_threads())
    timed: Dict[int, List[float]] = {t.index: [] for t in tiles}
    for round_ in range(rounds + 1):
        for tile in tiles:
            seconds = run(tile.index, ROWS)
            if round_:
                timed[tile.index].append(seconds)
    return {index: flops * ROWS / statistics.median(times) / 1e9 for index, times in timed.items()}


def one_position(model, ids, context: int, rounds: int) -> float:
    """Median seconds of a one-position C step pass after ``context`` cached positions."""
    from runners import LeanRunner

    step = LeanRunner(model)
    step(ids[:, :context], 1)
    one = []
    for round_ in range(rounds + 1):
        start = time.perf_counter()
        step(ids[:, : context + 1], 1)
        if round_:
            one.append(time.perf_counter() - start)
        step.rollback(context)
    return statistics.median(one)


def main(argv: List[str] | None = None) -> None:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from kernels import skinny
    from kernels.one_copy import held
    from kernels.prompt_gemm import PromptPlan, tiles
    from measure.peak import machine_peak
    from utils.models import load_embedded

    import kernels.bf16 as bf16

    model, tokenizer = load_embedded()
    variants: Dict[str, int] = {}
    if args.dtype == "bfloat16":
        model = model.to(torch.bfloat16)
        bf16.FORCED = {"amx": bf16.AMX, "dot": bf16.DOT, "avx512": bf16.AVX512, "avx2": bf16.AVX2, "scalar": bf16.SCALAR}.get(args.path)
        from kernels.c_step import gate_up_shape
        from kernels.prompt_gemm import MANY_ROWS

        path = bf16.chosen(skinny.library(), gate_up_shape(model))  # --path, else measured here
        shapes = bf16.tiles(skinny.library(), path)
        measured = [bf16.prompt_tile(skinny.library(), path, MANY_ROWS + 1)]  # the variant a run would take here
        indices = range(1, len(shapes)) if args.tiles == ["all"] else measured if args.tiles == ["0"] else map(int, args.tiles)
        for i in indices:
            for c in args.chunks:
                variants[f"C step, {bf16.NAMES[path]}, tile {shapes[i][0]}x{shapes[i][1]}, k-panels of {shapes[i][2]}, chunks of {c}"] = i
        chosen = []
    else:
        built = tiles(skinny.library())
        chosen = built if args.tiles == ["all"] else [built[int(i)] for i in args.tiles]
    linear = sum(p.numel() for layer in model.model.layers for p in layer.parameters() if p.dim() == 2)
    head = model.get_output_embeddings().weight.numel()
    ids = torch.randint(len(tokenizer), (1, max(max(args.lengths), args.context + 1)), generator=torch.Generator().manual_seed(0))
    plans: Dict[str, object] = {f"C step, tile {t.name()}, chunks of {c}": PromptPlan(t.index, c) for t in chosen for c in args.chunks}
    plans.update({name: PromptPlan(0, int(name.rsplit(" ", 1)[1])) for name in variants})
    if not args.no_torch and not variants:  # a bfloat16 model has no kernel plan to switch its passes to torch
        plans["torch, own (MKL)"] = False
    peak = machine_peak(torch.get_num_threads(), skinny.library().skinny_simd())
    with torch.inference_mode(), held(model):  # "own" on the model's own weights (the C step frees them elsewhere)
        times = prompt_passes(model, ids, plans, args.lengths, args.rounds, variants)
        alone = linears_alone(model, chosen, args.rounds) if chosen else {}
        one = one_position(model, ids, args.context, args.rounds)
    print(f"embedded SmolLM2-135M · {args.dtype} · {torch.get_num_threads()} threads · kernel {skinny.identity()} "
          f"(AVX width {skinny.library().skinny_simd()}) · median of {args.rounds}")
    print(peak.line() + (" (float32 FMA; bfloat16 sums are float32 FMAs or vdpbf16ps)" if variants else ""))
    for n in args.lengths:
        flops = 2 * (linear * n + head)
        for name in plans:
            seconds = statistics.median(times[name, n])
            print(f"prompt pass of {n} positions, {name}: {1e3 * seconds:.1f} ms ({flops / seconds / 1e9:.0f} GFLOP/s, "
                  f"{100 * flops / seconds / 1e9 / peak.gflops():.0f}% of the peak)")
    for tile in chosen:
        print(f"linears alone, tile {tile.name()}: {alone[tile.index]:.0f} GFLOP/s ({100 * alone[tile.index] / peak.gflops():.0f}% of the peak)")
    print(f"one-position pass after {args.context} cached positions, C step: {1e3 * one:.2f} ms")


if __name__ == "__main__":
    main()
