"""Every ratio the benchmark reports comes with its bootstrap interval over prompts and repeats."""
import csv
import json
import random

import pytest

import bench


def runs(times: dict, prompts: int, repeats: int, noise: float, seed: int = 0, tokens: int = 100) -> list:
    """Records of ``prompts`` questions x ``repeats`` for each config -> seconds per run, each run's time
    scaled by a seeded factor within +-``noise``."""
    rng = random.Random(seed)
    out = []
    for question in range(prompts):
        for repeat in range(repeats):
            for config, seconds in times.items():
                out.append({"question_id": question, "turn": 0, "category": "qa", "config": config, "key": config, "gamma": 4,
                            "repeat": repeat, "new_tokens": tokens, "seconds": seconds * (1 + rng.uniform(-noise, noise)),
                            "drafted": 0, "accepted": 0, "target_passes": tokens, "diverged_at": None,
                            "drafted_at": [], "accepted_at": []})
    return out


def row(records: list, config: str = "ngram", category: str = "all") -> dict:
    return next(r for r in bench.summarize(records) if r["config"] == config and r["category"] == category)


def test_speedup_interval_is_deterministic_and_contains_the_point_estimate():
    records = runs({"target": 2.0, "ngram": 1.0}, prompts=8, repeats=3, noise=0.3)
    first, again = row(records), row([dict(r) for r in records])
    assert (first["speedup_low"], first["speedup_high"]) == (again["speedup_low"], again["speedup_high"])
    assert first["speedup_low"] < first["speedup"] < first["speedup_high"]
    assert bench.ratio_cell(first["speedup"], (first["speedup_low"], first["speedup_high"])).endswith("]")  # no "~": 2x apart


def test_interval_narrows_with_more_consistent_data():
    times = {"target": 2.0, "ngram": 1.0}
    noisy, steady = row(runs(times, 8, 2, noise=0.4)), row(runs(times, 8, 2, noise=0.05))
    assert steady["speedup_high"] - steady["speedup_low"] < (noisy["speedup_high"] - noisy["speedup_low"]) / 3


def test_a_ratio_whose_interval_includes_one_is_marked_as_no_measurable_difference(tmp_path):
    records = runs({"target": 1.0, "ngram": 1.0, "hf_generate": 1.0}, prompts=6, repeats=2, noise=0.2)
    ngram = row(records)
    assert ngram["speedup_low"] < 1.0 < ngram["speedup_high"]
    assert bench.speedup_cell(ngram).endswith(f"] {bench.NO_DIFFERENCE}")
    assert bench.ratio_cell(1.52, (1.40, 1.66)) == "1.52x [1.40-1.66]"
    assert bench.ratio_cell(1.02, (0.97, 1.08)) == "1.02x [0.97-1.08] ~"
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    bench.main(["--from-runs", str(tmp_path / "runs.jsonl"), "--out", str(tmp_path / "out")])
    report = (tmp_path / "out" / "results.md").read_text()
    assert "no measurable difference" in report
    assert f"| ngram | {bench.speedup_cell(ngram)} |" in report  # the by-category matrix
    assert "| target | 1.00x |" in report  # the baseline against itself: no interval
    summary = {r["config"]: r for r in csv.DictReader((tmp_path / "out" / "summary.csv").open()) if r["category"] == "all"}
    assert float(summary["ngram"]["speedup_low"]) == pytest.approx(ngram["speedup_low"])
    assert float(summary["ngram"]["vs_hf_generate_low"]) < 1.0 < float(summary["ngram"]["vs_hf_generate_high"])
    assert (tmp_path / "out" / "speedup_by_category.png").stat().st_size > 0  # drawn with its error bars


def test_one_prompt_and_one_repeat_say_n_1_rather_than_an_interval(tmp_path):
    ngram = row(runs({"target": 2.0, "ngram": 1.0}, prompts=1, repeats=1, noise=0.0))
    assert ngram["speedup"] == pytest.approx(2.0) and ngram["speedup_low"] is None and ngram["speedup_high"] is None
    assert bench.speedup_cell(ngram) == "2.00x (n=1)"
    assert bench.ratio_interval({("a", 0): [100, 1.0]}, {("a", 0): [100, 2.0]}) is None
    # one prompt, several repeats: the repeats alone are resampled
    assert row(runs({"target": 2.0, "ngram": 1.0}, prompts=1, repeats=3, noise=0.2))["speedup_low"] is not None
