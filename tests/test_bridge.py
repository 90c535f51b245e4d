"""The bridge over a pass's sync points (kernels/step_bridge.h): before a thread waits at the barrier after a linear,
it prefetches the first bytes of its share of the next linear's weights. Hints only: every bridge gives every pass (a
prompt, decoding, verification widths, hidden states, a tree) the logits of no bridge (0 bytes, the code before) bit
for bit, float32 and bfloat16 weights on each path this build has, on 1-3 threads: a bridge shorter than a thread's
share, one longer than the small models' shares (every block of theirs asked for) and one past any share."""
import pytest
import torch

import kernels.bf16 as bf16
from kernels import skinny
from test_few_rows import library, passes, same
from test_lean_runner import MODELS

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]

BRIDGES = (128, 65536, 1 << 24)  # bytes: two lines; more than the small models' shares; more than any share


def bridged(model, monkeypatch, bytes_: int) -> list:
    """``passes`` on this CPU's build with its bridge set to ``bytes_`` (its own setting put back after)."""
    built = library("native")
    before = built.c_step_set_bridge(-1)
    try:
        assert built.c_step_set_bridge(bytes_) == bytes_
        return passes(model, built, monkeypatch)
    finally:
        built.c_step_set_bridge(before)


def test_a_bridged_float32_pass_gives_the_bits_of_one_without(monkeypatch):
    model = MODELS["llama"]().to(torch.float32)
    without = bridged(model, monkeypatch, 0)
    for bytes_ in BRIDGES:
        assert same(bridged(model, monkeypatch, bytes_), without), bytes_


def test_a_bridged_bfloat16_pass_gives_the_bits_of_one_without(monkeypatch):
    """On each bfloat16 path this build has (forced: one at a time)."""
    model = MODELS["qwen2"]().to(torch.bfloat16)
    for path in bf16.paths(skinny.library()):
        monkeypatch.setattr(bf16, "FORCED", path)
        without = bridged(model, monkeypatch, 0)
        for bytes_ in BRIDGES:
            assert same(bridged(model, monkeypatch, bytes_), without), (bf16.NAMES[path], bytes_)
