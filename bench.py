"""Benchmark every strategy and transformers' own paths on Spec-Bench-format prompts.

    python bench.py                                   # embedded model, shipped prompts, greedy
    python bench.py --prompts ../shared/specbench/question.jsonl --categories summarization,rag --limit 10
    python bench.py --drafter layers:20 --gamma 1,2,4,8 --repeats 3
    python bench.py --replay                          # n-gram storage hit rates, no model forward pass

Writes, under --out: runs.jsonl (every run), summary.csv, results.md (a table per category) and
PNG plots. Timing: a warm-up pass per configuration first (excluded), the device synchronised
around each run, only new tokens counted, configurations interleaved prompt by prompt and repeat
by repeat so that machine drift hits all alike; speedups are ratios to target autoregressive
taken within the same repeat; the order of the configurations rotates from one run to the next.
Every greedy run is compared with target autoregressive; a divergence is reported with its first
diverging position and classified (sampling.divergence) as a rounding near-tie or a disagreement,
outside the timed runs; --strict exits with status 1 on any disagreement.
"""
# The program lives in app/bench/ (cli, run, report, intervals, plots, llama_cpp, replay, configs,
# prompts); this entry point keeps `python bench.py` and the names other code reads as `bench.X`.
from app.bench.cli import build_parser, gamma_list, group_spec, main, pause_spec, write_reports
from app.bench.configs import Config, baseline, default_strategies, make_configs, refuse_trees
from app.bench.intervals import NO_DIFFERENCE, RESAMPLES, ratio_cell, ratio_interval
from app.bench.llama_cpp import llama_cpp_report, llama_cpp_tokens_per_s
from app.bench.plots import error_bars, gamma_sweep, plots, theoretical_speedup
from app.bench.prompts import CODE_EDITING, DEFAULT_GROUP, DEFAULT_PROMPTS, ROOT, load_prompts
from app.bench.replay import replay_report
from app.bench.report import (
    LEGEND,
    check_strict,
    compared_peers,
    divergence_cell,
    divergence_columns,
    kernels_report,
    markdown,
    ordered_categories,
    speedup_cell,
    speedup_matrix,
    summarize,
    versus_column,
    versus_table,
)
from app.bench.run import Bench, first_divergence

__all__ = [
    "Bench", "CODE_EDITING", "Config", "DEFAULT_GROUP", "DEFAULT_PROMPTS", "LEGEND", "NO_DIFFERENCE", "RESAMPLES", "ROOT",
    "baseline", "build_parser", "check_strict", "compared_peers", "default_strategies", "divergence_cell",
    "divergence_columns", "error_bars", "first_divergence", "gamma_list", "gamma_sweep", "group_spec", "kernels_report",
    "llama_cpp_report", "llama_cpp_tokens_per_s", "load_prompts", "main", "make_configs", "markdown", "ordered_categories",
    "pause_spec", "plots", "ratio_cell", "ratio_interval", "refuse_trees", "replay_report", "speedup_cell",
    "speedup_matrix", "summarize", "theoretical_speedup", "versus_column", "versus_table", "write_reports",
]

if __name__ == "__main__":
    main()
