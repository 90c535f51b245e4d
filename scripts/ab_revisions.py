"""Interleaved A/B of this working tree against another revision, on the embedded model: each round
runs the same workload (the public functions of both revisions, greedy, the shipped prompts) in a
fresh process per side, in ABBA order, and reports each strategy's tokens/s and the ratio of this
tree to the other revision (median over rounds). Ratios within one run: the machine is shared.
Each run's window records what the other processes used meanwhile (``utils.load``): the table ends
with a QUIET or NOISY line, and ``--strict`` exits with status 1 on a noisy one.

    .venv/bin/python scripts/ab_revisions.py --base HEAD~1 --rounds 4
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

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

new_tokens, count = int(sys.argv[1]), int(sys.argv[2])
model, tokenizer = load_embedded()
drafter = truncated_drafter(model, 10)
rows = [json.loads(line) for line in open("bench_prompts.jsonl") if line.strip()][:count]
texts = [tokenizer.apply_chat_template([{"role": "user", "content": r["turns"][0]}], add_generation_prompt=True, tokenize=False)
         for r in rows]
prompts = [tokenizer(text, add_special_tokens=False).input_ids for text in texts]
common = dict(max_gen_len=new_tokens, eos_tokens_id=end_tokens(model, tokenizer), use_cache=True)
vocab = model.config.vocab_size
runs = {
    "target AR": lambda p: autoregressive_generate(p, model, **common),
    "NASD g4": lambda p: ngram_assisted_speculative_generate(p, NGramStorage(3, vocab), model, gamma=4, **common)[0],
    "prompt lookup": lambda p: prompt_lookup(p, **common)[0],
    "speculative g4 (10 layers)": lambda p: speculative_generate(p, drafter, model, gamma=4, **common)[0],
}
only = [name for name in sys.argv[3].split(",") if name] if len(sys.argv) > 3 else []
runs = {name: run for name, run in runs.items() if not only or name in only}
for run in runs.values():
    run(prompts[0][:32])  # warm-up
out = {}
for name, run in runs.items():
    tokens, seconds = 0, 0.0
    for prompt in prompts:
        torch.manual_seed(0)
        start = time.perf_counter()
        tokens += len(run(prompt))
        seconds += time.perf_counter() - start
    out[name] = tokens / seconds
print(json.dumps(out))
'''


def measure(tree: Path, new_tokens: int, prompts: int, only: str = "") -> dict:
    done = subprocess.run([sys.executable, "-c", WORKLOAD, str(new_tokens), str(prompts), only], cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: the workload failed in {tree}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="HEAD", help="the revision to compare with (default HEAD)")
    p.add_argument("--rounds", type=int, default=4, help="ABBA rounds (default 4)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=4, help="first prompts of bench_prompts.jsonl (default 4)")
    p.add_argument("--busy", type=float, default=BUSY, help=f"cores of other processes above which a run is noisy (default {BUSY:g})")
    p.add_argument("--strict", action="store_true", help="exit with status 1 when any run was noisy")
    p.add_argument("--only", default="", help='comma-separated workload names to run alone, e.g. "NASD g4" (default: all)')
    args = p.parse_args()
    meter, windows = LoadMeter(), []
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), args.base], cwd=ROOT, check=True)
        try:
            sides = {"this tree": ROOT, args.base: base}
            samples = {side: [] for side in sides}
            for round_ in range(args.rounds):
                order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
                for side in order:
                    meter.start()  # the workload runs in a child process: ours, not noise
                    samples[side].append(measure(sides[side], args.new_tokens, args.prompts, args.only))
                    window = meter.stop()
                    windows.append({"seconds": window.seconds, **window.record(args.busy)})
                print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    names = list(samples["this tree"][0])
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
