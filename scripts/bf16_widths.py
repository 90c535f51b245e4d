"""What a bfloat16 pass's linears cost by width (positions 1..16), per path, on a model's shapes, in one run:
every linear of one pass (q/k/v fused, o, gate/up fused, down per layer, then the output layer) through
``skinny_linear_bf16`` on bfloat16 blocked weights of the model's sizes (constant values: speed does
not depend on them), each width on the variant the C step runs it on (0 up to ``bf16.decoding_rows``,
the path's default many-row one past it; ``--tile``: one for every width). Interleaved rounds (path by path, width by width), medians; each path's costs
relative to its own one-position pass, and each path's one-position pass against the first path's.

    ../shared/tools/quiet -- .venv/bin/python scripts/bf16_widths.py --model pair-target --paths amx dot avx512   # run alone
    .venv/bin/python scripts/bf16_widths.py --layers 2 --rounds 2 --widths 1 8      # a smoke run
    ../shared/tools/quiet -- .venv/bin/python scripts/bf16_widths.py --model pair-target --passes --paths amx   # run alone

With ``--gflops``: each many-row variant of each path (``kernels/skinny_bf16_rows.c``'s SHAPES) on one decoder
layer's linears over ``--rows`` rows (a prompt's chunk), a layer's weights per sample in turn (so each sample
reads its weights from memory, as a prompt pass does), interleaved rounds: the best and the median GFLOP/s
(2 x parameters x rows over seconds). On one thread (``--threads 1``) beside another busy process, the best
of many rounds is the figure least moved by it.

    .venv/bin/python scripts/bf16_widths.py --model embedded --gflops --paths dot --threads 1 --rounds 15

With ``--passes``: the model itself, loaded in bfloat16 from its converted folder, its whole cached passes
on the C step (``measure.timing.measure_row_costs``, the start-up's costs by positions) over widths
1..max(--widths), on the first of ``--paths`` (forced; one path a process: the step takes one).
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
PATHS = {"amx": 5, "dot": 4, "avx512": 3, "avx2": 2, "scalar": 1}  # kernels.bf16's path ids
MODELS = {"embedded": "", "pair-target": "gguf-Qwen2.5-Coder-1.5B-Instruct-Q4_K_M-1117320768", "pair-drafter": "gguf-Qwen2.5-Coder-0.5B-Instruct-Q4_K_M-491400064"}


def shapes(config: dict, layers: int) -> List[Tuple[int, int]]:
    """(N, K) of every linear of one pass, in the step's order: per layer q/k/v, o, gate/up, down; then the head."""
    h, i = config["hidden_size"], config["intermediate_size"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    d = config.get("head_dim") or h // heads
    per_layer = [((heads + 2 * kv) * d, h), (h, heads * d), (2 * i, h), (h, i)]
    return per_layer * layers + [(config["vocab_size"], h)]


def config_of(name: str) -> dict:
    from utils.models import cache_dir, embedded_model_dir

    folder = embedded_model_dir() if name == "embedded" else cache_dir() / MODELS[name]
    return json.loads((folder / "config.json").read_text())


def gflops(library, paths: List[int], config: dict, rows: int, rounds: int, threads: int) -> None:
    """Each many-row variant of ``paths`` on one decoder layer's linears over ``rows`` rows (``--gflops``)."""
    from kernels import bf16

    layer = shapes(config, 1)[:-1]
    layers = min(8, config["num_hidden_layers"])  # distinct copies taken in turn: more bytes than the caches hold
    weights = [[torch.full(((n + 15) // 16, k, 16), 1 / 64, dtype=torch.bfloat16) for n, k in layer] for _ in range(layers)]
    x = torch.randn(rows * max(k for _, k in layer), generator=torch.Generator().manual_seed(0))
    y = torch.empty(rows * max(n for n, _ in layer))
    keys = [(p, t) for p in paths for t in range(1, library.skinny_bf16_tiles(p))]
    timed: Dict[Tuple[int, int], List[float]] = {key: [] for key in keys}
    for round_ in range(rounds + 1):
        for turn, (path, tile) in enumerate(keys):
            start = time.perf_counter()
            for (n, k), w in zip(layer, weights[(round_ * len(keys) + turn) % layers]):
                library.skinny_linear_bf16(path, tile, x.data_ptr(), w.data_ptr(), None, y.data_ptr(), rows, n, k, threads)
            if round_:
                timed[path, tile].append(time.perf_counter() - start)
    flops = 2 * sum(n * k for n, k in layer) * rows
    print(f"one decoder layer's linears over {rows} rows, {threads} threads, {rounds} rounds (noisy: best and median)")
    for path, tile in keys:
        r, g, kc = bf16.tiles(library, path)[tile]
        best, median = flops / min(timed[path, tile]) / 1e9, flops / statistics.median(timed[path, tile]) / 1e9
        print(f"{bf16.NAMES[path]:24s} tile {r}x{g}, k-panels of {kc or 'the whole of k'}: {best:.0f} GFLOP/s best, {median:.0f} median")


def passes(name: str, path: int, widths: int, rounds: int) -> None:
    """The model's costs by positions 1..``widths`` on the C step, ``path`` forced (relative to one position)."""
    import kernels.bf16 as bf16
    from kernels import c_step
    from measure.timing import PassTimer, measure_row_costs
    from utils.models import cache_dir, load_model

    bf16.FORCED = path
    torch.set_grad_enabled(False)
    model, _, _ = load_model(str(cache_dir() / MODELS[name]), dtype="bfloat16", say=lambda _: None, tokenizer_required=False)
    one = PassTimer(model, 128, widths)
    one.seconds(1)
    base = statistics.median(one.seconds(1) for _ in range(rounds))
    del one
    costs = measure_row_costs(model, max_rows=widths, repeats=rounds)
    print(f"{name}: {c_step.short_label(model)}; a one-position pass {base * 1e3:.1f} ms; costs by positions 1..{widths}: "
          + " ".join(f"{c:.2f}" for c in costs))


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="pair-target")
    parser.add_argument("--layers", type=int, default=0, help="decoder layers (0: the model's)")
    parser.add_argument("--paths", nargs="+", choices=sorted(PATHS), default=["amx", "dot", "avx512"])
    parser.add_argument("--widths", nargs="+", type=int, default=list(range(1, 17)))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--define", default="", help="NAME=VALUE: the library built with -D it (scripts/bf16_read.py's variant)")
    parser.add_argument("--tile", type=int, default=None, help="the variant every width takes (default: the step's)")
    parser.add_argument("--passes", action="store_true", help="the model's whole C step passes, not its linears")
    parser.add_argument("--gflops", action="store_true", help="each many-row variant's GFLOP/s on a layer's linears")
    parser.add_argument("--rows", type=int, default=256, help="--gflops: the rows (a prompt's chunk)")
    parser.add_argument("--threads", type=int, default=None, help="threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.passes:
        return passes(args.model, PATHS[args.paths[0]], max(args.widths), args.rounds)
    from kernels import bf16, skinny

    library = skinny.library()
    if args.define:
        from bf16_read import variant

        library = variant(args.define)
    built = bf16.paths(library)
    paths = [PATHS[p] for p in args.paths if PATHS[p] in built]
    config = config_of(args.model)
    threads = args.threads or torch.get_num_threads()
    if args.gflops:
        return gflops(library, paths, config, args.rows, args.rounds, threads)
    linears = shapes(config, args.layers or config["num_hidden_layers"])
    weights = [torch.full(((n + 15) // 16, k, 16), 1 / 64, dtype=torch.bfloat16) for n, k in linears]
    most = max(args.widths)
    xs = {k: torch.randn(most, k, generator=torch.Generator().manual_seed(0)) for _, k in linears}
    ys = {n: torch.empty(most, n) for n, _ in linears}
    tiles = {p: bf16.PROMPT_TILE.get(p, 1) for p in paths}
    most_rows = {p: bf16.decoding_rows(library, p) for p in paths}  # the C step's decoding loop up to these widths

    def one_pass(path: int, rows: int) -> float:
        tile = args.tile if args.tile is not None else 0 if rows <= most_rows[path] else tiles[path]
        start = time.perf_counter()
        for (n, k), w in zip(linears, weights):
            library.skinny_linear_bf16(path, tile, xs[k].data_ptr(), w.data_ptr(), None, ys[n].data_ptr(), rows, n, k, threads)
        return time.perf_counter() - start

    timed: Dict[Tuple[int, int], List[float]] = {(p, r): [] for p in paths for r in args.widths}
    for round_ in range(args.rounds + 1):
        for key in timed:
            seconds = one_pass(*key)
            if round_:
                timed[key].append(seconds)
    gb = sum(w.numel() for w in weights) * 2 / 1e9
    print(f"{args.model}: {len(linears)} linears, {gb:.2f} GB bfloat16, {threads} threads, {args.rounds} rounds (noisy: medians)")
    first = statistics.median(timed[(paths[0], args.widths[0])])
    for p in paths:
        base = statistics.median(timed[(p, args.widths[0])])
        costs = " ".join(f"{statistics.median(timed[(p, r)]) / base:.2f}" for r in args.widths)
        print(f"{bf16.NAMES[p]:24s} {base * 1e3:7.1f} ms ({base / first:.2f}x, {gb / base:.1f} GB/s) by widths "
              f"{args.widths[0]}..{args.widths[-1]}: {costs}")


if __name__ == "__main__":
    main()
