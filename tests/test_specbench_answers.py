"""Spec-Bench's answer files, read back as its evaluation/speed.py and equal.py read them, and the
shipped code-editing prompts."""
import json
import random

import numpy as np
import pytest
from transformers import AutoTokenizer

import bench
from utils.models import embedded_model_dir
from utils.specbench import file_name, speed_py_tokens, write_answers


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
            # every row, transformers' assisted path included (its steps observed): speed.py's mean is no NaN
            assert choice["accept_lengths"] and sum(choice["accept_lengths"]) == sum(choice["new_tokens"])
            assert len(choice["accept_lengths"]) == sum(choice["decoding_steps"])
            if label == "target":
                assert set(choice["accept_lengths"]) == {1}
    # equal.py: str(turns) per line, compared line by line with the baseline's (greedy: equal)
    baseline = [str(r["choices"][0]["turns"]) for r in read_jsonl(answers / "target.jsonl")]
    for label in labels:
        assert [str(r["choices"][0]["turns"]) for r in read_jsonl(answers / file_name(label))] == baseline, label


def speed_py(method_file, base_file, tokenizer, task="overall"):
    """hemingkx/Spec-Bench evaluation/speed.py, ``speed()``, as it computes (file reading kept, printing
    left out): the method's tokens/s per question from its ``new_tokens`` and ``wall_time``, the
    baseline's from its ``turns`` re-tokenized (``len(tokenizer(i).input_ids) - 1`` per turn), each
    averaged over the questions; the speedup is the ratio of the two means."""
    def rows(path):
        data = read_jsonl(path)
        return data if task == "overall" else [d for d in data if d["category"] == task]

    speeds, accept_lengths_list = [], []
    for datapoint in rows(method_file):
        tokens = sum(datapoint["choices"][0]["new_tokens"])
        times = sum(datapoint["choices"][0]["wall_time"])
        accept_lengths_list.extend(datapoint["choices"][0]["accept_lengths"])
        speeds.append(tokens / times)
    speeds0 = []
    for datapoint in rows(base_file):
        tokens = sum(len(tokenizer(i).input_ids) - 1 for i in datapoint["choices"][0]["turns"])
        speeds0.append(tokens / sum(datapoint["choices"][0]["wall_time"]))
    return np.array(speeds).mean() / np.array(speeds0).mean(), np.mean(accept_lengths_list)


def answer_records(tokenizer):
    """Runs of target AR and two drafting rows on 6 questions of ~300 tokens of real text each (a
    trained model's output re-tokenizes to itself; a random tiny model's does not), ending with EOS,
    as the benchmark records them; each row at its own steady rate, 1% seeded jitter."""
    texts = [t for row in bench.load_prompts(str(bench.DEFAULT_PROMPTS), None, None) for t in row["turns"]]
    rng, records = random.Random(0), []
    rates = {"target": 50.0, "ngram[basic n=3 k=3 g=4]": 80.0, "hf_assisted[g=4 constant]": 65.0}
    for question in range(6):
        text = " ".join(texts[(question + i) % len(texts)] for i in range(4))
        tokens = tokenizer(text).input_ids + [tokenizer.eos_token_id]
        assert tokenizer(tokenizer.decode(tokens)).input_ids == tokens  # the precondition stated above
        for label, rate in rates.items():
            config = bench.Config.of({"key": label.split("[")[0], "gamma": 4})
            steps = [1] * len(tokens) if config.strategy.baseline else [3, 1] * (len(tokens) // 4) + [1] * (len(tokens) % 4)
            records.append({"question_id": question, "category": "qa", "turn": 0, "repeat": 0, "config": label,
                            "key": config.key, "gamma": config.gamma, "n": 3, "storage": "basic", "filler": 3,
                            "new_tokens": len(tokens), "seconds": len(tokens) / rate * (1 + rng.uniform(-0.01, 0.01)),
                            "tokens": tokens, "steps": steps, "text": tokenizer.decode(tokens, skip_special_tokens=True),
                            "drafted": 0, "accepted": 0, "target_passes": len(steps), "diverged_at": None})
    return records


def test_spec_bench_speed_py_gets_our_speedup_from_our_answer_files(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    records = answer_records(tokenizer)
    write_answers(records, tmp_path, "tiny", tokenizer)
    ours = {r["config"]: r["speedup"] for r in bench.summarize(records) if r["category"] == "all"}
    for label in ("ngram[basic n=3 k=3 g=4]", "hf_assisted[g=4 constant]"):
        speedup, accept = speed_py(tmp_path / file_name(label), tmp_path / "target.jsonl", tokenizer)
        assert speedup == pytest.approx(ours[label], rel=0.01), label
        assert accept == pytest.approx(2.0, abs=0.05)  # the steps written, never NaN


def test_speed_py_counts_every_generated_token_of_the_baseline_but_the_bos_it_assumes(tmp_path):
    """Decoded with its special tokens, the baseline's text re-tokenizes to the tokens generated, EOS
    included; speed.py's -1 (for a BOS this tokenizer does not add) is the one token it misses per turn."""
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    assert tokenizer("a").input_ids[0] != tokenizer.bos_token_id  # SmolLM2's adds no BOS
    records = answer_records(tokenizer)
    write_answers(records, tmp_path, "tiny", tokenizer)
    for row in read_jsonl(tmp_path / "target.jsonl"):
        choice = row["choices"][0]
        assert [speed_py_tokens(tokenizer, t) for t in choice["turns"]] == [n - 1 for n in choice["new_tokens"]]
    skipped = {r["question_id"]: speed_py_tokens(tokenizer, r["text"]) for r in records if r["config"] == "target"}
    assert all(skipped[r["question_id"]] == r["new_tokens"] - 2 for r in records if r["config"] == "target")  # EOS lost too
