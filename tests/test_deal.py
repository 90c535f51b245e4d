"""A linear's register groups dealt to the threads of a pass (kernels/deal.h): each thread a static share of the first
groups, the tail taken in chunks from a shared counter. Only who computes a group changes, so every pass (a prompt,
decoding and verification widths 1-12, hidden states, a tree) gives the logits of the static share (tail 0) bit for
bit: every family, float32 and each bfloat16 path this build has, the AVX2 and plain builds, on 1-3 threads; with
every group dealt in one-group chunks, half of them in 128 KB chunks, and a quarter in one chunk past any linear."""
import pytest
import torch

from families import FAMILY_MODELS
import kernels.bf16 as bf16
from kernels import skinny
from runners import LeanRunner
from test_few_rows import library, passes, same
from test_lean_runner import MODELS, ids_for

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]

CHUNK = 131072  # a chunk's bytes by default (skinny_gemm.c's STEP_DEAL_BYTES)
DEALS = ((100, 0), (50, 131072), (25, 1 << 30))  # (percent of the groups dealt, a chunk's bytes)


def widths(model, threads=(2, 3)) -> list:
    """Decoding and verification passes of 1-12 positions after 20 cached, on each thread count."""
    found, ids, before = [], ids_for(), torch.get_num_threads()
    try:
        for count in threads:
            torch.set_num_threads(count)
            runner = LeanRunner(model)
            runner(ids[:, :20], 1)
            for width in range(1, 13):
                found.append(runner(ids[:, : 20 + width], width))
                runner.rollback(20)
    finally:
        torch.set_num_threads(before)
    return found


def dealt(model, monkeypatch, deal, arch="native", threads=(1, 2, 3)) -> list:
    """``passes`` and ``widths`` on the build for ``arch`` with (tail percent, chunk bytes) ``deal`` (its own put back)."""
    built = library(arch)
    before = built.skinny_set_deal(-1, -1)
    try:
        assert built.skinny_set_deal(*deal) == deal[0]
        found = passes(model, built, monkeypatch, threads=threads)
        with monkeypatch.context() as patch:
            patch.setattr(skinny, "library", lambda: built)
            return found + widths(model, threads=[t for t in threads if t > 1])
    finally:
        built.skinny_set_deal(before, CHUNK)


@pytest.mark.parametrize("name", ["llama", *sorted(FAMILY_MODELS)])
def test_a_dealt_float32_pass_gives_the_bits_of_the_static_share(name, monkeypatch):
    model = {**MODELS, **FAMILY_MODELS}[name]().to(torch.float32)
    static = dealt(model, monkeypatch, (0, 0))
    for deal in DEALS:
        assert same(dealt(model, monkeypatch, deal), static), deal


def test_a_dealt_bfloat16_pass_gives_the_bits_of_the_static_share(monkeypatch):
    """On each bfloat16 path this build has (forced: one at a time)."""
    model = MODELS["qwen2"]().to(torch.bfloat16)
    for path in bf16.paths(skinny.library()):
        monkeypatch.setattr(bf16, "FORCED", path)
        static = dealt(model, monkeypatch, (0, 0), threads=(2, 3))
        for deal in DEALS:
            assert same(dealt(model, monkeypatch, deal, threads=(2, 3)), static), (bf16.NAMES[path], deal)


@pytest.mark.parametrize("arch", ["haswell", "x86-64"])
def test_dealt_passes_give_the_same_bits_on_the_avx2_and_plain_builds(arch, monkeypatch):
    """Gemma 3's features on 2 threads: every group dealt against the static share, and this CPU's build's."""
    model = FAMILY_MODELS["gemma3"]().to(torch.float32)
    mine = dealt(model, monkeypatch, (100, 0), arch, threads=(2,))
    assert same(mine, dealt(model, monkeypatch, (0, 0), arch, threads=(2,)))
    assert same(mine, dealt(model, monkeypatch, (0, 0), threads=(2,)))
