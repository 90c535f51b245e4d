"""``LogitsProcessor.choose`` (logits -> token in one, what target AR calls): the tokens ``sample(processor(logits))``
gives, greedy's from the logits' own argmax only where no rounding of the softmax can change it
(``utils.logits_processor.clear_argmax``), sampling's with the same draws from the same seed; ``runners.rope_table``:
the C step's kept RoPE rows are the ones a pass computes, bit for bit."""
import math

import numpy as np
import pytest
import torch

from conftest import llama
from families import gemma3, phi3
from models.layer_spec import model_spec
from models.llama import rope_tables
from runners.rope_table import RopeTable
from sampling import GenerationStats, autoregressive_generate
from utils.logits_processor import GreedyProcessor, MultinomialProcessor, NucleusProcessor, TopKProcessor, clear_argmax


def old_token(processor, logits):
    """The rule as it was: probabilities, then the token drawn from them."""
    return processor.sample(processor(logits))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.3, 7.0])
def test_greedy_choose_is_the_softmax_token(dtype, temperature):
    gen = torch.Generator().manual_seed(0)
    processor = GreedyProcessor(temperature)
    for scale in (1e-3, 0.1, 3.0, 40.0):
        for _ in range(20):
            logits = (torch.randn((1, 4096), generator=gen) * scale).to(dtype)
            assert torch.equal(processor.choose(logits), old_token(processor, logits))


def test_exact_ties_take_the_first_largest():
    processor = GreedyProcessor()
    for row in ([1.0, 3.0, 3.0, 2.0], [5.0, 5.0], [0.0, -1.0, 0.0], [-2.0, 7.5, 1.0, 7.5, 7.5]):
        logits = torch.tensor([row])
        first = row.index(max(row))
        assert clear_argmax(logits) is None  # a tie is the softmax's to decide
        assert int(processor.choose(logits)) == int(old_token(processor, logits)) == int(torch.argmax(logits)) == first


def test_a_near_tie_is_decided_by_the_probabilities():
    """Two logits one unit in the last place apart: their probabilities round equal and argmax takes the
    first, where the logits' own argmax takes the second. ``choose`` keeps the probabilities' token."""
    above = float(np.nextafter(np.float32(0.1), np.float32(1.0)))
    logits = torch.tensor([[0.1, above]], dtype=torch.float32)
    processor = GreedyProcessor()
    assert int(torch.argmax(logits)) == 1 and int(old_token(processor, logits)) == 0  # the case exists
    assert clear_argmax(logits) is None and int(processor.choose(logits)) == 0


def test_clear_argmax_takes_a_clear_largest_only():
    logits = torch.zeros((1, 100), dtype=torch.float32)
    logits[0, 37] = 1.0
    assert clear_argmax(logits).tolist() == [[37]]
    logits[0, 90] = 1.0 - 2.0 ** -20  # nearer than CLEAR, after it
    assert clear_argmax(logits) is None
    logits[0, 90] = 0.0
    logits[0, 3] = 1.0 - 2.0 ** -20  # nearer than CLEAR, before it
    assert clear_argmax(logits) is None
    logits[0, 3] = 0.5
    assert clear_argmax(logits).tolist() == [[37]]
    assert clear_argmax(logits, temperature=1e-6).tolist() == [[37]]  # tempering widens the gap
    assert clear_argmax(torch.tensor([[0.0, 0.0, 30.0]]), temperature=1e-38) is None  # 3e39 tempered: past float32


@pytest.mark.parametrize("row", [[1.0, math.nan, 3.0], [math.inf, 1.0, 2.0], [1.0, math.inf, math.inf], [-math.inf, 2.0, -math.inf],
                                 [math.nan, math.nan], [-math.inf, -math.inf], [1e30, 3e30, 2e30]])
@pytest.mark.parametrize("temperature", [1.0, 1e-9])
def test_non_finite_rows_give_what_the_softmax_gives(row, temperature):
    processor = GreedyProcessor(temperature)
    logits = torch.tensor([row])
    assert torch.equal(processor.choose(logits), old_token(processor, logits))


def test_several_rows_and_other_shapes():
    gen = torch.Generator().manual_seed(1)
    processor = GreedyProcessor()
    for shape in ((3, 50), (50,), (2, 1, 50), (1, 1, 50)):
        logits = torch.randn(shape, generator=gen)
        chosen = processor.choose(logits)
        assert chosen.shape == (*shape[:-1], 1) and chosen.dtype == torch.int64
        assert torch.equal(chosen, old_token(processor, logits))
    row = torch.randn((1, 100), generator=gen)[:, ::2]  # not contiguous
    assert torch.equal(processor.choose(row), old_token(processor, row))


def test_a_verification_passs_rows_are_each_chosen_from_the_logits_and_one_unclear_row_takes_the_softmax(monkeypatch):
    """The ``k + 1`` rows of a greedy verification pass: each clear row's token from its own logits, no softmax;
    one near tie among them and every row goes through the probabilities, the tokens unchanged either way."""
    calls = []
    softmax = torch.nn.functional.softmax
    monkeypatch.setattr(torch.nn.functional, "softmax", lambda *a, **k: calls.append(1) or softmax(*a, **k))
    processor = GreedyProcessor()
    logits = torch.randn((6, 4096), generator=torch.Generator().manual_seed(3)) * 3
    assert torch.equal(processor.choose(logits), old_token(processor, logits)) and len(calls) == 1  # old_token's alone
    logits[4, 7] = logits[4].max() + 2.0 ** -20  # row 4 a near tie
    calls.clear()
    assert torch.equal(processor.choose(logits), old_token(processor, logits)) and len(calls) == 2


@pytest.mark.parametrize("trees", [False, True])
def test_greedy_loops_make_no_softmax_for_a_drafter_that_reads_none(trees, monkeypatch):
    """A chain, and a tree, of deterministic drafts from a drafter that fetches nothing: the loop takes each
    verified row's token from the logits (no softmax over the vocabulary), and emits target AR's tokens."""
    from drafters.base import Drafter, write_drafts
    from runners import KVCacheModel
    from sampling.chain_decoding import draft_and_verify
    from sampling.config import GenerationConfig
    from sampling.tree_decoding import draft_tree_and_verify

    target = llama().float()
    prompt, length = [5, 9, 2, 7, 11, 5, 9], 24
    ref = autoregressive_generate(prompt, target, length, eos_tokens_id=-1, use_cache=True)

    class Repeat(Drafter):  # what followed the last token's latest earlier occurrence (a tree: and a sibling, 3)
        supports_trees = True

        def _after(self, tokens, k):
            at = max((i for i in range(len(tokens) - 1) if tokens[i] == tokens[-1]), default=len(tokens))
            return tokens[at + 1 : at + 1 + k]

        def propose(self, ids, tokens, k):
            return write_drafts(ids, len(tokens), self._after(tokens, k)), None

        def propose_tree(self, tokens, budget):
            chain = self._after(tokens, 2)
            return chain + [3], [-1, 0][: len(chain)] + [-1]

    calls = []
    softmax = torch.nn.functional.softmax
    monkeypatch.setattr(torch.nn.functional, "softmax", lambda x, *a, **k: calls.append(tuple(x.shape)) or softmax(x, *a, **k))
    loop = draft_tree_and_verify if trees else draft_and_verify
    stats = GenerationStats()
    out = loop(prompt, KVCacheModel(target, True), Repeat(), GenerationConfig(max_gen_len=length, use_cache=True, trees=trees, gamma=3,
                                                                              stats=stats))
    assert out == ref and stats.drafted > 0 and calls == []


def test_a_subclass_rule_is_kept():
    class NoFirstToken(GreedyProcessor):
        def _process(self, logits):
            return logits.index_fill(-1, torch.tensor([0]), float("-inf"))

    logits = torch.tensor([[9.0, 1.0, 2.0]])
    assert int(NoFirstToken().choose(logits)) == 2 and int(GreedyProcessor().choose(logits)) == 0


@pytest.mark.parametrize("processor", [MultinomialProcessor(0.8), TopKProcessor(1.0, 5), NucleusProcessor(0.7, 0.9)])
def test_sampling_choose_draws_as_before(processor):
    logits = torch.randn((1, 64), generator=torch.Generator().manual_seed(2))
    torch.manual_seed(5)
    before = [int(old_token(processor, logits)) for _ in range(30)]
    torch.manual_seed(5)
    assert [int(processor.choose(logits)) for _ in range(30)] == before


def test_ar_takes_duck_typed_and_greedy_processors_alike():
    """A processor with only ``__call__`` and ``sample`` (the reference's interface) still runs target AR, to
    the same tokens as ``GreedyProcessor``'s ``choose``."""
    class Plain:
        def __call__(self, logits):
            return torch.softmax(logits.float(), dim=-1)

        def sample(self, probs):
            return torch.argmax(probs, dim=-1, keepdim=True)

    model = llama().float()
    prompt = [5, 9, 2, 7, 11]
    ours = autoregressive_generate(prompt, model, 12, logits_processor=GreedyProcessor(), eos_tokens_id=-1, use_cache=True)
    assert autoregressive_generate(prompt, model, 12, logits_processor=Plain(), eos_tokens_id=-1, use_cache=True) == ours


@pytest.mark.parametrize("make", [lambda: llama().float(), lambda: gemma3().float(), lambda: phi3().float()])
def test_rope_table_rows_are_the_pass_rows(make):
    model = make()
    spec = model_spec(model)
    table = RopeTable(model, spec)

    def computed(positions):
        tables = rope_tables(model, spec, positions, torch.float32)
        return tuple(torch.stack([t[k][0, 0] for t in tables]) for k in (0, 1))

    for start, r in ((0, 1), (0, 7), (5, 1), (300, 3), (299, 40), (700, 1)):
        positions = torch.arange(start, start + r)
        got = table.at(positions, start, capacity=400)
        assert all(torch.equal(a, b) for a, b in zip(got, computed(positions)))
    tree = torch.tensor([10, 11, 11, 12, 12, 12])
    assert all(torch.equal(a, b) for a, b in zip(table.at(tree), computed(tree)))
    with torch.no_grad():
        getattr(model.model.rotary_emb, f"{spec.ropes[0]}inv_freq").mul_(1.5)  # an in-place edit: remade
    positions = torch.arange(20, 22)
    assert all(torch.equal(a, b) for a, b in zip(table.at(positions, 20), computed(positions)))
