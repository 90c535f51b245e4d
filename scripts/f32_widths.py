"""What a float32 pass's linears cost by width (positions 1..8), by shape, per variant of the few-row loop
(``kernels/f32_few.h``, switched at run time: the same bits), in one process: every linear of one pass of the
embedded SmolLM2-135M's shapes (q/k/v fused, o, gate/up fused, down per layer, then the output layer) through
``skinny_linear`` on float32 blocked weights of those sizes (constant values: speed does not depend on them),
each layer its own weights (a pass reads them from memory). Interleaved rounds (width by width, variant by
variant), medians; each shape's milliseconds, and each variant's whole sum relative to the first variant's one
position. Wall time, on a shared machine: noisy; each linear is a parallel region of its own, so beside a busy
process the small shapes read mostly their regions' starts (the C step runs a pass in one: scripts/decode_profile.py).

    .venv/bin/python scripts/f32_widths.py --rounds 15
    .venv/bin/python scripts/f32_widths.py --rounds 2 --layers 2 --widths 1 4     # a smoke run
"""
import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# name -> (on, shape, bytes ahead into L2, from rows): kernels/f32_few.h's f32_few
VARIANTS = {"before": (0, 1, 4096, 4), "few": (1, 1, 4096, 4), "prefetch only": (1, 0, 4096, 4), "shape only": (1, 1, 0, 4),
            "8 KB ahead": (1, 1, 8192, 4), "2 KB ahead": (1, 1, 2048, 4), "L2 from 2": (1, 1, 4096, 2), "L2 from 6": (1, 1, 4096, 6),
            "one too": (2, 1, 4096, 4), "one too, L2": (2, 1, 4096, 1)}
SHAPES = ("qkv", "o", "gate/up", "down", "head")


def shapes(config) -> List[Tuple[str, int, int]]:
    """(name, N, K) of every linear of one pass, in the step's order."""
    h, i, heads, kv = config.hidden_size, config.intermediate_size, config.num_attention_heads, config.num_key_value_heads
    d = h // heads
    layer = [("qkv", (heads + 2 * kv) * d, h), ("o", h, heads * d), ("gate/up", 2 * i, h), ("down", h, i)]
    return layer * config.num_hidden_layers + [("head", config.vocab_size, h)]


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=list(range(1, 9)))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--layers", type=int, default=0, help="decoder layers (0: the model's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--ahead", type=int, default=-1, help="one position's prefetch bytes (skinny_ahead[0]; -1: the build's)")
    args = parser.parse_args(argv)
    from transformers import AutoConfig

    from kernels import skinny
    from kernels.blocked import pack
    from utils.models import embedded_model_dir

    config = AutoConfig.from_pretrained(embedded_model_dir())
    if args.layers:
        config.num_hidden_layers = args.layers
    library = skinny.library()
    library.skinny_set_few32.restype = ctypes.c_int64
    library.skinny_set_few32.argtypes = [ctypes.c_int64] * 5
    library.skinny_set_ahead.restype = ctypes.c_int64
    library.skinny_set_ahead.argtypes = [ctypes.c_int64] * 3
    library.skinny_set_ahead(args.ahead, -1, 0)
    generator = torch.Generator().manual_seed(0)
    weights = [(name, n, k, pack(torch.randn(n, k, generator=generator) * 0.02)) for name, n, k in shapes(config)]
    rows = {w: torch.randn(w, max(k for _, _, k, _ in weights), generator=generator) for w in args.widths}
    outs = {w: torch.empty(w, max(n for _, n, _, _ in weights)) for w in args.widths}
    times: Dict[Tuple[str, int, str], List[float]] = {}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for w in args.widths:
            for v in args.variants:
                library.skinny_set_few32(*VARIANTS[v], 0)
                spent = dict.fromkeys(SHAPES, 0.0)
                x, y = rows[w], outs[w]
                for name, n, k, packed in weights:
                    xs = x[:, :k].contiguous()
                    start = time.perf_counter()
                    library.skinny_linear(xs.data_ptr(), packed.data_ptr(), 0, y.data_ptr(), w, n, k, args.threads)
                    spent[name] += time.perf_counter() - start
                if round_:
                    for name, s in spent.items():
                        times.setdefault((v, w, name), []).append(s)
    one = sum(statistics.median(times[args.variants[0], args.widths[0], s]) for s in SHAPES)
    print(f"float32 linears, {config.num_hidden_layers} layers + head, {args.threads} threads, median of {args.rounds} rounds (ms; noisy)")
    print("variant        width  " + "  ".join(f"{s:>8}" for s in SHAPES) + "     sum  x first's one")
    for v in args.variants:
        for w in args.widths:
            ms = [1e3 * statistics.median(times[v, w, s]) for s in SHAPES]
            print(f"{v:14} {w:5}  " + "  ".join(f"{m:8.2f}" for m in ms) + f"  {sum(ms):6.2f}  {sum(ms) / 1e3 / one:.3f}")


if __name__ == "__main__":
    main()
