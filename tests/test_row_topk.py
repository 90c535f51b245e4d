"""``kernels.row_topk``: each logits row's few largest values in one C read of the row (NASD's filler top-k, issue 71).
Property: its values are ``torch.topk``'s, its indices too wherever the ranked values are distinct; a NaN, another
dtype or a strided tensor is left to the caller's path (None). Seeded rows, planted ties; no clock."""
import pytest
import torch

from drafters.ngram import NGramDrafter
from kernels import row_topk as topk_module
from kernels.row_topk import available, row_topk
from ngram_assisted import NGramStorage

pytestmark = pytest.mark.skipif(not available(), reason="no C compiler builds kernels/row_topk.c here")


@pytest.mark.parametrize("width", [5, 64, 64 * 20 + 3, 49152])
def test_values_are_topks_and_indices_too_where_the_values_are_distinct(width):
    gen = torch.Generator().manual_seed(5)
    distinct = 0
    for rows in (1, 3):
        for plant in (None, 0.0, 2.0 ** -20):
            logits = torch.randn((rows, width), generator=gen) * 4
            if plant is not None:  # a value just below (or at) the row's largest, elsewhere in the row
                logits[:, min(7, width - 1)] = logits.max(dim=-1).values - plant
            for count in sorted({1, 4, min(5, width)}):
                values, indices = row_topk(logits, count)
                expected, ranked = logits.topk(count, dim=-1), logits.topk(min(count + 1, width), dim=-1).values
                assert torch.equal(values, expected.values)
                assert logits.gather(1, indices).tolist() == values.tolist()  # each index holds its value
                for row in range(rows):
                    listed = ranked[row].tolist()
                    if all(a > b for a, b in zip(listed, listed[1:])):  # distinct, above the rest
                        distinct += 1
                        assert indices[row].tolist() == expected.indices[row].tolist()
    assert distinct > 5


def test_equal_values_rank_the_lower_index_first_and_empty_slots_say_so():
    logits = torch.full((1, 200), -float("inf"))
    logits[0, 150], logits[0, 20], logits[0, 90] = 2.0, 2.0, 1.0
    values, indices = row_topk(logits, 4)
    assert indices.tolist() == [[20, 150, 90, -1]] and values.tolist() == [[2.0, 2.0, 1.0, -float("inf")]]


def test_what_it_leaves_to_the_callers_path():
    logits = torch.randn((2, 300), generator=torch.Generator().manual_seed(1))
    nan = logits.clone()
    nan[1, 17] = float("nan")
    assert row_topk(nan, 3) is None  # torch ranks a NaN first: the caller's path decides
    assert row_topk(logits.double(), 3) is None and row_topk(logits[:, ::2], 3) is None and row_topk(logits, 0) is None
    assert row_topk(logits, 3) is not None


def test_nasd_reads_its_fillers_through_it(monkeypatch):
    """NASD's ``fetch_logits`` takes the C read (its calls counted), with the indices ``fetch`` gives on the softmax."""
    calls = []
    monkeypatch.setattr("drafters.ngram.row_topk", lambda *a: calls.append(1) or topk_module.row_topk(*a))
    logits = torch.randn((3, 64 * 20), generator=torch.Generator().manual_seed(2)) * 3
    drafter = NGramDrafter(NGramStorage(3, 64 * 20), 3)
    assert torch.equal(drafter.fetch_logits(logits, 1.0), drafter.fetch(torch.softmax(logits, dim=-1)))
    assert calls == [1]
