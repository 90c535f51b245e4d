"""Training data for a head, drawn from the target itself: questions the instruct model writes from
its chat template's user turn (started with an opener of ours, so that they spread over kinds of
task), its own greedy answers to them, and the target's features and distributions over those
answers. Nothing is read from an evaluation set, and ``overlapping`` drops any question that shares
a run of words with one (Spec-Bench, the project's benchmark prompts).

The data is written a chunk at a time (``write_chunk``) into the artifact of ``eagle.artifact``, which
keeps it with the head, so a stopped run resumes at the chunk it was writing.
"""
import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch.nn import Module

from eagle.artifact import DataError, DataRecipe

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
    """Whether a text shares a run of ``n`` words with any of the evaluation texts. ``record``: what the
    ban ran against (``evaluation_sets``), kept with every chunk it checked."""

    def __init__(self, texts: Iterable[str], n: int = 8, record: Optional[dict] = None):
        self.n = n
        self.record = record if record is not None else {"checked": "texts given by the caller"}
        self.seen: set = set()
        for text in texts:
            self.seen |= _shingles(text, n)

    def __call__(self, text: str) -> bool:
        return not self.seen.isdisjoint(_shingles(text, self.n))


def evaluation_texts(paths: Sequence[Path]) -> List[str]:
    """Every turn of every prompt in the JSONL files ``paths`` that exist (Spec-Bench's format)."""
    return evaluation_sets(paths)[0]


def evaluation_sets(paths: Sequence[Path]) -> Tuple[List[str], dict]:
    """Every turn of the JSONL files ``paths`` (Spec-Bench's format), and the record of what was read:
    ``{"checked": {file name: {"sha256", "turns"}}, "missing": [paths not found]}``. A missing set is
    named, never skipped without a word: the questions were not checked against it."""
    texts: List[str] = []
    record: dict = {"checked": {}, "missing": []}
    for path in map(Path, paths):
        if not path.is_file():
            record["missing"].append(str(path))
            continue
        data = path.read_bytes()
        turns = [t for line in data.decode().splitlines() if line.strip() for t in json.loads(line).get("turns", [])]
        texts.extend(turns)
        record["checked"][path.name] = {"sha256": hashlib.sha256(data).hexdigest(), "turns": len(turns)}
    return texts, record


def _seed(*parts: int) -> int:
    """A seed derived from ``parts`` (the same on every machine and Python)."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:6], "big")


def _device(model: Module) -> torch.device:
    return next(model.parameters()).device


QUESTION_BATCH = 32  # openers continued in one batched generation
FRUITLESS = 20  # batches in a row without a usable question before writing gives up


@dataclass(frozen=True)
class ChunkWriter:
    """How chunks are written: the data recipe, the overlap check, the end tokens, the answers' batch,
    and the answers' writer: ``ours`` (``eagle.writer``, its decoding pass compiled when ``compile``)
    or ``transformers`` (``generate`` in left-padded batches)."""

    recipe: DataRecipe
    overlap: Overlap
    stop: Tuple[int, ...]
    batch: int = 16
    writer: str = "ours"
    compile: bool = False


def write_chunk(model: Module, tokenizer, index: int, seen: set, how: ChunkWriter) -> Tuple[list, dict]:
    """Chunk ``index``: ``recipe.chunk_questions`` questions (prompt ids not in ``seen``) and the model's
    greedy answers, as ``[(prompt ids, answer ids)]``, and its facts (questions dropped for overlap,
    the device and dtype). Each question is an opener of ours continued by the model, sampled from
    seeds derived from (recipe seed, ``index``, attempt), so a chunk does not depend on which process
    writes it or where a writer stopped (on the same kind of device and dtype)."""
    recipe, stop = how.recipe, list(how.stop)
    prefix = user_turn_prefix(tokenizer)
    rng = random.Random(_seed(recipe.seed, index))
    prompts: List[List[int]] = []
    taken, dropped, attempt, fruitless = set(seen), 0, 0, 0
    while len(prompts) < recipe.chunk_questions:
        torch.manual_seed(_seed(recipe.seed, index, attempt))
        attempt += 1
        openers = [rng.choice(OPENERS) for _ in range(QUESTION_BATCH)]
        begun = [tokenizer(prefix + o, add_special_tokens=False).input_ids for o in openers]
        made = _generate(model, begun, recipe.question_tokens, (recipe.temperature, recipe.top_p), stop)
        before = len(prompts)
        for opener, ids in zip(openers, made):
            if not ids or ids[-1] not in stop:
                continue  # ran past the question's length: not a question
            question = (opener + tokenizer.decode(ids[:-1])).strip()
            if len(question.split()) < 5:
                continue
            if how.overlap(question):
                dropped += 1
                continue
            text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
            prompt = tuple(tokenizer(text, add_special_tokens=False).input_ids)
            if prompt not in taken and len(prompts) < recipe.chunk_questions:
                taken.add(prompt)
                prompts.append(list(prompt))
        fruitless = 0 if len(prompts) > before else fruitless + 1
        if fruitless >= FRUITLESS:
            raise DataError(f"the target wrote no usable question in {FRUITLESS} batches of {QUESTION_BATCH} "
                            f"(each must end within {recipe.question_tokens} tokens and have 5 words)")
    if how.writer == "ours":
        from eagle.writer import write_answers

        rows = list(zip(prompts, write_answers(model, prompts, recipe.answer_tokens, stop, how.batch, how.compile)))
    else:
        rows = [row for group in _batches(prompts, how.batch)
                for row in zip(group, _generate(model, group, recipe.answer_tokens, None, stop))]
    weight = next(model.parameters())
    return rows, {"dropped_for_overlap": dropped, "written_on": f"{weight.device.type} {str(weight.dtype).removeprefix('torch.')}",
                  "answers_by": how.writer, "overlap_ban": how.overlap.record}


@torch.no_grad()
def _generate(model: Module, prompts: List[List[int]], max_new: int, sample: Optional[Tuple[float, float]],
              stop: List[int]) -> List[List[int]]:
    """New token ids for each of ``prompts`` (ids; one left-padded batch on the model's device), cut
    after the first stop token; ``sample``: ``(temperature, top_p)``, else greedy."""
    width = max(len(p) for p in prompts)
    pad = stop[0]  # under the attention mask: any id does
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=_device(model))
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=_device(model))
    kwargs = dict(do_sample=True, temperature=sample[0], top_p=sample[1]) if sample else dict(do_sample=False)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, eos_token_id=stop, pad_token_id=pad, **kwargs)
    cut = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in stop), len(row))
        cut.append(row[:end])
    return cut


def _batches(items: Sequence, size: int) -> Iterator[Sequence]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def draft_vocabulary(rows: Sequence[dict], size: int, always: Sequence[int], vocab: int) -> torch.Tensor:
    """The ``size`` target ids most frequent in the answers (``always`` first: end tokens), ascending
    id order after the choice; pads with the lowest unused ids when the data has fewer distinct tokens."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for row in rows:
        answer = torch.as_tensor(row["ids"][row["prompt_length"] :], dtype=torch.long)
        counts.index_add_(0, answer, torch.ones(len(answer), dtype=torch.long))
    counts[torch.tensor(list(always), dtype=torch.long)] = counts.max() + 1
    chosen = torch.argsort(counts, descending=True, stable=True)[: min(size, vocab)]
    return chosen.sort().values
