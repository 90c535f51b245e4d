"""Where a prompt pass's time goes on the C step: the embedded SmolLM2-135M (float32, or bfloat16 with
``--dtype bfloat16``: its weights on the bfloat16 path measured here or ``--path``), one prompt pass
(a fresh cache, the last position's logits) over each of ``--lengths`` positions under the prompt plan
asked (``--tile``: float32's variant, ``kernels/skinny_tiles.c``, or the bfloat16 path's,
``kernels/skinny_bf16_rows.c``, default the one measured here; ``--chunk``), split into the linears, attention and the rest by a profiling build of
the library (``-DSTEP_PROFILE``: each thread's CPU seconds by part, summed over the threads), beside
the pass's wall time and its process CPU time, under each attention grouping asked (``--groups``: the
most query heads of one key-value head attended at once, 1 one at a time; the same bits), interleaved;
then the same prompt through ``autoregressive_generate`` for one token (what ``scripts/versus_openvino.py``
times as the first token), its wall and CPU time.

CPU seconds, not wall time, split the pass: run it with ``OMP_WAIT_POLICY=passive`` (set here when
unset), so that a thread waiting at a barrier sleeps instead of counting its spin as work. On a busy
machine the CPU split still holds roughly; the wall times do not.

    OMP_WAIT_POLICY=passive .venv/bin/python scripts/prompt_profile.py --lengths 769 --tile 5 --chunk 128 --groups 1 4
    .venv/bin/python scripts/prompt_profile.py --dtype bfloat16 --path dot --tile 3 --lengths 210 769
"""
import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path
from typing import List

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before torch loads its OpenMP runtime
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARTS = ("linears", "attention", "the rest")
PATHS = ("amx", "dot", "avx512", "avx2", "scalar")  # kernels.bf16's paths, best first (--path)


def bfloat16(model, path: str | None, tile: int | None, chunk: int, library) -> str:
    """``model`` in bfloat16 on ``path`` (None: the one measured here) and its many-row variant ``tile``
    (None: the one measured here); the words naming them."""
    import kernels.bf16 as bf16
    from kernels.c_step import gate_up_shape
    from kernels.prompt_gemm import MANY_ROWS

    model.to(torch.bfloat16)
    bf16.FORCED = None if path is None else getattr(bf16, path.upper())
    bf16.FORCED_TILE = tile
    chosen = bf16.chosen(library, gate_up_shape(model))
    rows, blocks, kc = bf16.tiles(library, chosen)[bf16.prompt_tile(library, chosen, MANY_ROWS + 1, gate_up_shape(model))]
    return f"{bf16.NAMES[chosen]}, tile {rows}x{blocks}, k-panels of {kc or 'the whole of k'}, chunks of {chunk} positions"


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[210, 769])
    parser.add_argument("--tile", type=int, default=None,
                        help="the many-row variant (float32: kernels/skinny_tiles.c, default 0; bfloat16: skinny_bf16_rows.c, default measured)")
    parser.add_argument("--chunk", type=int, default=256, help="positions per C call")
    parser.add_argument("--rounds", type=int, default=3, help="timed repeats (medians)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--groups", type=int, nargs="+", default=[4], help="attention's most query heads at once (1: one at a time)")
    parser.add_argument("--positions", type=int, default=8, help="attention's most positions at once (1-8; the same bits)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the weights' dtype")
    parser.add_argument("--path", choices=PATHS, default=None, help="bfloat16: the path forced (default: measured here)")
    parser.add_argument("--march", default="native", help="the library built for this -march (haswell: the AVX2 build)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    from kernels import skinny

    skinny.FLAGS = tuple(f"-march={args.march}" if f == "-march=native" else f for f in skinny.FLAGS)  # its own library file
    skinny.FLAGS = (*skinny.FLAGS, "-DSTEP_PROFILE")  # its own library file (the flags are in its name)
    library = skinny.library()
    library.c_step_profile.restype = ctypes.c_int
    from kernels.prompt_gemm import PromptPlan, describe, set_plan
    from runners import LeanRunner
    from sampling import autoregressive_generate
    from utils.models import load_embedded

    model, tokenizer = load_embedded(torch.float32)
    plan = PromptPlan(args.tile or 0, args.chunk)
    set_plan(model, plan)  # a bfloat16 model's passes read only its chunk length
    words = describe(plan, library) if args.dtype == "float32" else bfloat16(model, args.path, args.tile, args.chunk, library)
    linear = sum(p.numel() for layer in model.model.layers for p in layer.parameters() if p.dim() == 2)  # the head: one position
    ids = torch.randint(len(tokenizer), (1, max(args.lengths)), generator=torch.Generator().manual_seed(0))
    parts = (ctypes.c_double * len(PARTS))()
    print(f"embedded SmolLM2-135M · {args.dtype} · {args.threads} threads · {words} · "
          f"attention {args.positions} positions at most at once · median of {args.rounds} · OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")
    runner = LeanRunner(model)
    autoregressive_generate(ids[0, :16].tolist(), model, 2, eos_tokens_id=-1, use_cache=True)  # warm
    group = ctypes.c_int.in_dll(library, "c_step_group")
    ctypes.c_int.in_dll(library, "c_step_positions").value = args.positions
    for n in args.lengths:
        walls, cpus, split = ({g: [] for g in args.groups} for _ in range(3))
        firsts, first_cpus = [], []
        for round_ in range(args.rounds + 1):  # round 0 warms up
            for g in args.groups:
                group.value = g
                runner.rollback(0)
                library.c_step_profile(parts)
                wall, cpu = time.perf_counter(), time.process_time()
                runner(ids[:, :n], 1)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                library.c_step_profile(parts)
                if round_:
                    walls[g].append(wall), cpus[g].append(cpu), split[g].append(list(parts))
            start, cpu_start = time.perf_counter(), time.process_time()
            autoregressive_generate(ids[0, :n].tolist(), model, 1, eos_tokens_id=-1, use_cache=True)
            if round_:
                firsts.append(time.perf_counter() - start), first_cpus.append(time.process_time() - cpu_start)
        for g in args.groups:
            median = [statistics.median(s[p] for s in split[g]) for p in range(len(PARTS))]
            shares = ", ".join(f"{name} {1e3 * s:,.0f} ms ({100 * s / sum(median):.0f}%)" for name, s in zip(PARTS, median))
            print(f"{n} positions, attention {g} query heads at most at once: prompt pass {1e3 * statistics.median(walls[g]):,.0f} ms wall, "
                  f"{1e3 * statistics.median(cpus[g]):,.0f} ms CPU; the step's CPU time: {shares}; the linears "
                  f"{2 * linear * n / median[0] / 1e9:.0f} GFLOP/s a core (their FLOPs over their CPU seconds)")
        print(f"{n} positions: autoregressive_generate, one token (attention {args.groups[-1]} at most at once): "
              f"{1e3 * statistics.median(firsts):,.0f} ms wall, {1e3 * statistics.median(first_cpus):,.0f} ms CPU")

if __name__ == "__main__":
    main()
