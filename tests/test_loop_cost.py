"""What a drafting row's step costs besides its pass (issue 71): greedy verification reads the target's tokens as
target AR does (ints from the row tops the C step keeps on its logits: no softmax, no tensor made nor read back but
the drafts), a step that drafts nothing is target AR's one one-position pass, and NASD's filler top-k is read from the
logits where that is sure to be the softmax's (``clear_ranks``), with the same drafts and outputs as before. Counts, on
a synthetic runner (``ReplayedRunner`` with the tops the C step would keep); no clock."""
import random
from typing import List

import pytest
import torch

from drafters.base import Drafter
from sampling import DraftPolicy, GenerationStats
from sampling.chain_decoding import draft_and_verify
from sampling.config import GenerationConfig
from utils.logits_processor import with_tops
from utils.replayed_runner import ReplayedRunner

VOCAB = 300


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
