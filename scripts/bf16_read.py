"""How near a bfloat16 pass reads its bytes at the memory's speed, by path, on the embedded SmolLM2-135M,
all in one run (interleaved rounds, medians):

- the read bound: a plain float32 sum over as many bytes as the pass's bfloat16 weights (every decoder
  linear, q/k/v and gate/up fused, and the output layer);
- each path's linears alone: every weight matrix of a one-position pass, each in its own call;
- each path's whole cached one-position pass on the C step (the linears, attention and the rest);
- each path's decoding token through ``autoregressive_generate`` (the pass, sampling and the runner's
  Python), prefill excluded, and what of it is not the pass;
- with ``--variants``: the linears alone and the pass once more on a library built with each define
  given (NAME=VALUE: ``BF16_AHEAD_BYTES``, the prefetch distance, kernels/bf16_tiles.h; 0 none, the AMX
  path's before; 2048 the other paths' before; ``BF16_ONE_ROW_BLOCKS=2``, one position's groups as
  before, kernels/skinny_bf16_rows.c), to compare them with the built library within one run.

    ../shared/tools/quiet -- .venv/bin/python scripts/bf16_read.py --paths amx dot avx512 \
        --variants BF16_AHEAD_BYTES=0 BF16_AHEAD_BYTES=2048 BF16_ONE_ROW_BLOCKS=2   # run alone
    .venv/bin/python scripts/bf16_read.py --rounds 2 --tokens 4    # a smoke run
"""
import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
PATHS = {"amx": 5, "dot": 4, "avx512": 3, "avx2": 2, "scalar": 1}  # kernels.bf16's path ids


def variant(define: str) -> ctypes.CDLL:
    """The skinny library built with ``-D{define}`` (its own file: the flags name it)."""
    from kernels import skinny
    from utils.models import cache_dir
    from utils.toolchain import c_compiler

    flags = skinny.FLAGS
    skinny.FLAGS = (*flags, f"-D{define}")
    try:
        library = skinny._load(skinny._build(c_compiler(), cache_dir() / "kernels"))
        # typed as kernels.skinny types its own (the step asks it for its many-row variant: bf16.prompt_tile)
        library.skinny_linear_bf16.argtypes = [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4
        library.skinny_bf16_tiles.argtypes = [ctypes.c_int64]
        library.skinny_bf16_tile_shape.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        library.c_step_scratch.restype = ctypes.c_int64
        return library
    finally:
        skinny.FLAGS = flags


def sweep(step, library: ctypes.CDLL, path: int) -> Callable[[], None]:
    """A call running every linear of ``step``'s one-position pass on ``path``, each in its own call."""
    calls = [m for layer in range(len(step.structs)) for m in step.linears(layer)] + [(step.head.data_ptr(), step.vocab, step.dims.H)]
    rows = {k: torch.randn(1, k) for _, _, k in calls}
    outs = {n: torch.empty(1, n) for _, n, _ in calls}
    c = ctypes.c_int64
    threads = torch.get_num_threads()

    def run() -> None:
        for address, n, k in calls:
            library.skinny_linear_bf16(c(path), c(0), ctypes.c_void_p(rows[k].data_ptr()), ctypes.c_void_p(address), None,
                                       ctypes.c_void_p(outs[n].data_ptr()), c(1), c(n), c(k), c(threads))
    return run


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", nargs="+", choices=sorted(PATHS), default=["amx", "avx512"])
    parser.add_argument("--variants", nargs="*", default=[], help="NAME=VALUE defines, each a library to compare")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens a decoding sample")
    parser.add_argument("--context", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    import kernels.bf16 as bf16
    from kernels import skinny
    from runners import LeanRunner
    from sampling import autoregressive_generate
    from utils.models import load_embedded

    built = bf16.paths(skinny.library())
    paths = [PATHS[p] for p in args.paths if PATHS[p] in built]
    model, tokenizer = load_embedded()
    model = model.to(torch.bfloat16)
    runner = LeanRunner(model)
    ids = torch.randint(len(tokenizer), (1, args.context + 1), generator=torch.Generator().manual_seed(0))
    runner(ids[:, : args.context], 1)
    step = runner.step
    libraries: Dict[str, ctypes.CDLL] = {"built": step.library, **{name: variant(name) for name in args.variants}}
    size = sum(n * k * 2 for layer in range(len(step.structs)) for _, n, k in step.linears(layer)) + step.vocab * step.dims.H * 2
    plain = torch.ones(size // 4)
    sweeps = {(name, p): sweep(step, lib, p) for name, lib in libraries.items() for p in paths}
    own = step.library

    def one_pass(library: ctypes.CDLL, path: int) -> None:
        step.library, step.dims.weights = library, path
        runner(ids, 1)
        runner.rollback(args.context)

    times: Dict[tuple, List[float]] = {}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        samples = {("read",): lambda: plain.sum()}
        for (name, p), run in sweeps.items():
            samples[("linears", name, p)] = run
            samples[("pass", name, p)] = lambda lib=libraries[name], p=p: one_pass(lib, p)
        for key, run in samples.items():
            seconds = timed(run)
            if round_:
                times.setdefault(key, []).append(seconds)
    step.library = own
    prompt = ids[0, :16].tolist()
    token: Dict[int, List[float]] = {p: [] for p in paths}
    for _ in range(3):
        for p in paths:
            step.dims.weights = p
            one = timed(lambda: autoregressive_generate(prompt, model, 1, eos_tokens_id=[-1], use_cache=True))
            many = timed(lambda: autoregressive_generate(prompt, model, args.tokens + 1, eos_tokens_id=[-1], use_cache=True))
            token[p].append((many - one) / args.tokens)
    read = statistics.median(times[("read",)])
    print(f"embedded SmolLM2-135M · bfloat16 · {torch.get_num_threads()} threads · median of {args.rounds} · "
          f"read bound: {size / 1e6:.0f} MB at {size / read / 1e9:.1f} GB/s = {read * 1e3:.2f} ms")
    for p in paths:
        for name in libraries:
            lin, whole = (statistics.median(times[(kind, name, p)]) for kind in ("linears", "pass"))
            print(f"{bf16.NAMES[p]:<24} {name:<24} linears alone {lin * 1e3:6.2f} ms ({lin / read:.2f}x the read) · "
                  f"pass {whole * 1e3:6.2f} ms ({whole / read:.2f}x)")
        tok, whole = statistics.median(token[p]), statistics.median(times[("pass", "built", p)])
        print(f"{bf16.NAMES[p]:<24} a decoding token {tok * 1e3:.2f} ms ({tok / read:.2f}x the read), of which not the pass "
              f"{(tok - whole) * 1e3:.2f} ms (sampling, the runner's Python)")


if __name__ == "__main__":
    main()
