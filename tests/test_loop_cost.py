"""What a drafting row's step costs besides its pass (issue 71): greedy verification reads the target's tokens as
target AR does (ints from the row tops the C step keeps on its logits: no softmax, no tensor made nor read back but
the drafts), a step that drafts nothing is target AR's one one-position pass, and NASD's filler top-k is read from the
logits where that is sure to be the softmax's (``clear_ranks``), with the same drafts and outputs as before. Counts, on
a synthetic runner (``ReplayedRunner`` with the tops the C step would keep); no clock."""
import random
from typing import List

import numpy as np
import pytest
import torch

from drafters.base import UNREAD, Drafter
from drafters.ngram import NGramDrafter
from ngram_assisted import NGramStorage
from sampling import DraftPolicy, GenerationStats
from sampling.chain_decoding import draft_and_verify
from sampling.config import GenerationConfig
from utils.logits_processor import BLOCK, clear_ranks, largest, with_tops
from utils.replayed_runner import ReplayedRunner

VOCAB = 1280  # 20 columns of 64: ``largest`` reads the fillers' ranks by its columns, not by a top-k


class TopsRunner(ReplayedRunner):
    """``ReplayedRunner`` whose logits carry each row's (index, largest, largest of the others), as the C step's do;
    it records each pass as (positions fed, rows returned)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passes: List[tuple] = []

    def __call__(self, ids: torch.Tensor, n_last: int = 1) -> torch.Tensor:
        fed = ids.shape[1] - self.cached
        logits = super().__call__(ids, n_last)
        self.passes.append((fed, n_last))
        top2 = logits.topk(2, dim=-1)
        return with_tops(logits, [(int(i[0]), float(v[0]), float(v[1])) for v, i in zip(top2.values, top2.indices)])


def _case(seed: int = 0, length: int = 40):
    """A prompt of random ids and an output that copies two stretches of it after a few new ids (drafts both accepted
    and rejected), each output position with two fillers ranked below the target's token."""
    rng = random.Random(seed)
    prompt = [rng.randrange(3, VOCAB) for _ in range(60)]
    ref = ([rng.randrange(3, VOCAB) for _ in range(6)] + prompt[10:24] + [rng.randrange(3, VOCAB) for _ in range(6)] + prompt[30:44])[:length]
    fillers = {i: [t, (t + 7) % VOCAB, (t + 13) % VOCAB] for i, t in enumerate(ref)}
    return prompt, ref, fillers


class Silent(Drafter):
    """A cheap drafter that never drafts: every step is a plain step."""

    def propose(self, ids, tokens, k):
        return 0, None


@pytest.fixture
def softmaxes(monkeypatch):
    """The softmaxes over the vocabulary the loop makes (their shapes)."""
    calls = []
    softmax = torch.nn.functional.softmax
    monkeypatch.setattr(torch.nn.functional, "softmax", lambda x, *a, **k: calls.append(tuple(x.shape)) or softmax(x, *a, **k))
    return calls


def test_a_step_that_drafts_nothing_is_target_ars_one_position_pass(softmaxes, monkeypatch):
    """Property: a no-draft step makes one pass feeding one position and reading one row, as target AR's, and reads
    its token from the tops: no softmax, no tensor concatenated and read back (``torch.cat``: the tensor path's sync)."""
    prompt, ref, fillers = _case()
    cats = []
    cat = torch.cat
    monkeypatch.setattr(torch, "cat", lambda *a, **k: cats.append(1) or cat(*a, **k))
    runner, stats = TopsRunner(prompt, ref, VOCAB, fillers), GenerationStats()
    policy = DraftPolicy(row_costs=(1.0, 1.02, 1.05, 1.08), min_gain=1.0)
    out = draft_and_verify(prompt, runner, Silent(), GenerationConfig(max_gen_len=len(ref), gamma=3, stats=stats, policy=policy))
    assert out == ref and stats.drafted == 0
    assert runner.passes[0] == (len(prompt), 1) and runner.passes[1:] == [(1, 1)] * (len(ref) - 1)
    assert softmaxes == [] and cats == []


def _nasd(prompt, ref, fillers, filler_top_k: int = 3):
    """A greedy NASD run on the tops runner: (output, drafts by step, what the storage learned, the runner's passes)."""
    storage, stats = NGramStorage(3, VOCAB), GenerationStats()
    storage.add_sequence(prompt)
    runner = TopsRunner(prompt, ref, VOCAB, fillers)
    out = draft_and_verify(prompt, runner, NGramDrafter(storage, filler_top_k, stop_if_unknown=True),
                           GenerationConfig(max_gen_len=len(ref), gamma=4, stats=stats))
    learned = {j: {context: (dict(c.counts), c.best) for context, c in storage.grams[j].items()} for j in storage.grams}
    return out, stats.drafted_by_step, stats.accepted_at, learned, runner.passes


@pytest.mark.parametrize("filler_top_k", [1, 3])
def test_nasd_reads_its_fillers_from_the_logits_with_the_same_drafts_and_output(filler_top_k, softmaxes, monkeypatch):
    """Property: NASD's greedy run with its filler top-k read from the logits drafts, learns and emits exactly what the
    run through the softmax did (``fetch_logits`` forced ``UNREAD``: the loop makes the distributions), with no softmax."""
    for seed in (0, 1, 2):
        prompt, ref, fillers = _case(seed)
        read = _nasd(prompt, ref, fillers, filler_top_k)
        assert read[0] == ref and sum(read[1]) > 0 and softmaxes == []
        with monkeypatch.context() as patched:
            patched.setattr(NGramDrafter, "fetch_logits", lambda self, logits, temperature: UNREAD)
            assert _nasd(prompt, ref, fillers, filler_top_k) == read
        assert softmaxes and all(shape[-1] == VOCAB for shape in softmaxes)  # that run went through the probabilities
        softmaxes.clear()


def test_an_unclear_filler_rank_goes_through_the_probabilities(softmaxes):
    """Two fillers one unit in the last place apart: ``fetch_logits`` leaves them to the softmax (``UNREAD``)."""
    logits = torch.zeros((2, VOCAB))
    logits[:, 5], logits[:, 9], logits[:, 11] = 3.0, 2.0, 1.0
    drafter = NGramDrafter(NGramStorage(3, VOCAB), 3)
    assert drafter.fetch_logits(logits, 1.0).tolist() == [[5, 9, 11]] * 2
    logits[1, 12] = float(np.nextafter(np.float32(1.0), np.float32(0.0)))  # the fourth just below the third
    assert drafter.fetch_logits(logits, 1.0) is UNREAD


def _softmax_ranks(row: torch.Tensor, m: int, temperature: float) -> List[int]:
    return torch.softmax(row / temperature, dim=-1).topk(m).indices.tolist()


@pytest.mark.parametrize("temperature", [1.0, 0.3, 7.0])
def test_clear_ranks_promise_the_softmaxs_top_k(temperature):
    """Property: where ``clear_ranks`` holds for a row's ``m + 1`` largest logits, the softmax's top ``m`` are the
    logits' first ``m``, in order; rows built with near ties, wide spans and large magnitudes, seeded."""
    gen = torch.Generator().manual_seed(1)
    held = refused = 0
    for scale in (1e-3, 1.0, 3.0, 30.0, 300.0):
        for offset in (0.0, 20.0, -300.0):
            for gap in (None, None, None, 0.0, 1e-7, 1e-5, 1e-4, 1e-3, 1e-1):
                row = torch.randn(64, generator=gen) * scale + offset
                if gap is not None:  # three just below the largest, by ``gap`` relative to its magnitude (0: ties)
                    near = torch.randint(0, 64, (3,), generator=gen)
                    row[near] = row.max() - torch.rand(3, generator=gen) * gap * max(1.0, abs(offset))
                values, indices = row.topk(4)
                if clear_ranks(values.tolist(), temperature, row.dtype):
                    held += 1
                    assert _softmax_ranks(row, 3, temperature) == indices[:3].tolist()
                else:
                    refused += 1
    assert held > 20 and refused > 20, (held, refused)  # both sides were met


def test_clear_ranks_refuse_ties_non_finite_values_and_underflow():
    assert clear_ranks([3.0, 2.0, 1.0, 0.0], 1.0, torch.float32)
    assert not clear_ranks([3.0, 2.0, 2.0, 0.0], 1.0, torch.float32)  # a tie
    assert not clear_ranks([3.0, 3.0 - 2.0 ** -20, 1.0, 0.0], 1.0, torch.float32)  # a near tie
    assert not clear_ranks([float("nan"), 2.0, 1.0, 0.0], 1.0, torch.float32)
    assert not clear_ranks([float("inf"), 2.0, 1.0, 0.0], 1.0, torch.float32)
    assert not clear_ranks([100.0, 50.0, 20.0, 0.0], 1.0, torch.float32)  # the last far below: probabilities may underflow
    assert clear_ranks([100.0, 50.0, 20.0, 0.0], 10.0, torch.float32)  # tempered, within the span


@pytest.mark.parametrize("width", [BLOCK * 20, BLOCK * 768, BLOCK * 20 + 3])
def test_largest_is_the_top_k_wherever_the_values_are_distinct(width):
    """Property: ``largest``'s values are ``topk``'s, and so are its indices where the row's ``count`` largest values are
    distinct and above the rest; rows with planted ties and near ties, seeded (a width not a multiple of ``BLOCK`` takes ``topk`` itself)."""
    gen = torch.Generator().manual_seed(3)
    distinct = 0
    for rows in (1, 5):
        for plant in (None, 0.0, 2.0 ** -20, 1e-3):
            logits = torch.randn((rows, width), generator=gen) * 4
            if plant is not None:  # a value just below (or at) the row's largest, elsewhere in the row
                logits[:, 7] = logits.max(dim=-1).values - plant
            for count in (1, 4):
                values, indices = largest(logits, count)
                expected, ranked = logits.topk(count, dim=-1), logits.topk(count + 1, dim=-1).values
                assert torch.equal(values, expected.values)
                for row in range(rows):
                    if all(a > b for a, b in zip(ranked[row].tolist(), ranked[row, 1:].tolist())):  # distinct, above the rest
                        distinct += 1
                        assert indices[row].tolist() == expected.indices[row].tolist()
                        assert logits[row, indices[row]].tolist() == values[row].tolist()
    assert distinct > 10


class Wrong(Drafter):
    """A cheap drafter without evidence (not gated) whose drafts are never accepted; it records where it was asked."""

    def __init__(self):
        self.asked: List[int] = []

    def propose(self, ids, tokens, k):
        self.asked.append(len(tokens))
        ids[0, len(tokens) : len(tokens) + k] = 1  # id 1 is never the reference's (its ids start at 3)
        return k, None


def test_a_paused_step_asks_no_drafter_and_is_target_ars_one_position_pass(softmaxes):
    """Property: while the policy pauses a drafter whose drafts do not pay, a step neither asks it (its calls counted)
    nor passes more than target AR's one position, and the output is target AR's."""
    prompt, ref, fillers = _case(seed=3)
    runner, stats, drafter = TopsRunner(prompt, ref, VOCAB, fillers), GenerationStats(), Wrong()
    policy = DraftPolicy(row_costs=(1.0, 1.02, 1.05, 1.08), min_gain=1.0)
    out = draft_and_verify(prompt, runner, drafter, GenerationConfig(max_gen_len=len(ref), gamma=3, stats=stats, policy=policy))
    assert out == ref and stats.paused_steps > len(ref) // 2 and softmaxes == []
    starts = [len(prompt)]  # each step's sequence length: one token a step (no draft is ever accepted)
    for _ in runner.passes[1:]:
        starts.append(starts[-1] + 1)
    plain = [(start, fed) for start, fed in zip(starts, runner.passes) if start not in drafter.asked]
    assert len(plain) >= stats.paused_steps and all(fed == (1, 1) for _, fed in plain[1:])  # the prompt's pass aside
    assert all(runner.passes[starts.index(start)][1] > 1 for start in drafter.asked)  # an asked step verified its drafts
