"""A pass of few positions at a long context (decoding; 2 positions with one key-value head) splits its attention
across the threads by the bytes each reads (kernels/attention_split.h: the scores by spans of slots, the outputs by
parts of the dimensions): on 2 and 3 threads every position's logits are those of one thread (no split), of
one position at a time and of a pass too wide to split, bit for bit, so greedy drafting stays exact."""
import pytest
import torch

from kernels import skinny
from runners import LeanRunner
from test_c_step import TorchForward, odd_llama
from test_lean_runner import ids_for, mistral

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]

CONTEXT = 290  # past c_step.c's SPLIT_FROM (128 slots)


def passes(model, ids: torch.Tensor, threads: int) -> list:
    """After a prompt of CONTEXT positions on ``threads`` threads: positions CONTEXT..CONTEXT+9 one at a time (split
    where a pass has fewer units of attention than 2 a thread), in passes of 2 (split with one key-value head), 5, 8
    and 10, and 5 of them as a tree's chain."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        runner = LeanRunner(model)
        runner(ids[:, :CONTEXT], 1)
        alone = torch.cat([runner(ids[:, : CONTEXT + 1 + i], 1) for i in range(10)])
        found = [alone]
        for width in (2, 5, 8, 10):
            runner.rollback(CONTEXT)
            found.append(torch.cat([runner(ids[:, : min(CONTEXT + w0 + width, CONTEXT + 10)], min(width, 10 - w0))
                                    for w0 in range(0, 10, width)]))
        runner.rollback(CONTEXT)
        chain = ids[0, CONTEXT: CONTEXT + 5].tolist()
        found.append(runner.tree_pass(ids[:, :CONTEXT], CONTEXT, chain, list(range(-1, 4)))[1:])
        assert runner.step_passes > 10
        return found
    finally:
        torch.set_num_threads(before)


def model_of(shape):
    """A float32 Llama of (query heads, key-value heads, head size), or ``"window"``: Mistral sliding over 200 slots."""
    if shape == "window":
        return mistral(sliding_window=200).to(torch.float32)
    heads, kv, head = shape
    return odd_llama(hidden_size=heads * head, num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=64,
                     max_position_embeddings=512)


@pytest.mark.parametrize("shape", [(9, 3, 64), (6, 2, 24), (4, 4, 16), "window"])
def test_few_positions_at_a_long_context_give_the_same_logits_on_any_threads(shape):
    """SmolLM2's attention shape (9 query heads on 3 key-value heads of 64: the dimensions split in parts), a head
    size off the 16 lanes, one query head per key-value head, a sliding window (the slots from its block on): 1, 2
    and 3 threads, every width, the tree, alike; the torch forward's logits to float32 rounding."""
    model = model_of(shape)
    ids = ids_for(CONTEXT + 10)
    reference = passes(model, ids, 1)
    assert all(torch.equal(r, reference[0]) for r in reference[1:5])
    assert torch.equal(reference[5], reference[0][:5])
    for threads in (2, 3):
        found = passes(model, ids, threads)
        assert all(torch.equal(f, r) for f, r in zip(found, reference)), threads
    torch.testing.assert_close(reference[0], TorchForward(model)(ids, 10), rtol=1e-4, atol=2e-5)
