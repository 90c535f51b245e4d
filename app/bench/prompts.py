"""The benchmark's prompts: Spec-Bench-format JSONL files, read and filtered, and the default group of categories."""
import json
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]  # the repository
DEFAULT_PROMPTS = ROOT / "bench_prompts.jsonl"
CODE_EDITING = ROOT / "prompts" / "code_editing.jsonl"  # rename, document, refactor, fix: the whole code returned

DEFAULT_GROUP = ("input-grounded", ("summarization", "rag", "coding", "extraction", "code_editing"))


def load_prompts(paths: str | List[str], categories: Optional[str], limit: Optional[int]) -> List[dict]:
    rows, seen = [], defaultdict(int)
    wanted = set(categories.split(",")) if categories else None
    for path in [paths] if isinstance(paths, str) else paths:
        rows += _read_prompts(path, wanted, limit, seen)
    if not rows:
        raise SystemExit("error: no prompt left after --categories/--limit")
    return rows


def _read_prompts(path: str, wanted: Optional[set], limit: Optional[int], seen: Dict[str, int]) -> List[dict]:
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                turns, category = row["turns"], row.get("category", "all")
                assert isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns)
            except (ValueError, KeyError, AssertionError):
                raise SystemExit(f"error: {path}:{number} is not a Spec-Bench row (question_id, category, turns)")
            if wanted and category not in wanted:
                continue
            if limit and seen[category] >= limit:
                continue
            seen[category] += 1
            rows.append({"question_id": row.get("question_id", number), "category": category, "turns": turns})
    return rows
