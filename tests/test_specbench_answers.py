"""Spec-Bench's answer files, read back as its evaluation/speed.py and equal.py read them, and the
shipped code-editing prompts."""
import json

import bench
from utils.specbench import file_name


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_code_editing_prompts_are_shipped_in_spec_bench_format():
    rows = bench.load_prompts([str(bench.CODE_EDITING)], None, None)
    assert len(rows) >= 10 and {r["category"] for r in rows} == {"code_editing"}
    assert len({r["question_id"] for r in rows}) == len(rows)
    assert all("return the whole" in r["turns"][0].lower() for r in rows)
    both = bench.load_prompts([str(bench.DEFAULT_PROMPTS), str(bench.CODE_EDITING)], "code_editing,qa", 1)
    assert [r["category"] for r in both] == ["qa", "code_editing"]


def test_answers_are_written_per_configuration_with_spec_bench_fields(tiny_models, tmp_path):
    answers = tmp_path / "answers"
    bench.main(["--target", tiny_models["target"], "--drafter", tiny_models["drafter"], "--device", "cpu",
                "--prompts", str(bench.DEFAULT_PROMPTS), str(bench.CODE_EDITING), "--categories", "writing,code_editing",
                "--limit", "1", "--strategies", "target,speculative,ngram,hf_generate,hf_assisted", "--storages", "basic",
                "--max-new-tokens", "6", "--out", str(tmp_path / "results"), "--specbench-out", str(answers)])
    records = read_jsonl(tmp_path / "results" / "runs.jsonl")
    labels = {r["config"] for r in records}
    assert sorted(p.name for p in answers.iterdir()) == sorted(file_name(label) for label in labels)
    for label in labels:
        rows = read_jsonl(answers / file_name(label))
        assert [(r["question_id"], r["category"]) for r in rows] == [(10, "writing"), (2001, "code_editing")]
        for row in rows:
            assert isinstance(row["model_id"], str) and isinstance(row["tstamp"], float)
            choice = row["choices"][0]
            assert choice["index"] == 0
            turns = 2 if row["category"] == "writing" else 1
            assert [len(choice[k]) for k in ("turns", "new_tokens", "wall_time", "decoding_steps")] == [turns] * 4
            assert all(isinstance(t, str) and t for t in choice["turns"])
            assert all(isinstance(n, int) for n in choice["new_tokens"] + choice["decoding_steps"] + choice["accept_lengths"])
            assert all(isinstance(t, float) and t > 0 for t in choice["wall_time"])
            # speed.py: tokens / time per question, and the mean of every step's accept length
            assert sum(choice["new_tokens"]) / sum(choice["wall_time"]) > 0
            if not label.startswith("hf_assisted"):  # transformers' assisted path does not report its steps
                assert sum(choice["accept_lengths"]) == sum(choice["new_tokens"])
                assert len(choice["accept_lengths"]) == sum(choice["decoding_steps"])
            if label == "target":
                assert set(choice["accept_lengths"]) == {1}
    # equal.py: str(turns) per line, compared line by line with the baseline's (greedy: equal)
    baseline = [str(r["choices"][0]["turns"]) for r in read_jsonl(answers / "target.jsonl")]
    for label in labels:
        assert [str(r["choices"][0]["turns"]) for r in read_jsonl(answers / file_name(label))] == baseline, label
