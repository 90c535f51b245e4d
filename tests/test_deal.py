"""A linear's register groups shared among the threads of a pass with the ends stolen (kernels/deal.h): each thread
takes its own contiguous range from the front, and a thread done with its own takes the rest of another's from the
back. Only who computes a group changes, so every pass (a prompt, decoding and verification widths 1-12, hidden
states, a tree) gives the logits of the static share bit for bit: every family, float32 and each bfloat16 path this
build has, the AVX2 and plain builds, on 1-3 threads; with the steals of whichever thread finishes first (1) and
with thread 0 a thief from the start (2: every call's range ends stolen, whatever the timing)."""
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


def dealt(model, monkeypatch, on: int, arch="native", threads=(1, 2, 3)) -> list:
    """``passes`` and ``widths`` on the build for ``arch`` with the ends stolen (``on`` 1 or 2) or not (0; the
    build's own setting put back after)."""
    built = library(arch)
    before = built.skinny_set_deal(-1)
    try:
        assert built.skinny_set_deal(on) == on
        found = passes(model, built, monkeypatch, threads=threads)
        with monkeypatch.context() as patch:
            patch.setattr(skinny, "library", lambda: built)
            return found + widths(model, threads=[t for t in threads if t > 1])
    finally:
        built.skinny_set_deal(before)


@pytest.mark.parametrize("name", ["llama", *sorted(FAMILY_MODELS)])
def test_a_pass_with_its_ends_stolen_gives_the_bits_of_the_static_share_on_float32(name, monkeypatch):
    model = {**MODELS, **FAMILY_MODELS}[name]().to(torch.float32)
    static = dealt(model, monkeypatch, 0)
    for on in (1, 2):
        assert same(dealt(model, monkeypatch, on), static), on


def test_a_pass_with_its_ends_stolen_gives_the_bits_of_the_static_share_on_bfloat16(monkeypatch):
    """On each bfloat16 path this build has (forced: one at a time)."""
    model = MODELS["qwen2"]().to(torch.bfloat16)
    for path in bf16.paths(skinny.library()):
        monkeypatch.setattr(bf16, "FORCED", path)
        static = dealt(model, monkeypatch, 0, threads=(2, 3))
        for on in (1, 2):
            assert same(dealt(model, monkeypatch, on, threads=(2, 3)), static), (bf16.NAMES[path], on)


@pytest.mark.parametrize("arch", ["haswell", "x86-64"])
def test_stolen_ends_give_the_same_bits_on_the_avx2_and_plain_builds(arch, monkeypatch):
    """Gemma 3's features on 2 threads: the ends stolen against the static share, and this CPU's build's."""
    model = FAMILY_MODELS["gemma3"]().to(torch.float32)
    mine = dealt(model, monkeypatch, 2, arch, threads=(2,))
    assert same(mine, dealt(model, monkeypatch, 0, arch, threads=(2,)))
    assert same(mine, dealt(model, monkeypatch, 0, threads=(2,)))
