"""A long pass's attention units (kernels/c_step.c: a key-value head's query heads over a span of positions) are
cut into spans as even as whole pairs of positions allow (attention_split.h's span_start) and dealt to the threads
in a snake (snaked), so that the thread taking a round's dearer unit alternates. Who computes a unit only: every
position's logits stay those of the position fed alone (decoding's pass), bit for bit, whatever the pass's width,
its chunks and the thread count, on this CPU's build and on the AVX2 and plain x86-64 ones."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import kernels.c_step as c_step
from kernels import skinny
from runners import LeanRunner
from test_few_rows import library
from test_lean_runner import ids_for

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]


def grouped_llama(heads: int, kv_heads: int, head_size: int):
    """A float32 Llama of two layers, ``heads`` query heads over ``kv_heads`` key-value heads of ``head_size``."""
    torch.manual_seed(11)
    config = LlamaConfig(vocab_size=100, hidden_size=heads * head_size, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_size)
    return LlamaForCausalLM(config).to(torch.float32).eval()


def at_once_and_alone(model, length: int, chunk: int, threads, monkeypatch, n_last: int = 0) -> list:
    """The logits of the last ``n_last`` positions (0: every one) of a ``length``-position prompt: fed at once in C
    calls of at most ``chunk`` positions, on each thread count of ``threads``; then fed one position at a time, on
    one thread (last)."""
    ids, before, found = ids_for(length), torch.get_num_threads(), []
    try:
        with monkeypatch.context() as patch:
            patch.setattr(c_step, "CHUNK_ROWS", chunk)
            for count in threads:
                torch.set_num_threads(count)
                runner = LeanRunner(model)
                found.append(runner(ids, n_last or length))
                assert runner.step_passes == 1
        torch.set_num_threads(1)
        alone = LeanRunner(model)
        found.append(torch.cat([alone(ids[:, : i + 1], 1) for i in range(length)])[length - (n_last or length):])
    finally:
        torch.set_num_threads(before)
    return found


# (query heads, key-value heads, head size): SmolLM2's grouping (3 to a key-value head), 2 to one, one each
SHAPES = [(9, 3, 16), (4, 2, 32), (2, 2, 16)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("length, chunk, n_last", [(121, 256, 0), (200, 45, 0), (61, 256, 0), (30, 256, 5), (100, 33, 3)])
def test_a_prompts_logits_are_decodings_whatever_the_threads_spans_and_chunks(shape, length, chunk, n_last, monkeypatch):
    """121 positions in one call (spans of 6 and 8 positions), 200 in chunks of 45 (6 spans each), 61 in one
    call, and the last 5 of 30 or the last 3 of 100 in chunks of 33 (the last layer's few rows): on 1, 2 and 3
    threads, decoding's bits. Each shape meets a last round of fewer units than threads that a snake reverses
    (on 2 threads or 3), where a unit dealt twice or none would show."""
    found = at_once_and_alone(grouped_llama(*shape), length, chunk, (1, 2, 3), monkeypatch, n_last)
    for logits in found[:-1]:
        assert torch.equal(logits, found[-1])


@pytest.mark.parametrize("arch", ["haswell", "x86-64"])
def test_the_avx2_and_plain_builds_deal_alike(arch, monkeypatch):
    """The AVX2 and plain x86-64 builds of the step: the last 3 logits of a 100-position prompt in chunks of 33 on
    2 and 3 threads (a reversed last round on 2), decoding's bits on this CPU's build (every build rounds alike)."""
    model = grouped_llama(9, 3, 16)
    native = at_once_and_alone(model, 100, 33, (), monkeypatch, 3)[-1]
    built = library(arch)
    with monkeypatch.context() as patch:
        patch.setattr(skinny, "library", lambda: built)
        found = at_once_and_alone(model, 100, 33, (2, 3), monkeypatch, 3)
    for logits in found:
        assert torch.equal(logits, native)
