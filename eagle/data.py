"""Training data for a head, drawn from the target itself: questions the instruct model writes from
its chat template's user turn (started with an opener of ours, so that they spread over kinds of
task), its own greedy answers to them, and the target's features and distributions over those
answers. Nothing is read from an evaluation set, and ``overlapping`` drops any question that shares
a run of words with one (Spec-Bench, the project's benchmark prompts).

Every stage appends to a JSONL file as it goes, so a stopped run resumes where it stopped.
"""
import json
import random
import re
from pathlib import Path
from typing import Iterable, Iterator, List, Sequence

import torch
from torch.nn import Module

# how a user turn starts: ours, spread over writing, roleplay, reasoning, math, coding, science,
# humanities and plain questions (the categories a head must serve), never taken from an evaluation set
OPENERS = (
    "Write a short story about", "Write a poem about", "Write an email to", "Write a blog post about",
    "Draft a letter", "Compose a speech for", "Write a product description for", "Write a dialogue between",
    "Pretend you are", "Act as", "Imagine you are", "You are a", "Role-play as",
    "Explain why", "Why does", "What would happen if", "If all", "Which is more likely", "Is it true that",
    "Solve", "Calculate", "What is the sum of", "How many", "A train travels", "Find the value of", "Prove that",
    "Write a Python function", "Write a function in JavaScript", "How do I", "Fix this code:", "Write a SQL query",
    "Implement", "What does this code do:", "Write a shell script",
    "Explain how", "What is the difference between", "How does", "Describe the process of", "What causes",
    "Summarize the history of", "Who was", "What were the causes of", "Discuss", "Compare", "What is the meaning of",
    "What is", "Where is", "When did", "Give me a list of", "Tell me about", "What are the benefits of",
    "Give me tips for", "Plan a", "Suggest", "Translate", "Rewrite this sentence:",
)


def user_turn_prefix(tokenizer) -> str:
    """The chat template's text up to where the user's words start."""
    marker = "\u2063MARK\u2063"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False, add_generation_prompt=False)
    return text[: text.index(marker)]


def _shingles(text: str, n: int) -> set:
    words = re.findall(r"\w+", text.lower())
    return {" ".join(words[i : i + n]) for i in range(max(0, len(words) - n + 1))}


class Overlap:
    """Whether a text shares a run of ``n`` words with any of the evaluation texts."""

    def __init__(self, texts: Iterable[str], n: int = 8):
        self.n = n
        self.seen: set = set()
        for text in texts:
            self.seen |= _shingles(text, n)

    def __call__(self, text: str) -> bool:
        return not self.seen.isdisjoint(_shingles(text, self.n))


def evaluation_texts(paths: Sequence[Path]) -> List[str]:
    """Every turn of every prompt in the JSONL files ``paths`` that exist (Spec-Bench's format)."""
    texts = []
    for path in paths:
        if Path(path).is_file():
            for line in Path(path).read_text().splitlines():
                if line.strip():
                    texts.extend(json.loads(line).get("turns", []))
    return texts


def read_jsonl(path: Path) -> List[dict]:
    """The complete lines of ``path`` (a line cut by a stop is dropped)."""
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return rows


def _append(path: Path, rows: Iterable[dict]) -> None:
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        f.flush()


def _batches(items: Sequence, size: int) -> Iterator[Sequence]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


@torch.no_grad()
def _generate(model: Module, tokenizer, texts: List[str], max_new: int, sample: bool, stop: List[int]) -> List[List[int]]:
    """New token ids for each of ``texts`` (left-padded batch), cut after the first stop token."""
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    kwargs = dict(do_sample=True, temperature=0.9, top_p=0.95) if sample else dict(do_sample=False)
    out = model.generate(**batch, max_new_tokens=max_new, eos_token_id=stop, pad_token_id=tokenizer.pad_token_id, **kwargs)
    new = out[:, batch.input_ids.shape[1] :].tolist()
    cut = []
    for row in new:
        end = next((i + 1 for i, t in enumerate(row) if t in stop), len(row))
        cut.append(row[:end])
    return cut


QUESTION_BATCH = 32  # openers continued in one batched generation


def write_questions(model: Module, tokenizer, path: Path, count: int, overlap: Overlap, stop: List[int],
                    seed: int = 0, progress=None) -> int:
    """Append questions to ``path`` until it holds ``count``; returns how many were dropped for
    overlapping an evaluation set. Each is an opener of ours continued by the model, sampled."""
    rows = read_jsonl(path)
    seen = {r["question"] for r in rows}
    dropped = 0
    prefix = user_turn_prefix(tokenizer)
    rng = random.Random(seed + len(rows))
    while len(rows) < count:
        torch.manual_seed(seed + len(rows))
        openers = [rng.choice(OPENERS) for _ in range(QUESTION_BATCH)]
        made = _generate(model, tokenizer, [prefix + o for o in openers], 64, True, stop)
        new = []
        for opener, ids in zip(openers, made):
            if not ids or ids[-1] not in stop:
                continue  # ran past 64 tokens: not a question
            question = (opener + tokenizer.decode(ids[:-1])).strip()
            if len(question.split()) < 5 or question in seen:
                continue
            if overlap(question):
                dropped += 1
                continue
            seen.add(question)
            new.append({"question": question})
        new = new[: count - len(rows)]
        _append(path, new)
        rows += new
        if progress is not None:
            progress.update(len(new))
    return dropped


def write_answers(model: Module, tokenizer, questions: Path, path: Path, max_new: int, stop: List[int],
                  batch: int = 16, progress=None) -> None:
    """Append the model's greedy answer to every question not yet answered in ``path``: the prompt
    rendered by the chat template and the answer, as token ids (``ids``, ``prompt_length``)."""
    asked = [r["question"] for r in read_jsonl(questions)]
    done = len(read_jsonl(path))
    todo = asked[done:]
    for group in _batches(todo, batch):
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
                   for q in group]
        answers = _generate(model, tokenizer, prompts, max_new, False, stop)
        rows = []
        for q, prompt, answer in zip(group, prompts, answers):
            ids = tokenizer(prompt, add_special_tokens=False).input_ids
            rows.append({"question": q, "ids": ids + answer, "prompt_length": len(ids)})
        _append(path, rows)
        if progress is not None:
            progress.update(sum(len(r["ids"]) - r["prompt_length"] for r in rows))


def draft_vocabulary(rows: Sequence[dict], size: int, always: Sequence[int], vocab: int) -> torch.Tensor:
    """The ``size`` target ids most frequent in the answers (``always`` first: end tokens), ascending
    id order after the choice; pads with the lowest unused ids when the data has fewer distinct tokens."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for row in rows:
        counts.index_add_(0, torch.tensor(row["ids"][row["prompt_length"] :]), torch.ones(len(row["ids"]) - row["prompt_length"], dtype=torch.long))
    counts[torch.tensor(list(always), dtype=torch.long)] = counts.max() + 1
    chosen = torch.argsort(counts, descending=True, stable=True)[: min(size, vocab)]
    return chosen.sort().values
