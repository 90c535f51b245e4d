"""A one-position pass against a read of its own bytes, float32 and bfloat16, with variant builds of the C
step's library compared in one run (interleaved rounds, medians), on the embedded SmolLM2-135M:

- each dtype's read bound: a plain float32 sum over as many bytes as the pass's weights take in that dtype
  (every decoder linear, q/k/v and gate/up fused, and the output layer);
- each dtype's cached one-position pass on the C step (its path as chosen here), on the built library and
  on one built with each ``--variants`` define (NAME or NAME=VALUE, as ``scripts/bf16_read.py``'s; several
  defines in one variant joined by commas), and the logits of each variant compared with the built one's
  (a variant that changes a bit is reported: every variant must give the same bits);
- with ``--threads``, the team's size (default: torch's).

    ../shared/tools/quiet -- .venv/bin/python scripts/pass_read.py --variants STEP_HUGE_PAGES=0   # run alone
    .venv/bin/python scripts/pass_read.py --rounds 2     # a smoke run
"""
import argparse
import copy
import ctypes
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def variant(defines: str) -> ctypes.CDLL:
    """The skinny library built with ``-D`` each of the comma-separated ``defines`` (its own file: the flags name it)."""
    from kernels import skinny
    from utils.models import cache_dir
    from utils.toolchain import c_compiler

    flags = skinny.FLAGS
    skinny.FLAGS = (*flags, *(f"-D{d}" for d in defines.split(",")))
    try:
        library = skinny._load(skinny._build(c_compiler(), cache_dir() / "kernels"))
        for name in skinny.SYMBOLS:  # typed as kernels.skinny types its own library's functions
            mine, theirs = getattr(skinny.library(), name), getattr(library, name)
            theirs.argtypes, theirs.restype = mine.argtypes, mine.restype
        return library
    finally:
        skinny.FLAGS = flags


def pass_bytes(step) -> int:
    """The bytes of the weights a pass reads (its linears and the output layer) in the step's format."""
    size = 2 if step.dims.weights else 4
    return size * (sum(n * k for layer in range(len(step.structs)) for _, n, k in step.linears(layer)) + step.vocab * step.dims.H)


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="*", default=[], help="defines, each a library to compare (A=1,B=2: one library)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--context", type=int, default=64, help="cached positions before the timed pass")
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16"], default=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    from kernels import skinny
    from runners import LeanRunner
    from utils.models import load_embedded

    if not skinny.available()[0]:
        sys.exit(f"the skinny kernel is not built here: {skinny.available()[1]}")
    base, tokenizer = load_embedded()
    ids = torch.randint(len(tokenizer), (1, args.context + 1), generator=torch.Generator().manual_seed(0))
    runners, reads = {}, {}
    for name in args.dtypes:
        model = base if name == "float32" else copy.deepcopy(base).to(torch.bfloat16)
        runners[name] = LeanRunner(model)
        runners[name](ids[:, : args.context], 1)
        reads[name] = torch.ones(pass_bytes(runners[name].step) // 4)
    libraries: Dict[str, ctypes.CDLL] = {"built": skinny.library(), **{v: variant(v) for v in args.variants}}

    def one_pass(name: str, library: ctypes.CDLL) -> torch.Tensor:
        runner = runners[name]
        runner.step.library = library
        logits = runner(ids, 1)
        runner.rollback(args.context)
        return logits

    same = {(n, v): torch.equal(one_pass(n, lib), one_pass(n, libraries["built"])) for n in runners for v, lib in libraries.items()}
    times: Dict[tuple, List[float]] = {}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for name in runners:
            samples = {(name, "read"): lambda plain=reads[name]: plain.sum()}
            for v, lib in (libraries.items() if round_ % 2 else reversed(list(libraries.items()))):
                samples[(name, v)] = lambda name=name, lib=lib: one_pass(name, lib)
            for key, run in samples.items():
                seconds = timed(run)
                if round_:
                    times.setdefault(key, []).append(seconds)
    print(f"embedded SmolLM2-135M · {torch.get_num_threads()} threads · {args.context} cached · median of {args.rounds} · "
          f"kernel {skinny.identity()}")
    for name, runner in runners.items():
        read, size = statistics.median(times[(name, "read")]), pass_bytes(runner.step)
        built = statistics.median(times[(name, "built")])
        print(f"{name}: read bound {size / 1e6:.0f} MB at {size / read / 1e9:.1f} GB/s = {read * 1e3:.2f} ms")
        for v in libraries:
            ms = statistics.median(times[(name, v)])
            print(f"  {v:<40} pass {ms * 1e3:6.2f} ms = {ms / read:.3f}x the read, {ms / built:.3f}x built"
                  f"{'' if same[(name, v)] else ' · LOGITS DIFFER'}")


if __name__ == "__main__":
    main()
