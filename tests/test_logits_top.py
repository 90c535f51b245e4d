"""The C step's read of each logits row's greedy token (kernels/logits_top.h, Dims.tops; utils.logits_processor's
RowTops): its index is torch.argmax's on the same row (the first largest, the first NaN, ties to the lowest index),
its value and the largest of the rest are the row's own, a pass's rows get their own across its chunks, and greedy
decoding that reads them returns the tokens of the probabilities, the tops written since ignored."""
import ctypes
import math

import pytest
import torch

from conftest import llama
import kernels.c_step as c_step
from kernels import skinny
from kernels.step_structs import Top
from runners import LeanRunner
from sampling import autoregressive_generate
from test_lean_runner import ids_for
import utils.logits_processor as processors
from utils.logits_processor import GreedyProcessor, first_rows, row_tops, with_tops

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]


def crafted_rows() -> list:
    """Rows of lengths 1 to 49159 (within a 256-value block, across blocks, a tail): ties, NaNs, infinities, zeros."""
    g = torch.Generator().manual_seed(21)
    rows = [torch.tensor([3.0]), torch.tensor([float("nan")]), torch.tensor([-math.inf, -math.inf]), torch.tensor([-0.0, 0.0]),
            torch.tensor([0.0, -0.0, 0.0]), torch.tensor([math.inf, 1.0, math.inf]), torch.tensor([1.0, float("nan"), 2.0, float("nan")])]
    for V in (5, 256, 257, 1000, 49159):
        row = torch.randn(V, generator=g)
        rows.append(row)
        for places in ([V - 1], [0], [V // 3, V - 1], [V // 2, V // 2 + 1, 7 % V]):  # the largest once, or tied
            tied = row.clone()
            tied[places] = 9.0
            rows.append(tied)
        late = row.clone()
        late[V - 1] = float("nan")  # a NaN after the largest
        rows.append(late)
        rows.append(torch.full((V,), -math.inf))
    return rows


def tops_of(rows: list) -> list:
    library = skinny.library()
    out = []
    for row in rows:
        row = row.float().contiguous()
        top = (Top * 1)()
        library.logits_top(row.data_ptr(), 1, row.numel(), ctypes.addressof(top))
        out.append((top[0].at, top[0].top, top[0].others))
    return out


def test_the_index_is_torch_argmax_and_the_values_are_the_rows_own():
    rows = crafted_rows()
    for row, (at, top, others) in zip(rows, tops_of(rows)):
        assert at == int(torch.argmax(row)), row
        assert top == float(row[at]) or (math.isnan(top) and math.isnan(float(row[at])))
        rest = torch.cat([row[:at], row[at + 1:]])
        if torch.isnan(row).any():
            assert math.isnan(others)
        else:
            assert others == (float(rest.max()) if rest.numel() else -math.inf)


def test_a_pass_gives_each_asked_row_its_own_tops_across_its_chunks(monkeypatch):
    monkeypatch.setattr(c_step, "CHUNK_ROWS", 16)  # 40 positions in three C calls, the asked rows in all three
    model, ids = llama().to(torch.float32), ids_for(41, seed=22)
    runner = LeanRunner(model)
    with torch.no_grad():
        passes = [runner(ids[:, :40], 30), runner(ids, 1)]
    assert runner.step_passes == 2
    for logits in passes:
        tops = row_tops(logits)
        assert tops is not None and len(tops) == logits.shape[0]
        assert [t[0] for t in tops] == torch.argmax(logits, dim=-1).tolist()
        assert [t[1] for t in tops] == logits.max(dim=-1).values.tolist()


def test_choose_reads_the_tops_while_they_hold_and_the_row_after_a_write():
    logits = torch.zeros(1, 50)
    logits[0, 7] = 5.0
    with_tops(logits, [(11, 5.0, 0.0)])  # not the row's: what a read of the tops alone answers
    assert int(GreedyProcessor().choose(logits)) == 11
    logits[0, 30] = 6.0  # a write through torch: the tops no longer hold
    assert row_tops(logits) is None and int(GreedyProcessor().choose(logits)) == 30
    near = torch.zeros(1, 50)
    near[0, 3], near[0, 4] = 1.0, 1.0 + 2.0 ** -20  # a near tie: the softmax decides, as without the tops
    with_tops(near, tops_of([near[0]]))
    assert int(GreedyProcessor().choose(near)) == int(GreedyProcessor().sample(GreedyProcessor()(near)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_tokens_with_the_tops_are_those_without(dtype, monkeypatch):
    model, prompt = llama().to(dtype), ids_for(20, seed=23)[0].tolist()
    run = lambda: autoregressive_generate(prompt, model, max_gen_len=24, eos_tokens_id=[], use_cache=True)  # noqa: E731
    with_them = run()
    monkeypatch.setattr(processors, "row_tops", lambda logits: None)
    assert run() == with_them and len(with_them) == 24


def test_a_verifications_first_rows_keep_their_tops_and_lose_them_with_a_write():
    model, ids = llama().to(torch.float32), ids_for(30, seed=24)
    with torch.no_grad():
        logits = LeanRunner(model)(ids, 5)
    rows = first_rows(logits, 3)
    assert row_tops(rows) == row_tops(logits)[:3]
    logits[4, 0] = 1.0  # a write to the pass's logits: its view shares the version, the tops no longer hold
    assert row_tops(rows) is None and row_tops(logits) is None


def test_greedy_chain_verification_with_the_tops_gives_the_tokens_without(monkeypatch):
    from drafters import PromptLookupSpec
    from sampling import generate

    model, prompt = llama().to(torch.float32), (ids_for(12, seed=25)[0].tolist() * 3)  # repeats: drafts to verify
    run = lambda: generate(prompt, model, PromptLookupSpec(), dict(max_gen_len=24, eos_tokens_id=[], use_cache=True))[0]  # noqa: E731
    with_them = run()
    monkeypatch.setattr(processors, "row_tops", lambda logits: None)
    assert run() == with_them and len(with_them) == 24


def test_logits_made_in_inference_mode_carry_no_tops():
    """Inference tensors count no writes: tops kept on them could go stale unseen."""
    model, ids = llama().to(torch.float32), ids_for(30, seed=26)
    with torch.no_grad():
        LeanRunner(model)(ids, 1)  # the step made outside inference mode
    with torch.inference_mode():
        logits = LeanRunner(model)(ids, 2)
    assert row_tops(logits) is None and GreedyProcessor().choose(logits)[:, 0].tolist() == torch.argmax(logits, -1).tolist()


def test_clear_tokens_are_chooses_as_ints_and_none_where_choose_must_decide():
    model, ids = llama().to(torch.float32), ids_for(30, seed=27)
    with torch.no_grad():
        logits = LeanRunner(model)(ids, 4)
    greedy = GreedyProcessor()
    assert greedy.clear_tokens(logits) == greedy.choose(logits)[:, 0].tolist() == torch.argmax(logits, -1).tolist()
    near = torch.zeros(1, 50)
    near[0, 3], near[0, 4] = 1.0, 1.0 + 2.0 ** -20
    with_tops(near, tops_of([near[0]]))
    assert greedy.clear_tokens(near) is None  # a near tie: the softmax's to decide

    class Last(GreedyProcessor):  # a rule of its own: never the tops' answer
        def sample(self, probs):
            return torch.full((probs.shape[0], 1), probs.shape[-1] - 1)

    assert Last().clear_tokens(logits) is None and Last().choose(logits)[:, 0].tolist() == [logits.shape[-1] - 1] * 4
    logits[0, 0] += 1.0
    assert greedy.clear_tokens(logits) is None  # written since: the row decides
