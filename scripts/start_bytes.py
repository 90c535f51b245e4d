"""Bytes a first start holds (issue 71): the start the REPL makes (``app.pair.load_pair``, with the REPL's
defaults: ``--preset pair``'s dtype race for ``--dtype auto``, a float32 target's ``--drafter-dtype auto``),
every measurement made afresh in a cache folder of its own (nothing saved is reused or overwritten), then a
first run of target AR and (with a drafter) speculative decoding, all inside torch's allocator count
(``utils.allocations``: the load's file mapping, each copy, each C step's blocks). Prints the most bytes
held in each phase (each model's load and dtype race, the kernel measurement, the whole start, the first
run) against the issue's limit: 1.2x the float32 weights plus 1 GiB, halved where nothing loads in float32
(``--dtype bfloat16``). No time is printed: the figures are counts of bytes, the same on a busy machine.

    .venv/bin/python scripts/start_bytes.py                      # the embedded SmolLM2-135M
    .venv/bin/python scripts/start_bytes.py --target FOLDER [--drafter FOLDER]
    .venv/bin/python scripts/start_bytes.py --pair [--dtype auto|float32|bfloat16] [--drafter-dtype ...]  # make fetch-pair
"""
import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, Iterator
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GB = 1 << 30
LIMIT = 1.2  # the most a start may hold, in float32 weights, plus ``SLACK`` (issue 71), halved in bfloat16
SLACK = 1 * GB
PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


def fresh_cache() -> None:
    """A cache folder of this run's own, the user's converted models and built kernels linked in, no
    saved measurement: the start is a first start (set before anything reads the folder)."""
    from utils.models import cache_dir

    users, own = cache_dir(), Path(tempfile.mkdtemp(prefix="specdec-start-bytes-"))
    for entry in users.glob("*") if users.is_dir() else ():
        if entry.is_dir() and entry.name not in ("measurements", "inductor", "eagle"):
            (own / entry.name).symlink_to(entry, target_is_directory=True)
    os.environ["SPECDEC_CACHE"] = str(own)


def named(name: Callable[..., str], function: Callable) -> Callable:
    """``function`` run inside a counted stretch named ``name(*its arguments)``."""
    from utils.allocations import part

    def inside(*args, **kwargs):
        with part(name(*args, **kwargs)):
            return function(*args, **kwargs)

    return inside


def parameters(model) -> int:
    """The model's parameters (each tensor once), counted as it is loaded: the C step later releases its layers'."""
    return sum(p.numel() for p in {p.untyped_storage().data_ptr(): p for p in model.parameters()}.values())


@contextlib.contextmanager
def phases(sizes: Dict[str, int]) -> Iterator[None]:
    """The start's phases named where the REPL's route runs them: each model's load (``app.pair._load``) and
    dtype race (``_measured_load``: its float32 load, bfloat16 copy and race), each kernel measurement;
    ``sizes`` gets each role's parameter count as it loads."""
    import app.pair
    import measure.timing as timing

    load = app.pair._load

    def counted_load(role, *args, **kwargs):
        loaded = load(role, *args, **kwargs)
        sizes[role] = parameters(loaded[0])
        return loaded

    with contextlib.ExitStack() as stack:
        for owner, attribute, name, function in (
                (app.pair, "_load", lambda role, *a, **k: f"{role} load", counted_load),
                (app.pair, "_measured_load", lambda role, *a, **k: f"{role} race", app.pair._measured_load),
                (timing, "measure_kernels", lambda *a, **k: "kernel measurement", timing.measure_kernels)):
            stack.enter_context(mock.patch.object(owner, attribute, named(name, function)))
        yield


def first_run(pair, tokens: int) -> None:
    """Speculative decoding (with a drafter) and target AR, in the REPL's order, greedy, ``tokens`` tokens each."""
    from app.session import build_settings, encode
    from strategies import STRATEGIES, run_strategy

    config, context = build_settings(pair, "greedy", 4, tokens, say=lambda *a, **k: None)
    prompt = encode(context.tokenizer, PROMPT, True)
    keys = ("target", "speculative") if pair.drafter is not None else ("target",)
    for strategy in (s for s in STRATEGIES if s.key in keys):
        result = run_strategy(strategy, prompt, config, context)
        print(f"{strategy.title}: {len(result.tokens)} tokens", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="a model folder (default: the embedded SmolLM2-135M)")
    parser.add_argument("--drafter", help="a drafter's model folder, started beside the target")
    parser.add_argument("--pair", action="store_true", help="the Qwen2.5-Coder 1.5B target and 0.5B drafter, as --preset pair starts them")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                        help="the target's (auto: --preset pair's race; otherwise the folder's own dtype)")
    parser.add_argument("--drafter-dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                        help="the drafter's (auto: a float32 target's race under --pair, else the target's)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens the first run generates in each row")
    args = parser.parse_args()
    target, drafter = args.target, args.drafter
    if args.pair:
        from app.pair import SetupError, pair_preset

        try:
            preset = pair_preset()
        except SetupError as error:
            raise SystemExit(str(error)) from None
        target, drafter = preset["target"], preset["drafter"]
    fresh_cache()
    from app.pair import LoadOptions, load_pair
    from utils.allocations import counted

    torch.set_grad_enabled(False)
    options = LoadOptions("cpu", dtype=args.dtype, measure_dtype=args.pair, drafter_dtype=args.drafter_dtype)
    say = lambda text, style="": print(text, file=sys.stderr, flush=True)  # noqa: E731
    sizes: Dict[str, int] = {}
    with counted() as held, phases(sizes):
        with held.part("start"):
            pair = load_pair(target, drafter, options, say)
        with held.part("first run"):
            first_run(pair, args.tokens)
    kept = {"target": pair.target.dtype, **({"drafter": pair.drafter.dtype} if pair.drafter is not None else {})}
    weights = sum(sizes[role] * dtype.itemsize for role, dtype in kept.items())
    float32 = 4 * sum(sizes[role] for role in kept)
    narrow = args.dtype == "bfloat16" and args.drafter_dtype in ("auto", "bfloat16")  # nothing loads in float32
    limit = (LIMIT * float32 + SLACK) / (2 if narrow else 1)
    print(pair.describe("target") + pair.header_note())
    if pair.drafter is not None:
        print(pair.describe("drafter"))
    print(f"weights kept: {weights:,} bytes ({weights / GB:.2f} GiB; {', '.join(f'{r} {str(d)[6:]}' for r, d in kept.items())}); "
          f"float32: {float32 / GB:.2f} GiB; limit {limit / GB:.2f} GiB (1.2x the float32 weights + 1 GiB{', halved' if narrow else ''})")
    for name in ("target load", "target race", "drafter load", "drafter race", "kernel measurement", "start", "first run"):
        if name in held.parts:
            peak = held.parts[name]
            print(f"{name}: at most {peak:,} bytes held ({peak / GB:.2f} GiB), {peak / float32:.3f}x the float32 weights, "
                  f"{'within' if peak <= limit else 'OVER'} the limit")
    print(f"whole start and first run: at most {held.peak / GB:.2f} GiB, {'within' if held.peak <= limit else 'OVER'} the limit")


if __name__ == "__main__":
    main()
