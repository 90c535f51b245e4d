"""The benchmark end to end on tiny models, and its pieces."""
import csv
import json
import statistics
from pathlib import Path

import pytest

import bench

SPECBENCH = Path(__file__).resolve().parents[2] / "shared" / "specbench" / "question.jsonl"


PLAUSIBLE_COSTS = (1.0, 1.1, 1.15, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0)


def test_benchmark_writes_runs_summary_tables_and_plots_with_no_greedy_divergence(tiny_models, tmp_path, capsys, monkeypatch):
    # --gamma auto needs plausible measured costs: a busy machine must not decide whether this test runs
    monkeypatch.setattr("measure.timing.measure_row_costs", lambda model, **kwargs: PLAUSIBLE_COSTS)
    out = tmp_path / "results"
    bench.main(["--target", tiny_models["target"], "--drafter", tiny_models["drafter"], "--device", "cpu", "--limit", "1",
                "--categories", "summarization,writing", "--gamma", "1,3,auto", "--ngram-n", "2,3", "--top-k-filler", "1,3",
                "--max-new-tokens", "8", "--repeats", "2", "--out", str(out), "--verify-cost", "--overhead"])
    for name in ("runs.jsonl", "summary.csv", "results.md", "speedup_by_category.png", "gamma_sweep.png", "theory.png",
                 "acceptance_by_position.png"):
        assert (out / name).stat().st_size > 0, name
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [r for r in records if r.get("failed")] == []  # a failed run is a record too: none here
    keys = {r["key"] for r in records}
    assert keys == {"target", "ngram", "pld", "suffix", "speculative", "chained", "drafter", "hf_generate", "hf_generate_static", "hf_assisted",
                    "hf_prompt_lookup"}
    assert {r["turn"] for r in records if r["category"] == "writing"} == {0, 1}  # the two turns of the multi-turn row
    assert {r["gamma"] for r in records if r["key"] == "speculative"} == {1, 3, "auto"}
    assert {r["gamma"] for r in records if r["key"] == "hf_assisted"} == {1, 3}  # transformers' has no auto
    assert all(max(len(r["drafted_at"]), 0) <= r["gamma"] for r in records if r["key"] == "speculative" and r["gamma"] != "auto")
    assert {(r["storage"], r["n"], r["filler"]) for r in records if r["key"] == "ngram"} >= {("onelevel", 2, 1), ("basic", 3, 3)}
    assert {r["repeat"] for r in records} == {0, 1}
    assert all(r["new_tokens"] <= 8 for r in records)
    assert [r for r in records if r["diverged_at"] is not None] == []
    # each timed run carries what the other processes used meanwhile, and what it was measured with
    assert all(r["others_cores"] >= 0 and isinstance(r["noisy"], bool) and r["busy_limit"] == 0.3 for r in records)
    assert all(r["environment"]["torch"] and r["environment"]["transformers"] and r["environment"]["python"] for r in records)
    # and what the start-up measured and chose (``measure.Measured.as_dict``): one record, written with every run
    measured = records[0]["measured"]
    assert all(r["measured"] == measured for r in records) and measured["drafter"] is not None
    # the tiny Llama target runs the lean forward (runners.lean): one cache kind, none measured
    assert measured["target"]["cache"] is None and measured["target"]["kernels"]["source"] in ("measured", "remembered")
    assert measured["row_costs"]["line"].startswith("Verification cost by positions 1..12") and measured["draft_cost"]["value"] > 0
    summary = list(csv.DictReader((out / "summary.csv").open()))
    baseline = [row for row in summary if row["config"] == "target"]
    assert baseline and all(float(row["speedup"]) == 1.0 for row in baseline)
    report = (out / "results.md").read_text()
    assert "## summarization" in report and "## all" in report and "cost of a verification pass over r positions" in report
    assert "time outside model forward passes" in report
    assert "· policy: " in report  # what the policy does on its own is named in the title
    assert report.split("\n")[2].startswith(("QUIET: other processes used", "NOISY ("))  # under the title, either way
    assert "| all | speculative[g=3] |" in report.split("against the peers run alongside")[1]  # vs assisted, same gamma
    assert {"vs_hf_generate", "vs_hf_prompt_lookup", "vs_hf_assisted"} <= set(summary[0])
    assert "## all" in capsys.readouterr().out
    bench.main(["--from-runs", str(out / "runs.jsonl"), "--out", str(tmp_path / "remade")])
    remade = (tmp_path / "remade" / "results.md").read_text()
    assert "by category" in remade and (tmp_path / "remade" / "speedup_by_category.png").exists()


def test_quantized_benchmark_with_both_caches_peers_and_an_external_llama_cpp(tiny_models, tmp_path):
    """--quantize int4, --cache dynamic, the static-cache transformers peer, and a llama-bench binary
    (a stand-in printing llama-bench's JSON) alternated with target AR."""
    fake = tmp_path / "llama-bench"
    fake.write_text("#!/bin/sh\necho '[{\"n_prompt\": 0, \"n_gen\": 8, \"avg_ts\": 100.0}]'\n")
    fake.chmod(0o755)
    for cache in ("dynamic", "static"):
        out = tmp_path / cache
        bench.main(["--target", tiny_models["target"], "--device", "cpu", "--limit", "1", "--categories", "qa",
                    "--strategies", "target,ngram,hf_generate,hf_generate_static", "--storages", "basic", "--quantize", "int4",
                    "--cache", cache, "--max-new-tokens", "6", "--out", str(out), "--no-calibrate",
                    "--llama-cpp", str(fake), "--gguf", str(fake)])
        records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
        assert {r["key"] for r in records} == {"target", "ngram", "hf_generate", "hf_generate_static"}
        assert [r for r in records if r["diverged_at"] is not None] == []
        report = (out / "results.md").read_text()
        assert "llama.cpp" in report and "| target AR / llama.cpp |" in report
        assert "vs generate (static cache)" in report


def test_sampled_benchmark_skips_the_greedy_only_peers(tiny_models, tmp_path):
    out = tmp_path / "sampled"
    bench.main(["--target", tiny_models["target"], "--device", "cpu", "--limit", "1", "--categories", "qa", "--strategies",
                "target,ngram,hf_generate", "--processor", "topk 0.8 20", "--max-new-tokens", "6", "--out", str(out)])
    keys = {json.loads(line)["key"] for line in (out / "runs.jsonl").read_text().splitlines()}
    assert keys == {"target", "ngram"}


def test_replay_reports_hit_rates_without_running_a_model(capsys):
    bench.main(["--replay", "--ngram-n", "2,3", "--storages", "basic,onelevel"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| basic") or line.startswith("| onelevel")]
    assert len(lines) == 4


def test_shipped_prompts_load_and_bad_files_are_refused(tmp_path):
    rows = bench.load_prompts(str(bench.DEFAULT_PROMPTS), None, None)
    assert len(rows) >= 8 and any(len(r["turns"]) == 2 for r in rows)
    assert len(bench.load_prompts(str(bench.DEFAULT_PROMPTS), "summarization,rag", 1)) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no turns"}\n')
    with pytest.raises(SystemExit, match="not a Spec-Bench row"):
        bench.load_prompts(str(bad), None, None)
    with pytest.raises(SystemExit, match="no prompt left"):
        bench.load_prompts(str(bench.DEFAULT_PROMPTS), "nonexistent", None)


@pytest.mark.skipif(not SPECBENCH.exists(), reason="../shared/specbench is not beside this checkout")
def test_specbench_prompt_set_loads_with_its_categories():
    rows = bench.load_prompts(str(SPECBENCH), None, None)
    assert len(rows) == 480 and len({r["category"] for r in rows}) == 13
    assert len(bench.load_prompts(str(SPECBENCH), "summarization", 5)) == 5


def test_theoretical_speedup_and_divergence_helpers():
    assert bench.theoretical_speedup(0.0, 4, 0.0) == 1.0
    assert bench.theoretical_speedup(1.0, 4, 0.0) == 5.0
    assert abs(bench.theoretical_speedup(0.5, 1, 0.0) - 1.5) < 1e-12
    assert bench.theoretical_speedup(0.5, 4, 0.25) < bench.theoretical_speedup(0.5, 4, 0.0)
    assert bench.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert bench.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert bench.first_divergence([1, 2], [1, 2, 3]) == 2


def record(category, config, repeat, tokens, seconds):
    return {"category": category, "config": config, "key": config, "gamma": 4, "repeat": repeat, "new_tokens": tokens,
            "seconds": seconds, "drafted": 0, "accepted": 0, "target_passes": tokens, "diverged_at": None}


def test_groups_of_categories_are_summarised_together_between_categories_and_all():
    records = [record(c, k, 0, 100, s) for c, k, s in (
        ("summarization", "target", 4.0), ("summarization", "ngram", 2.0), ("rag", "target", 4.0), ("rag", "ngram", 4.0),
        ("qa", "target", 4.0), ("qa", "ngram", 8.0))]
    rows = bench.summarize(records, (bench.DEFAULT_GROUP, ("unused", ("translation", "writing"))))
    speed = {(r["category"], r["config"]): r["speedup"] for r in rows}
    assert speed[("input-grounded", "ngram")] == pytest.approx((200 / 6) / (200 / 8))  # tokens over seconds, taken together
    assert speed[("all", "ngram")] == pytest.approx(300 / 14 / (300 / 12))
    assert "unused" not in {r["category"] for r in rows}  # no member present
    assert bench.ordered_categories(rows) == ["qa", "rag", "summarization", "input-grounded", "all"]
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["--group", "nameonly"])


def test_decoding_speedup_leaves_out_the_prompts_pass_and_is_absent_without_it():
    """A drafter cannot shorten the prompt's pass: the decoding column is (tokens - 1) over (seconds - that pass),
    against target AR's the same way, per repeat; a run without the pass recorded (as a peer's) shows none."""
    def timed(config, repeat, seconds, first):
        return {**record("rag", config, repeat, 65, seconds), "first_step_seconds": first}
    records = [timed("target", 0, 5.0, 1.0), timed("pld", 0, 3.0, 1.0), timed("target", 1, 6.0, 2.0), timed("pld", 1, 3.0, 2.0),
               record("rag", "suffix", 0, 65, 4.0)]
    summary = bench.summarize(records)
    rows = {r["config"]: r for r in summary if r["category"] == "rag"}
    assert rows["pld"]["decoding_speedup"] == pytest.approx(statistics.median([4.0 / 2.0, 4.0 / 1.0]))
    assert rows["pld"]["speedup"] == pytest.approx(statistics.median([5 / 3, 6 / 3]))  # whole runs, the prompt's pass in
    assert rows["target"]["decoding_speedup"] == pytest.approx(1.0) and rows["suffix"]["decoding_speedup"] is None
    report = bench.markdown(summary, "t")
    assert "| decoding speedup |" in report and "| 3.00x |" in report


def test_reports_read_configurations_from_typed_fields_never_from_labels(tmp_path):
    """Runs relabelled with names no parser could read land in the same rows, gamma-sweep families and
    comparisons: the baseline, the peer at the same gamma, and chained lines apart by n."""
    runs = [("target", {}, 10.0), ("hf_generate", {}, 9.0), ("speculative", {"gamma": 1}, 5.0),
            ("speculative", {"gamma": 3}, 4.0), ("hf_assisted", {"gamma": 1}, 8.0), ("hf_assisted", {"gamma": 3}, 2.0)]
    runs += [("chained", {"gamma": g, "n": n}, 5.0 + g + n / 2) for n in (2, 3) for g in (1, 3)]
    records = []
    for key, params, seconds in runs:
        config = bench.Config(key, **params)
        records.append({**record("qa", config.label, 0, 100, seconds), "key": key, "gamma": config.gamma, "n": config.n,
                        "storage": config.storage, "filler": config.filler, "drafted": 10, "accepted": 5,
                        "drafted_at": [10], "accepted_at": [5]})
    names = {r["config"]: f"run #{i}" for i, r in enumerate(records)}
    relabelled = [{**r, "config": names[r["config"]]} for r in records]
    rows = {(r["category"], names[r["config"]]): {**r, "config": None} for r in bench.summarize(records)}
    assert rows == {(r["category"], r["config"]): {**r, "config": None} for r in bench.summarize(relabelled)}
    speculative = rows[("all", names["speculative[g=3]"])]
    assert speculative["speedup"] == pytest.approx(2.5)
    assert speculative["versus"] == pytest.approx({"hf_generate": 9 / 4, "hf_assisted": 2 / 4})  # assisted at g=3, not g=1
    sweep = bench.gamma_sweep([r for r in bench.summarize(relabelled) if r["category"] == "all"])
    assert [p[0] for p in sweep["chained[basic n=2 k=3]"]] == [1, 3] and [p[0] for p in sweep["speculative"]] == [1, 3]
    runs_file = tmp_path / "runs.jsonl"
    runs_file.write_text("".join(json.dumps(r) + "\n" for r in relabelled))
    bench.main(["--from-runs", str(runs_file), "--out", str(tmp_path / "remade")])
    summary = {row["config"]: row for row in csv.DictReader((tmp_path / "remade" / "summary.csv").open())}
    assert float(summary[names["target"]]["speedup"]) == 1.0
    assert float(summary[names["speculative[g=1]"]]["vs_hf_assisted"]) == pytest.approx(8 / 5)
    assert (tmp_path / "remade" / "gamma_sweep.png").exists()


def test_the_benchmark_checks_the_pair_as_the_repl_does(tiny_models, tmp_path):
    """One loader for both programs: the benchmark refuses what the REPL refuses, in one line."""
    for drafter, message in ((tiny_models["t5_drafter"], "must both be decoder-only or both encoder-decoder"),
                             ("layers:1", "a drafter needs fewer layers than the target")):
        with pytest.raises(SystemExit) as refused:
            bench.main(["--target", tiny_models["target"], "--drafter", drafter, "--device", "cpu", "--limit", "1",
                        "--no-calibrate", "--out", str(tmp_path)])
        assert str(refused.value).startswith("error: ") and message in str(refused.value)


def test_each_configuration_has_its_own_policy_and_the_warm_up_leaves_no_memory(tiny_models, tmp_path, monkeypatch):
    """With --policy-memory, what one configuration's policy remembers never reaches another's."""
    seen = {}
    original = bench.Bench.context_for

    def recording(self, config, repeat=0, observer=None):
        context = original(self, config, repeat, observer)
        seen.setdefault(config.label, []).append(context.policy_memory)
        return context

    monkeypatch.setattr(bench.Bench, "context_for", recording)
    bench.main(["--target", tiny_models["target"], "--drafter", tiny_models["drafter"], "--device", "cpu", "--limit", "1",
                "--categories", "summarization", "--strategies", "speculative,chained", "--gamma", "1,3,3", "--policy-memory",
                "--max-new-tokens", "6", "--out", str(tmp_path)])
    assert set(seen) == {"target", "speculative[g=1]", "speculative[g=3]", "chained[basic n=3 k=3 g=1]", "chained[basic n=3 k=3 g=3]"}
    assert all(len(runs) == 2 for runs in seen.values())  # the warm-up, then the one timed run (g=3 given twice runs once)
    assert all(warm_up is not timed for warm_up, timed in seen.values())
    assert len({id(timed) for _, timed in seen.values()}) == len(seen)  # no two configurations share a policy


def test_each_run_record_carries_its_config_which_reads_back_equal(tiny_models, tmp_path, monkeypatch):
    """runs.jsonl writes beside every result the run's values (``RunConfig.to_dict``): read back with
    ``RunConfig.from_dict``, each is the config the run had, and the configurations' own values show."""
    from configuration import RunConfig

    seen = {}
    original = bench.Bench.run_config

    def recording(self, config):
        values = original(self, config)
        seen.setdefault(config.label, set()).add(values)
        return values

    monkeypatch.setattr(bench.Bench, "run_config", recording)
    bench.main(["--target", tiny_models["target"], "--device", "cpu", "--limit", "1", "--categories", "qa", "--strategies",
                "target,ngram,pld,tree_ngram", "--gamma", "2,3", "--top-k-filler", "1", "--tree-size", "5", "--max-new-tokens", "6",
                "--no-calibrate", "--out", str(tmp_path)])
    records = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert records and all(len(values) == 1 for values in seen.values())
    for record in records:
        config = RunConfig.from_dict(record["run_config"])
        assert {config} == seen[record["config"]] and config.to_dict() == record["run_config"]
    ngram = [RunConfig.from_dict(r["run_config"]) for r in records if r["key"] == "ngram"]
    assert {c.gamma for c in ngram} == {2, 3} and {c.param("top_k_filler") for c in ngram} == {1}
    assert all(RunConfig.from_dict(r["run_config"]).param("tree_size") == 5 for r in records)


@pytest.mark.needs_cxx
def test_compiled_benchmark_compiles_before_timing_reports_it_apart_and_runs_the_eager_yardstick(tiny_models, tmp_path,
                                                                                                monkeypatch):
    """--compile: our strategies run compiled passes (named in the title), the compile time is its own
    line, target AR on the eager runner runs alongside as a peer, no greedy run diverges, and no
    graph is built after the start-up compilation."""
    import runners.compiled as compiled
    from runners.compiled import compile_events

    monkeypatch.setattr(compiled, "BUCKETS", (4,))  # one pass width (1- to 3-position passes padded into it; longer: eager)
    after_start_up = []
    compile_for = bench.Bench.compile_for
    monkeypatch.setattr(bench.Bench, "compile_for", lambda self, items, configs: (compile_for(self, items, configs), after_start_up.append(len(compile_events))))
    out = tmp_path / "compiled"
    bench.main(["--target", tiny_models["target"], "--device", "cpu", "--limit", "1", "--categories", "qa", "--compile",
                "--strategies", "target,ngram,pld,target_eager", "--storages", "basic", "--max-new-tokens", "8",
                "--no-calibrate", "--out", str(out)])
    report = (out / "results.md").read_text()
    assert "compiled (inductor, frozen weights" in report
    assert "## compilation" in report and "Compiled at start-up, outside every timed run: target " in report
    assert "vs target AR on our eager runner" in report
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert {r["key"] for r in records} == {"target", "ngram", "pld", "target_eager"}
    assert [r for r in records if r["diverged_at"] is not None] == []
    assert after_start_up == [len(compile_events)]  # nothing compiled inside the warm-up or a timed run


def test_the_default_strategies_are_read_from_the_strategy_table():
    """Without --strategies: our chain rows, then transformers' peers but the two run only when named
    (docs/benchmark.md's table of keys says which); those needing a drafter or a head skipped without one."""
    from app.bench.configs import default_strategies

    assert default_strategies() == ("target,ngram,pld,suffix,speculative,chained,drafter,eagle,"
                                    "hf_generate,hf_generate_static,hf_prompt_lookup,hf_assisted")
    configs = bench.make_configs(bench.build_parser().parse_args([]), have_drafter=False)
    assert list(dict.fromkeys(c.key for c in configs)) == ["target", "ngram", "pld", "suffix", "hf_generate", "hf_generate_static",
                                                          "hf_prompt_lookup"]


def test_the_kernels_section_names_what_every_row_ran():
    """A row that made no kernel choice ran the model's own linear layers, and its cell says so
    (a compiled GPU report left it blank beside transformers' compiled peer)."""
    from app.bench.report import kernels_report

    assert kernels_report([{"config": "target", "kernels": ""}, {"config": "pld", "kernels": ""}], "--prepack auto") == ""
    section = kernels_report([{"config": "target", "kernels": ""}, {"config": "hf_generate_static", "kernels": "own"}], "--prepack auto")
    assert "| target | own (no choice made) |" in section and "|  |" not in section


def test_the_title_names_the_head_only_where_a_row_drafts_with_it():
    """A head loaded by default is in the report's title only when an EAGLE row or the merged tree ran."""
    from types import SimpleNamespace

    from app.bench.run import report_title
    from strategies import BY_KEY, RunConfig

    bench = SimpleNamespace(target_label="target", drafter_label="", head_line="a head", context=SimpleNamespace(head=object()),
                            args=SimpleNamespace(processor="greedy", max_new_tokens=8, repeats=1), config=RunConfig())
    rows = lambda *keys: [SimpleNamespace(strategy=BY_KEY[key], key=key) for key in keys]  # noqa: E731
    assert " + head " not in report_title(bench, rows("target", "pld"))
    assert all(" + head a head" in report_title(bench, rows("target", key)) for key in ("eagle", "eagle_tree", "merged"))
    bench.context.head = None
    assert " + head " not in report_title(bench, rows("target", "eagle"))


def test_the_title_names_the_prefetch_distance_the_runs_ran_with(tiny_models, tmp_path, monkeypatch):
    """``kernels.ahead`` races decoding's prefetch distance on the first passes of a model's released blocks, after the
    pair is loaded and described: the report's title (written after the runs) names what was raced, never "the
    build's default, untimed", and a prefetch section gives the race's samples (the REPL's ``Prefetch:`` line)."""
    import re

    from kernels import ahead

    monkeypatch.setattr(ahead, "_CHOSEN", {})  # this process races again: the label is made before the race
    out = tmp_path / "results"
    bench.main(["--target", tiny_models["target"], "--device", "cpu", "--dtype", "bfloat16", "--limit", "1", "--categories", "qa",
                "--strategies", "target", "--max-new-tokens", "4", "--out", str(out), "--no-calibrate"])
    report = (out / "results.md").read_text()
    title = report.split("\n")[0]
    assert ahead.raced() and "untimed" not in title, title
    assert re.search(r"weights (prefetched \d+ KB ahead|streamed without software prefetch|prefetched \d+ KB ahead into L2 on the few-row loop) by measurement", title), title
    assert f"Prefetch: {ahead.raced()}" in report
