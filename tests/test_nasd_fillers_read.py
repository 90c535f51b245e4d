"""Greedy NASD on rows whose pass kept no tops (the loop's tensor path, ``chain_decoding._verified``) reads the fillers
from the logits (``NGramDrafter.fetch_logits``) instead of a softmax over every verified row: the same tokens, and the
storage learns the same fillers as through the softmax. Counts on a replayed runner (its logits carry no tops)."""
import random
from typing import Dict, List, Tuple

import torch

from drafters.base import UNREAD
from drafters.ngram import NGramDrafter, NGramSpec
from drafters.spec import DraftContext
from ngram_assisted import NGramStorage
from sampling import DraftPolicy, GenerationStats, generate
from utils.logits_processor import row_tops
from utils.replayed_runner import ReplayedRunner

VOCAB = 500


def _run(monkeypatch, read: bool) -> Tuple[List[int], List[int], Dict, int]:
    """(output, target AR's tokens, the storage's counts, fetches from a softmax); ``read`` false: fillers through it."""
    rng = random.Random(3)
    prompt = [rng.randrange(3, VOCAB) for _ in range(120)]
    ref = [rng.randrange(3, VOCAB) for _ in range(4)] + prompt[30:50] + [rng.randrange(3, VOCAB) for _ in range(6)]
    runner = ReplayedRunner(prompt, ref, VOCAB, {i: [t, (t + 7) % VOCAB, (t + 9) % VOCAB] for i, t in enumerate(ref)})
    assert row_tops(runner(torch.zeros(1, 5, dtype=torch.long), 1)) is None  # no tops: the loop's tensor path
    made = [0]  # the fillers fetched from the distributions: a softmax over every verified row made for them
    fetch = NGramDrafter.fetch

    def counted(self, probs):
        made[0] += 1
        return fetch(self, probs)

    monkeypatch.setattr(NGramDrafter, "fetch", counted)  # (not the processor: a patched one is no longer greedy's own rule)
    if not read:
        monkeypatch.setattr(NGramDrafter, "fetch_logits", lambda self, logits, temperature: UNREAD)
    storage = NGramStorage(4, VOCAB)
    values = dict(gamma=4, max_gen_len=len(ref), eos_tokens_id=[1], policy=DraftPolicy(), stats=GenerationStats())
    out, _ = generate(prompt, runner, NGramSpec(3), values, DraftContext(storage=storage))
    counts = {j: {gram: dict(entry.counts) for gram, entry in table.items()} for j, table in storage.grams.items()}
    monkeypatch.undo()
    return out, ref, counts, made[0]


def test_fillers_read_from_the_logits_make_no_softmax_and_teach_the_same(monkeypatch):
    out, ref, counts, softmaxes = _run(monkeypatch, read=True)
    assert out == ref and softmaxes == 0
    before, _, counts_before, softmaxes_before = _run(monkeypatch, read=False)
    assert before == ref and softmaxes_before > 0  # the softmax path, as before
    assert counts == counts_before  # the same fillers learned, count for count
