"""A pass of up to FEW_ROWS positions (decoding, verification) computes its row-by-row parts in every thread, into
each thread's own buffers (kernels/step_layer.h: no barrier to share them), and a longer pass deals them out among
the threads. A build with FEW_ROWS=0, where every pass deals them out (the flow before), gives every pass the same
logits and hidden states bit for bit: on the builds for this CPU, for AVX2 and for plain x86-64, on 1-3 threads, for
every family's features (post-norms, q/k norms, windows, scales, a softcap), a tree, and bfloat16 weights."""
import ctypes

import pytest
import torch

from families import FAMILY_MODELS
import kernels.bf16 as bf16
from kernels import skinny
from runners import LeanRunner
from test_lean_runner import MODELS, PASSES, ids_for

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]


def library(arch: str, defines=()) -> ctypes.CDLL:
    """The kernels built for ``arch`` with ``defines`` (``c_builds``: once per run), typed as the step calls them."""
    from c_builds import load_for

    built = load_for(arch, defines=defines)
    for name in skinny.SYMBOLS:  # every function typed as kernels.skinny types its own library's
        mine, theirs = getattr(skinny.library(), name), getattr(built, name)
        theirs.argtypes, theirs.restype = mine.argtypes, mine.restype
    return built


def passes(model, built: ctypes.CDLL, monkeypatch, threads=(1, 2, 3)) -> list:
    """On ``built``, for each thread count: the passes of PASSES (a prompt, decoding, verification widths), the
    hidden states entering both layers of a 2-position pass, and a branching tree of 5 nodes."""
    found, ids, before = [], ids_for(), torch.get_num_threads()
    with monkeypatch.context() as patch:
        patch.setattr(skinny, "library", lambda: built)
        try:
            for count in threads:
                torch.set_num_threads(count)
                runner = LeanRunner(model)
                found += [runner(ids[:, :length], n) for length, n in PASSES]
                runner.hidden_layers = (0, 1)
                found += [runner(ids[:, :32], 2), runner.hidden]
                runner.hidden_layers = ()
                runner.rollback(20)
                found.append(runner.tree_pass(ids[:, :20], 20, [5, 7, 9, 11, 13], [-1, 0, 0, 1, 2]))
                assert runner.step.library is built and runner.step_passes == runner.forward_passes
        finally:
            torch.set_num_threads(before)
    return found


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", ["llama", *sorted(FAMILY_MODELS)])
def test_few_row_passes_give_the_bits_of_passes_dealt_out(name, monkeypatch):
    """This CPU's build, every family: the few-row flow against FEW_ROWS=0's, 1-3 threads."""
    model = {**MODELS, **FAMILY_MODELS}[name]().to(torch.float32)
    assert same(passes(model, library("native"), monkeypatch), passes(model, library("native", ("FEW_ROWS=0",)), monkeypatch))


@pytest.mark.parametrize("arch", ["haswell", "x86-64"])
def test_few_row_passes_give_the_same_bits_on_the_avx2_and_plain_builds(arch, monkeypatch):
    """The AVX2 and plain x86-64 builds: the few-row flow against their FEW_ROWS=0 build's and this CPU's build's
    (Gemma 3: post-norms, q/k norms, GELU, a softcap, windows)."""
    model = FAMILY_MODELS["gemma3"]().to(torch.float32)
    mine = passes(model, library(arch), monkeypatch, threads=(2,))
    assert same(mine, passes(model, library(arch, ("FEW_ROWS=0",)), monkeypatch, threads=(2,)))
    assert same(mine, passes(model, library("native"), monkeypatch, threads=(2,)))


def test_few_row_passes_on_bfloat16_weights_give_the_bits_of_passes_dealt_out(monkeypatch):
    """bfloat16 weights on this build's first path (forced: two libraries could measure another each): the few-row
    flow against FEW_ROWS=0's."""
    monkeypatch.setattr(bf16, "FORCED", bf16.paths(skinny.library())[0])
    model = MODELS["qwen2"]().to(torch.bfloat16)
    assert same(passes(model, library("native"), monkeypatch, threads=(2,)),
                passes(model, library("native", ("FEW_ROWS=0",)), monkeypatch, threads=(2,)))
