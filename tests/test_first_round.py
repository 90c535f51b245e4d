"""No timed run pays one-time work (``kernels.once``: a race of a kernel choice, a C step made, a drafter's rows
copied, a C step's scratch grown): the REPL's warm-up and ``ready`` before a prompt's rows, and the benchmark's
warm-up and ``reserve_for`` before its timed runs, do it all. Before, the first timed run on a prompt longer than
the warm-up's grew each C step's scratch (the REPL: the first row of round 1; the benchmark: a prompt past the
warm-up's 32 positions). On the tiny models, in bfloat16 and float32, with a drafter's cut output layer; counts
only, no clock."""
import time
from typing import List, Tuple

import pytest

import app.bench.cli as bench_cli
import app.bench.run as bench_run
import bench
import strategies
from configuration import RunConfig, RunContext
from kernels import once, skinny

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here (no C step)")]

LONG = "one two three four five six seven eight nine ten " * 8  # past the warm-up's prompt, and past a pass's 12 rows


def during(runs: List[Tuple[str, tuple]]) -> List[str]:
    """The one-time work each run did, as '<row>: <event>' lines (none expected)."""
    return [f"{key}: {event.line()}" for key, events in runs for event in events]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_repl_times_no_one_time_work_in_any_row_of_the_first_round(tiny_models, dtype, monkeypatch):
    from infer import Repl
    from utils.models import end_tokens, load_model

    target, tokenizer, _ = load_model(tiny_models["target"], "cpu", dtype, "none", False, say=lambda text: None)
    drafter, _, _ = load_model(tiny_models["drafter"], "cpu", dtype, "none", False, say=lambda text: None)
    config = RunConfig(gamma=4, max_gen_len=24, eos_tokens_id=(), drafter_head=1024)
    repl = Repl(config, RunContext(target=target, tokenizer=tokenizer, drafter=drafter), False, 42, rounds=2)
    runs, real = [], strategies.run_strategy

    def counted(strategy, *args, **kwargs):
        start = once.count()
        result = real(strategy, *args, **kwargs)
        runs.append((strategy.key, once.since(start)))
        return result

    monkeypatch.setattr(strategies, "run_strategy", counted)
    before = once.count()
    repl.compare(LONG)
    assert {key for key, _ in runs} == {"speculative", "ngram", "pld", "target"} and len(runs) == 8
    assert during(runs) == []
    assert any(event.kind == "scratch" for event in once.since(before)), "ready grows the scratch for this prompt, untimed"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_benchmark_times_no_one_time_work_after_its_warm_up(tiny_models, dtype, tmp_path, monkeypatch):
    runs, timing, real_attempt, real_timed = [], [False], bench_run.attempt, bench_cli.timed_runs

    def counted(bench_, config, *args, **kwargs):
        start = once.count()
        result = real_attempt(bench_, config, *args, **kwargs)
        if timing[0]:
            runs.append((config.label, once.since(start)))
        return result

    def timed(*args, **kwargs):
        timing[0] = True
        return real_timed(*args, **kwargs)

    monkeypatch.setattr(bench_run, "attempt", counted)
    monkeypatch.setattr(bench_cli, "timed_runs", timed)
    bench.main(["--target", tiny_models["target"], "--drafter", tiny_models["drafter"], "--device", "cpu", "--dtype", dtype,
                "--limit", "1", "--categories", "summarization", "--strategies", "speculative,ngram,pld", "--drafter-head", "1024",
                "--max-new-tokens", "16", "--out", str(tmp_path), "--no-calibrate"])
    assert {label.split("[")[0] for label, _ in runs} == {"target", "speculative", "ngram", "pld"}, runs  # ngram: two storages
    assert during(runs) == []


def test_the_benchmark_names_one_time_work_inside_a_timed_run_in_its_record_and_a_line(tiny_models, tmp_path, monkeypatch, capsys):
    """What the REPL says in yellow, the benchmark says too: a timed run that did one-time work (here a race noted
    inside it, as a lazy choice would) carries it in its ``runs.jsonl`` record and one line on stderr; the others none."""
    import json

    real_attempt = bench_run.attempt

    def lazy(bench_, config, *args, **kwargs):
        started = time.perf_counter()
        result = real_attempt(bench_, config, *args, **kwargs)
        if config.label.startswith("pld"):
            once.note("race", "a choice made lazily", started)
        return result

    monkeypatch.setattr(bench_run, "attempt", lazy)
    bench.main(["--target", tiny_models["target"], "--device", "cpu", "--limit", "1", "--categories", "summarization",
                "--strategies", "pld", "--max-new-tokens", "8", "--out", str(tmp_path), "--no-calibrate"])
    records = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    timed = {r["config"].split("[")[0]: r.get("one_time") for r in records}
    assert timed["target"] is None and "race: a choice made lazily" in timed["pld"][0], timed
    assert "one-time work inside a timed run: pld" in capsys.readouterr().err
