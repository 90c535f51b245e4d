"""A one-position pass against a read of its own bytes, float32 and bfloat16, with variant builds of the C
step's library compared in one run (interleaved rounds, medians), on the embedded SmolLM2-135M:

- each dtype's read bound: a plain float32 sum over as many bytes as the pass's weights take in that dtype
  (every decoder linear, q/k/v and gate/up fused, and the output layer); and a second over those bytes and the
  KV cache's that the pass reads (every layer's keys in blocks of 16 slots and values, the cached slots and its
  own, in the cache's dtype): at a long context the cache is part of the pass's own bytes;
- each dtype's cached one-position pass on the C step (its path as chosen here), on the built library and
  on one built with each ``--variants`` define (NAME or NAME=VALUE, as ``scripts/bf16_read.py``'s; several
  defines in one variant joined by commas), and the logits of each variant compared with the built one's
  (a variant that changes a bit is reported: every variant must give the same bits);
- with ``--aheads``, the built library's pass at each prefetch distance given (bytes, 0: none; ``kernels/ahead.py``
  chooses one of 4096 and 0 by measurement), set before each pass of either dtype;
- with ``--bridges``, the built library's pass at each bridge given (bytes of a thread's share of the next linear
  prefetched before a linear's barrier, ``kernels/step_bridge.h``; 0: none), set before each pass of either dtype;
- with ``--deals``, the built library's pass with each share of the linears' groups given (``kernels/deal.h``: 0 the
  static share, 1 the ends stolen), set before each pass;
- with ``--huge``, each dtype's model on 4 KB pages (``kernels.huge_pages.ON`` off), and a copy on huge pages
  (``kernels.huge_pages.collapse``);
- with ``--threads``, the team's size (default: torch's);
- with ``--cpu``, the process's CPU seconds instead of wall seconds (run with OMP_WAIT_POLICY=passive, so that a
  thread waiting at a barrier sleeps): the work of every thread summed, which a busy machine's time slicing does not
  lengthen as it does the wall time (a comparison of streaming variants on a shared machine; barriers' waits unseen).

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


def cache_bytes(runner, context: int) -> int:
    """The bytes of the KV cache a pass after ``context`` cached positions reads: each layer's keys (in blocks of
    16 slots, as attention reads them) and values of the slots ``[0, context]``, in the cache's dtype."""
    keys = runner.cache.layers[0].keys  # [1, Hkv, capacity, D]
    slots, size = context + 1, keys.element_size()
    return len(runner.cache.layers) * keys.shape[1] * keys.shape[3] * size * (-(-slots // 16) * 16 + slots)


def pass_bytes(step) -> int:
    """The bytes of the weights a pass reads (its linears and the output layer) in the step's format."""
    size = 2 if step.dims.weights else 4
    return size * (sum(n * k for layer in range(len(step.structs)) for _, n, k in step.linears(layer)) + step.vocab * step.dims.H)


CLOCK = time.perf_counter


def spans(step) -> list:
    """(address, bytes) of every weight matrix the step reads."""
    size = 2 if step.dims.weights else 4
    found = [(a, n * k * size) for layer in range(len(step.structs)) for a, n, k in step.linears(layer)]
    return found + [(step.head.data_ptr(), step.vocab * step.dims.H * size)]


def timed(run: Callable[[], object]) -> float:
    start = CLOCK()
    run()
    return CLOCK() - start


def make_runners(base, ids: torch.Tensor, args) -> tuple:
    """Each dtype's runner (and, with ``--huge``, one on a copy of the model on huge pages) after ``args.context``
    positions, and each one's read: a plain float32 tensor of its pass's bytes (on huge pages for a huge copy)."""
    from kernels import huge_pages
    from runners import LeanRunner

    huge_pages.ON = huge_pages.ON and not args.huge  # with --huge: the models' own copies on 4 KB pages, the copies' collapsed here

    runners, reads, whole = {}, {}, {}
    for name in args.dtypes:
        for huge in (False, True) if args.huge else (False,):
            model = copy.deepcopy(base) if huge or name != "float32" else base
            model = model.to(torch.bfloat16) if name == "bfloat16" else model
            key = name + " huge" if huge else name
            runner = runners[key] = LeanRunner(model)
            runner(ids[:, : args.context], 1)
            plain = reads[key] = torch.ones(pass_bytes(runner.step) // 4)
            whole[key] = torch.ones((pass_bytes(runner.step) + cache_bytes(runner, args.context)) // 4)
            if huge:
                start = time.perf_counter()
                granted = huge_pages.collapse(spans(runner.step), on=True)
                print(f"{name}: {granted / 1e6:.0f} of {pass_bytes(runner.step) / 1e6:.0f} MB on huge pages "
                      f"in {time.perf_counter() - start:.2f} s")
                huge_pages.collapse([(plain.data_ptr(), plain.numel() * 4)], on=True)
    return runners, reads, whole


def report(runners: dict, libraries: dict, times: dict, same: dict, context: int) -> None:
    """Each runner's reads, and each variant's pass against the weights' (medians, and the fastest of the rounds)
    and against the weights' and the cache's."""
    for name, runner in runners.items():
        read, size = statistics.median(times[(name, "read")]), pass_bytes(runner.step)
        both, cache = statistics.median(times[(name, "read + cache")]), cache_bytes(runner, context)
        built = statistics.median(times[(name, "built")])
        print(f"{name}: read bound {size / 1e6:.0f} MB at {size / read / 1e9:.1f} GB/s = {read * 1e3:.2f} ms; with the "
              f"{str(runner.cache.layers[0].keys.dtype).removeprefix('torch.')} cache's {cache / 1e6:.1f} MB "
              f"{both * 1e3:.2f} ms (the pass: {built / both:.3f}x that read)")
        for v in libraries:
            ms, best = statistics.median(times[(name, v)]), min(times[(name, v)])
            print(f"  {v:<40} pass {ms * 1e3:6.2f} ms = {ms / read:.3f}x the read, {ms / built:.3f}x built; fastest "
                  f"{best * 1e3:6.2f} ms = {best / min(times[(name, 'read')]):.3f}x the fastest read"
                  f"{'' if same[(name, v)] else ' · LOGITS DIFFER'}")


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="*", default=[], help="defines, each a library to compare (A=1,B=2: one library)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--context", type=int, default=64, help="cached positions before the timed pass")
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16"], default=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--aheads", type=int, nargs="*", default=[], help="prefetch distances (bytes) of the built library to compare")
    parser.add_argument("--bridges", type=int, nargs="*", default=[], help="bridges (bytes) of the built library to compare")
    parser.add_argument("--deals", type=int, nargs="*", default=[], help="shares of the built library to compare (0 static, 1 stolen ends)")
    parser.add_argument("--huge", action="store_true", help="a copy of each dtype's model on huge pages too")
    parser.add_argument("--cpu", action="store_true", help="CPU seconds of the process, not wall seconds")
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.cpu else time.perf_counter
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    from kernels import skinny
    from utils.models import load_embedded

    if not skinny.available()[0]:
        sys.exit(f"the skinny kernel is not built here: {skinny.available()[1]}")
    base, tokenizer = load_embedded()
    ids = torch.randint(len(tokenizer), (1, args.context + 1), generator=torch.Generator().manual_seed(0))
    runners, reads, whole = make_runners(base, ids, args)
    built = skinny.library()
    settled = {k: built.skinny_set_ahead(-1, -1, k) for k in (0, 1)}  # as kernels.ahead chose at the steps' builds
    from kernels import ahead
    print(f"prefetch distances settled: float32 {settled[0]} B, bfloat16 {settled[1]} B; raced: {ahead.raced() or 'nothing'}")
    libraries: Dict[str, ctypes.CDLL] = {"built": built, **{v: variant(v) for v in args.variants}}
    libraries.update({f"ahead {a}": built for a in args.aheads})
    libraries.update({f"bridge {b}": built for b in args.bridges})
    libraries.update({f"deal {d}": built for d in args.deals})
    bridge, deal = built.c_step_set_bridge(-1), built.skinny_set_deal(-1)  # the build's own

    def one_pass(name: str, library: ctypes.CDLL, label: str = "built") -> torch.Tensor:
        runner = runners[name]
        ahead = int(label.split()[1]) if label.startswith("ahead ") else -1
        library.skinny_set_ahead(ahead if ahead >= 0 else settled[0], ahead if ahead >= 0 else settled[1], 0)
        built.c_step_set_bridge(int(label.split()[1]) if label.startswith("bridge ") else bridge)
        built.skinny_set_deal(int(label.split()[1]) if label.startswith("deal ") else deal)
        runner.step.library = library
        logits = runner(ids, 1)
        runner.rollback(args.context)
        return logits

    same = {(n, v): torch.equal(one_pass(n, lib, v), one_pass(n, built)) for n in runners for v, lib in libraries.items()}
    times: Dict[tuple, List[float]] = {}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for name in runners:
            samples = {(name, "read"): lambda plain=reads[name]: plain.sum(),
                       (name, "read + cache"): lambda plain=whole[name]: plain.sum()}
            for v, lib in (libraries.items() if round_ % 2 else reversed(list(libraries.items()))):
                samples[(name, v)] = lambda name=name, lib=lib, v=v: one_pass(name, lib, v)
            for key, run in samples.items():
                seconds = timed(run)
                if round_:
                    times.setdefault(key, []).append(seconds)
    print(f"embedded SmolLM2-135M · {torch.get_num_threads()} threads · {args.context} cached · median of {args.rounds} · "
          f"{'CPU seconds, all threads' if args.cpu else 'wall seconds'} · kernel {skinny.identity()}")
    report(runners, libraries, times, same, args.context)


if __name__ == "__main__":
    main()
