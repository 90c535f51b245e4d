"""The byte counter (utils/allocations.py) that tests/test_startup_memory.py asserts with: what a block
makes and frees, in order, oneDNN's packed copies included, and never a tensor it did not make."""
import pytest
import torch

from utils.allocations import counted, tensor_bytes


def test_the_counter_counts_what_the_block_makes_and_frees_and_not_what_it_found():
    found = torch.empty(300_000)  # made before: its free is not counted
    with counted() as held:
        kept = torch.empty(1_000_000)
        with held.part("burst"):
            burst = torch.empty(2_000_000)
            del burst
        del found
        torch.empty(500_000)
    assert held.parts["burst"] == held.peak == 12_000_000 and held.end == 4_000_000
    assert [b for _, b in held.trace] == [4_000_000, 12_000_000, 4_000_000, 6_000_000, 4_000_000]
    assert tensor_bytes(kept, kept[:10], kept.view(1000, 1000)) == 4_000_000  # one storage, once


def test_the_counter_sees_onednn_copies():
    if not torch.backends.mkldnn.is_available():
        pytest.skip("needs oneDNN (mkldnn)")
    weight = torch.ones(256, 128)
    with counted() as held:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 8)
    assert held.end == torch.ops.mkldnn._nbytes(packed) >= 256 * 128 * 4
