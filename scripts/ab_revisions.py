"""Interleaved A/B of this working tree against another revision, on the embedded model: each round
runs the same workload (the public functions of both revisions, greedy, the shipped prompts) in a
fresh process per side, in ABBA order, and reports each strategy's tokens/s and the ratio of this
tree to the other revision (median over rounds). Ratios within one run: the machine is shared.
Each run's window records what the other processes used meanwhile (``utils.load``): the table ends
with a QUIET or NOISY line, and ``--strict`` exits with status 1 on a noisy one.

    .venv/bin/python scripts/ab_revisions.py --base HEAD~1 --rounds 4

On a GPU (``--device cuda``; ``--compile`` for compiled passes, CUDA graphs there; ``--dtype
bfloat16``) the model is moved to the device and the device is synchronised before and after each
timed generation, so that a regression between two revisions (158.9 against 109.0 tokens/s for
compiled target AR, docs/gpu.md) is measured in one run:

    python3 scripts/ab_revisions.py --base 4bce501 --device cuda --compile --rounds 2

``--series A,B,C`` times the workload in each listed revision instead (this tree not included), one fresh
process each, every round in the order of the one before reversed, and prints each revision's rounds and median
with its ratio to the first: a bisection in one run, where two sides at two rounds cannot tell 10% apart:

    .venv/bin/python scripts/ab_revisions.py --series 797bfa8,8c72d68,7cc5d32 --rounds 3 --only "target AR"
"""
import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from utils.load import BUSY, LoadMeter, LoadSummary  # noqa: E402

# Runs inside the revision's checkout: the one entry's prompt lookup where the revision has it
# (``sampling.generate`` with ``drafters.PromptLookupSpec``), else the earlier ``prompt_lookup_generate``.
WORKLOAD = r'''
import json, sys, time
import torch
torch.set_grad_enabled(False)
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
from sampling import autoregressive_generate, speculative_generate
try:
    from drafters import PromptLookupSpec
    from sampling import generate
    prompt_lookup = lambda p, **common: generate(p, model, PromptLookupSpec(), common)
except ImportError:
    from sampling import prompt_lookup_generate
    prompt_lookup = lambda p, **common: prompt_lookup_generate(p, model, **common)
from utils.models import end_tokens, load_embedded, truncated_drafter

args = json.loads(sys.argv[1])
new_tokens, count, device = args["new_tokens"], args["prompts"], torch.device(args["device"])
model, tokenizer = load_embedded()
if device.type != "cpu" or args["dtype"] != "float32":
    model = model.to(device=device, dtype=getattr(torch, args["dtype"]))
drafter = truncated_drafter(model, 10)
sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
rows = [json.loads(line) for line in open("bench_prompts.jsonl") if line.strip()][:count]
texts = [tokenizer.apply_chat_template([{"role": "user", "content": r["turns"][0]}], add_generation_prompt=True, tokenize=False)
         for r in rows]
prompts = [tokenizer(text, add_special_tokens=False).input_ids for text in texts]
common = dict(max_gen_len=new_tokens, eos_tokens_id=end_tokens(model, tokenizer), use_cache=True)
if args["compile"]:  # compiled passes (every revision since 2026-11-23); every graph built before timing
    common["compile"] = True
    try:
        from runners import prepare
    except ImportError:
        from utils.compiled import prepare
    prepare(model)
    prepare(drafter)
vocab = model.config.vocab_size
runs = {
    "target AR": lambda p: autoregressive_generate(p, model, **common),
    "NASD g4": lambda p: ngram_assisted_speculative_generate(p, NGramStorage(3, vocab), model, gamma=4, **common)[0],
    "prompt lookup": lambda p: prompt_lookup(p, **common)[0],
    "speculative g4 (10 layers)": lambda p: speculative_generate(p, drafter, model, gamma=4, **common)[0],
}
only = [name for name in args["only"].split(",") if name]
runs = {name: run for name, run in runs.items() if not only or name in only}
for run in runs.values():
    run(prompts[0][:32])  # warm-up
out = {}
for name, run in runs.items():
    tokens, seconds = 0, 0.0
    for prompt in prompts:
        torch.manual_seed(0)
        sync()
        start = time.perf_counter()
        tokens += len(run(prompt))
        sync()
        seconds += time.perf_counter() - start
    out[name] = tokens / seconds
print(json.dumps(out))
'''


DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16")


def workload_args(args: argparse.Namespace) -> str:
    """The workload's one argument: what each side runs (JSON; the same for both sides)."""
    return json.dumps({"new_tokens": args.new_tokens, "prompts": args.prompts, "only": args.only, "device": args.device,
                       "compile": args.compile, "dtype": args.dtype})


def check_device(device: str) -> None:
    """Refuse, in one line, a device this machine does not have (before any checkout is made)."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit(f"error: --device cuda, but torch {torch.__version__} sees no CUDA device here; "
                             "run on a GPU machine or leave --device out (cpu)")


def measure(tree: Path, workload: str) -> dict:
    """One run of the workload in ``tree``: tokens/s per strategy."""
    done = subprocess.run([sys.executable, "-c", WORKLOAD, workload], cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: the workload failed in {tree}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line (``argv``; None: ``sys.argv``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="HEAD", help="the revision to compare with (default HEAD)")
    p.add_argument("--rounds", type=int, default=4, help="ABBA rounds (default 4)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=4, help="first prompts of bench_prompts.jsonl (default 4)")
    p.add_argument("--busy", type=float, default=BUSY, help=f"cores of other processes above which a run is noisy (default {BUSY:g})")
    p.add_argument("--strict", action="store_true", help="exit with status 1 when any run was noisy")
    p.add_argument("--only", default="", help='comma-separated workload names to run alone, e.g. "NASD g4" (default: all)')
    p.add_argument("--device", choices=DEVICES, default="cpu",
                   help="where both sides run (default cpu); cuda synchronises the device around every timed generation")
    p.add_argument("--compile", action="store_true", help="compiled passes on both sides (CUDA graphs on cuda), built before timing")
    p.add_argument("--base-tree", default="",
                   help="an unpacked checkout of --base (git archive) to run instead of making a worktree; --base is then its label")
    p.add_argument("--series", default="",
                   help="comma-separated revisions to time against each other (this tree left out), medians against the first")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="the model's dtype (default float32)")
    return p.parse_args(argv)


@contextlib.contextmanager
def base_checkout(base: str, base_tree: str = "") -> Iterator[Path]:
    """The other side's files: ``base_tree`` as it is (an unpacked ``git archive``, where there is no
    git history, as on a GPU machine), else a detached worktree of ``base``, removed afterwards."""
    if base_tree:
        yield Path(base_tree).resolve()
        return
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), base], cwd=ROOT, check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def round_orders(sides: List[str], rounds: int) -> List[List[str]]:
    """Each round's order of the sides: as listed, then reversed, alternately (ABBA for two sides)."""
    return [list(sides) if r % 2 == 0 else list(sides)[::-1] for r in range(rounds)]


def series_table(samples: dict) -> str:
    """A markdown table of each revision's rounds (tokens/s) and median per strategy, ratio to the first revision."""
    revisions = list(samples)
    lines = ["| strategy | revision | tokens/s by round | median | against the first |", "| --- | --- | --- | ---: | ---: |"]
    for name in samples[revisions[0]][0]:
        first = statistics.median(s[name] for s in samples[revisions[0]])
        for rev in revisions:
            values = [s[name] for s in samples[rev]]
            lines.append(f"| {name} | {rev} | {', '.join(f'{v:.1f}' for v in values)} | {statistics.median(values):.1f} | "
                         f"{statistics.median(values) / first:.3f} |")
    return "\n".join(lines)


@contextlib.contextmanager
def checkouts(revisions: List[str]) -> Iterator[dict]:
    """A detached worktree of each revision, removed afterwards."""
    with contextlib.ExitStack() as stack:
        yield {rev: stack.enter_context(base_checkout(rev)) for rev in revisions}


def run_series(args: argparse.Namespace, workload: str) -> None:
    """``--series``: the workload in each revision, interleaved, then the table and the QUIET line."""
    revisions = [rev for rev in args.series.split(",") if rev]
    if len(revisions) < 2:
        raise SystemExit("error: --series needs at least two revisions, comma-separated")
    meter, windows = LoadMeter(), []
    with checkouts(revisions) as trees:
        for tree in trees.values():
            measure(tree, workload)  # each revision's builds and first-use conversions, not timed
        samples = {rev: [] for rev in revisions}
        for number, order in enumerate(round_orders(revisions, args.rounds)):
            for rev in order:
                meter.start()
                samples[rev].append(measure(trees[rev], workload))
                window = meter.stop()
                windows.append({"seconds": window.seconds, **window.record(args.busy)})
            print(f"round {number + 1}/{args.rounds} done", file=sys.stderr)
    print(f"{args.device} · {args.dtype} · {'compiled' if args.compile else 'eager'} · {args.new_tokens} new tokens · "
          f"{args.prompts} prompts · {args.rounds} rounds\n")
    print(series_table(samples))
    quiet = LoadSummary.of(windows, args.busy)
    print(f"\n{quiet.line()}")
    if args.strict and not quiet.quiet:
        raise SystemExit("error: --strict: a run was noisy; run it again on a quiet machine")


def main() -> None:
    args = parse()
    check_device(args.device)
    if args.series:
        return run_series(args, workload_args(args))
    workload = workload_args(args)
    meter, windows = LoadMeter(), []
    with base_checkout(args.base, args.base_tree) as base:
        sides = {"this tree": ROOT, args.base: base}
        samples = {side: [] for side in sides}
        for round_, order in enumerate(round_orders(list(sides), args.rounds)):
            for side in order:
                meter.start()  # the workload runs in a child process: ours, not noise
                samples[side].append(measure(sides[side], workload))
                window = meter.stop()
                windows.append({"seconds": window.seconds, **window.record(args.busy)})
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    names = list(samples["this tree"][0])
    print(f"{args.device} · {args.dtype} · {'compiled' if args.compile else 'eager'} · {args.new_tokens} new tokens · "
          f"{args.prompts} prompts · {args.rounds} rounds\n")
    print(f"| strategy | this tree (tok/s) | {args.base} (tok/s) | ratio, median of rounds | ratio, lowest to highest |\n"
          "| --- | ---: | ---: | ---: | ---: |")
    for name in names:
        ours = [s[name] for s in samples["this tree"]]
        theirs = [s[name] for s in samples[args.base]]
        ratios = [a / b for a, b in zip(ours, theirs)]
        print(f"| {name} | {statistics.median(ours):.1f} | {statistics.median(theirs):.1f} | {statistics.median(ratios):.3f} | "
              f"{min(ratios):.2f} to {max(ratios):.2f} |")
    quiet = LoadSummary.of(windows, args.busy)
    print(f"\n{quiet.line()}")
    if args.strict and not quiet.quiet:
        raise SystemExit("error: --strict: a run was noisy; run it again on a quiet machine")


if __name__ == "__main__":
    main()
