"""The benchmark's runs as Spec-Bench model answers (hemingkx/Spec-Bench), one JSONL file per
configuration, so that its ``evaluation/speed.py`` and ``evaluation/equal.py`` read our runs
beside published ones.

Per question, as Spec-Bench's ``evaluation/eval.py`` writes them: ``question_id``, ``category``,
``model_id``, ``tstamp`` and ``choices[0]`` = ``{"index": 0, "turns": [text per turn],
"decoding_steps": [int per turn], "new_tokens": [int per turn], "wall_time": [seconds per turn],
"accept_lengths": [tokens emitted by each step, all turns in a row]}``.

Spec-Bench's ``evaluation/speed.py`` takes a method's tokens from ``new_tokens`` but re-tokenizes the
*baseline's* ``turns`` text, counting ``len(tokenizer(text).input_ids) - 1`` tokens per turn (the -1
for the BOS token a LLaMA tokenizer adds). So that it counts the tokens we generated, each turn's
text is decoded with its special tokens (the EOS the model emitted is a token it generated and we
counted). Two differences remain, both in speed.py's count of the baseline, never in ours:

- a tokenizer that adds no BOS (SmolLM2, Qwen2.5) makes that -1 remove a generated token: speed.py
  counts one token fewer per turn (0.8% of a 128-token answer), which no text can undo without
  writing a token the model did not generate;
- text re-tokenizes to the generated tokens only when they are the tokenizer's own segmentation of
  it, as a trained model's greedy output nearly always is (a random model's is not).

``speed_py_tokens`` counts as speed.py does, to measure both. Every drafting row, transformers'
assisted and prompt-lookup paths included (their steps observed: ``strategies._observed_steps``),
writes ``accept_lengths``: the tokens each target pass emitted.
"""
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Dict, List

# transformers' plain generate: one target pass per token (its assisted paths record their steps)
ONE_TOKEN_A_STEP = ("hf_generate", "hf_generate_static")


def file_name(label: str) -> str:
    """A configuration's label as a file name: ``ngram[basic n=3 k=3 g=4]`` -> ``ngram-basic-n=3-k=3-g=4.jsonl``."""
    return re.sub(r"[^A-Za-z0-9._=+-]+", "-", label).strip("-") + ".jsonl"


def _steps(record: dict) -> List[int]:
    steps = record.get("steps") or []
    if not steps and record.get("key") in ONE_TOKEN_A_STEP:
        steps = [1] * record["new_tokens"]
    return [int(s) for s in steps]


def speed_py_tokens(tokenizer, text: str) -> int:
    """The tokens Spec-Bench's evaluation/speed.py counts in a baseline turn's text."""
    return len(tokenizer(text).input_ids) - 1


def turn_text(record: dict, tokenizer=None) -> str:
    """A turn's answer: its tokens decoded with their special tokens (with ``tokenizer``), else the record's text."""
    if tokenizer is None or "tokens" not in record:
        return record.get("text", "")
    return tokenizer.decode(record["tokens"], skip_special_tokens=False)


def baseline_count_check(records: List[dict], tokenizer, baseline: str = "target", repeat: int = 0) -> str:
    """One line: the tokens speed.py will count in the baseline's answers against the tokens generated."""
    runs = [r for r in records if r["config"] == baseline and r["repeat"] == repeat]
    ours = sum(r["new_tokens"] for r in runs)
    theirs = sum(speed_py_tokens(tokenizer, turn_text(r, tokenizer)) for r in runs)
    return (f"Spec-Bench speed.py will count {theirs} tokens in the baseline's answers, {ours} generated "
            f"({(theirs - ours) / max(ours, 1):+.2%}" + ("; the tokenizer adds no BOS, speed.py's -1 per turn" if not tokenizer("a").input_ids
                                                   or tokenizer("a").input_ids[0] != tokenizer.bos_token_id else "") + ")")


def answers(records: List[dict], model_id: str, repeat: int = 0, tokenizer=None) -> Dict[str, List[dict]]:
    """Per configuration label, the Spec-Bench answer of each question (in the order the questions
    were run), from the records of one repeat; the turns decoded with ``tokenizer`` (``turn_text``)."""
    by_config: Dict[str, Dict[object, List[dict]]] = {}
    for record in records:
        if record["repeat"] == repeat:
            by_config.setdefault(record["config"], {}).setdefault(record["question_id"], []).append(record)
    out = {}
    for label, questions in by_config.items():
        rows = []
        for question_id, turns in questions.items():
            turns = sorted(turns, key=lambda r: r["turn"])
            steps = [_steps(r) for r in turns]
            rows.append({
                "question_id": question_id, "category": turns[0]["category"], "model_id": f"{model_id}-{label}",
                "choices": [{
                    "index": 0,
                    "turns": [turn_text(r, tokenizer) for r in turns],
                    "decoding_steps": [len(s) for s in steps],
                    "new_tokens": [int(r["new_tokens"]) for r in turns],
                    "wall_time": [float(r["seconds"]) for r in turns],
                    "accept_lengths": [n for s in steps for n in s],
                }],
                "tstamp": time.time(),
            })
        out[label] = rows
    return out


def write_answers(records: List[dict], folder: Path, model_id: str, tokenizer=None) -> List[Path]:
    """One Spec-Bench answer file per configuration under ``folder`` (each written atomically), from
    the first repeat; the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for label, rows in answers(records, model_id, tokenizer=tokenizer).items():
        path = folder / file_name(label)
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".partial")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        written.append(path)
    return written
