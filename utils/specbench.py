"""The benchmark's runs as Spec-Bench model answers (hemingkx/Spec-Bench), one JSONL file per
configuration, so that its ``evaluation/speed.py`` and ``evaluation/equal.py`` read our runs
beside published ones.

Per question, as Spec-Bench's ``evaluation/eval.py`` writes them: ``question_id``, ``category``,
``model_id``, ``tstamp`` and ``choices[0]`` = ``{"index": 0, "turns": [text per turn],
"decoding_steps": [int per turn], "new_tokens": [int per turn], "wall_time": [seconds per turn],
"accept_lengths": [tokens emitted by each step, all turns in a row]}``.
"""
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Dict, List

# transformers' assisted paths do not report their steps: decoding_steps 0, accept_lengths empty
ONE_TOKEN_A_STEP = ("hf_generate", "hf_generate_static")


def file_name(label: str) -> str:
    """A configuration's label as a file name: ``ngram[basic n=3 k=3 g=4]`` -> ``ngram-basic-n=3-k=3-g=4.jsonl``."""
    return re.sub(r"[^A-Za-z0-9._=+-]+", "-", label).strip("-") + ".jsonl"


def _steps(record: dict) -> List[int]:
    steps = record.get("steps") or []
    if not steps and record.get("key") in ONE_TOKEN_A_STEP:
        steps = [1] * record["new_tokens"]
    return [int(s) for s in steps]


def answers(records: List[dict], model_id: str, repeat: int = 0) -> Dict[str, List[dict]]:
    """Per configuration label, the Spec-Bench answer of each question (in the order the questions
    were run), from the records of one repeat."""
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
                    "turns": [r.get("text", "") for r in turns],
                    "decoding_steps": [len(s) for s in steps],
                    "new_tokens": [int(r["new_tokens"]) for r in turns],
                    "wall_time": [float(r["seconds"]) for r in turns],
                    "accept_lengths": [n for s in steps for n in s],
                }],
                "tstamp": time.time(),
            })
        out[label] = rows
    return out


def write_answers(records: List[dict], folder: Path, model_id: str) -> List[Path]:
    """One Spec-Bench answer file per configuration under ``folder`` (each written atomically), from
    the first repeat; the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for label, rows in answers(records, model_id).items():
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
