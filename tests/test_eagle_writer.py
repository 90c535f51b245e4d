"""Our answer writer (``eagle.writer``) on tiny float32 llamas: every row's greedy answer equals
transformers' greedy ``generate`` on its prompt alone, rows that end early and rows refilled with
new questions included, and a data chunk written with it equals, byte for byte, the chunk written
with transformers' ``generate``."""
import random

import pytest
import torch

from conftest import gpt2, llama
from eagle import writer as eagle_writer
from eagle.writer import Writer, supported, write_answers
from test_eagle_data import TINY, chunk_digests, tiny  # noqa: F401 (tiny: the module's target fixture)

STOP = list(range(40, 60))  # 20 end tokens of 300: answers end after ~15 tokens, some at the first, some run to the budget


def varied_llama(seed: int):
    """A tiny float32 llama whose greedy answers wander over the vocabulary (no repeating loop)."""
    return llama(vocab=300, layers=3, seed=seed, init=0.2).float()


def alone(model, prompt, max_new):
    """transformers' greedy answer to ``prompt`` alone, cut after its first end token."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, eos_token_id=STOP,
                         pad_token_id=STOP[0])[0, len(prompt):].tolist()
    return out[: next((i + 1 for i, t in enumerate(out) if t in STOP), len(out))]


@pytest.mark.parametrize("seed", [5, 11])
def test_every_row_equals_generate_alone_with_rows_ending_early_and_rows_refilled(seed, monkeypatch):
    model, rng, max_new = varied_llama(seed), random.Random(seed), 24
    prompts = [[rng.randrange(60, 300) for _ in range(rng.randrange(2, 30))] for _ in range(15)]
    filled = []
    prefill = Writer._prefill

    def record(self, rows, batch):
        filled.append(list(rows))
        return prefill(self, rows, batch)

    monkeypatch.setattr(Writer, "_prefill", record)
    answers = write_answers(model, prompts, max_new, STOP, batch=4)
    assert answers == [alone(model, p, max_new) for p in prompts]
    assert len(filled) > 1 and sum(map(len, filled)) == len(prompts)  # rows were refilled with new questions
    lengths = [len(a) for a in answers]
    assert max_new in lengths and any(1 < n < max_new for n in lengths)  # budget-cut rows and rows that ended early


def test_refilling_at_a_quarter_or_at_once_one_row_or_a_writer_used_again_give_the_same_answers(monkeypatch):
    model, rng = varied_llama(3), random.Random(3)
    prompts = [[rng.randrange(60, 300) for _ in range(rng.randrange(2, 30))] for _ in range(12)]
    quarter = write_answers(model, prompts, 20, STOP, batch=8)
    monkeypatch.setattr(eagle_writer, "REFILL", 10**6)  # refill as soon as one row is free
    assert write_answers(model, prompts, 20, STOP, batch=8) == quarter
    assert write_answers(model, prompts, 20, STOP, batch=1) == quarter
    kept = Writer(model, 8, 64, STOP)  # a writer used again (as compiled ones are) reads nothing its last run left
    assert kept.run(prompts[::-1], 20) == quarter[::-1] and kept.run(prompts, 20) == quarter


def test_a_model_without_a_position_indexed_cache_is_refused_in_one_line():
    why = supported(gpt2(vocab=300).float())
    assert why and "\n" not in why
    with pytest.raises(ValueError, match="--writer transformers"):
        write_answers(gpt2(vocab=300).float(), [[1, 2, 3]], 4, [1], batch=2)


def test_a_chunk_written_with_ours_equals_the_chunk_written_with_transformers(tiny, tmp_path):  # noqa: F811
    from eagle.artifact import read_manifest
    from eagle.train import main

    for writer in ("ours", "transformers"):
        args = ["--target", tiny, "--data", str(tmp_path / writer), "--data-only", "--questions", "16", "--data-batch", "4"]
        assert main([*args, *TINY, "--writer", writer]) == 0
        assert {c["answers_by"] for c in read_manifest(tmp_path / writer)["chunks"]} == {writer}
    assert chunk_digests(tmp_path / "ours") == chunk_digests(tmp_path / "transformers")
