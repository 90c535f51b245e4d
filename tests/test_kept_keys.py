"""The C step's key blocks kept beside the cache (kernels/kept_keys.py, c_step.c's Layer.kept_blocks): a pass
transposes only the blocks its positions touch, and the logits are those of a fresh transposition every pass,
bit for bit, through decoding, rejected drafts rolled back across a block and re-decoded with other tokens,
a tree's accepted branch moved into place across a block, a torch write of the keys, a cache shared with
another, a fresh prompt on the same runner and on another runner of the same step."""
import gc
import weakref

import pytest
import torch

from conftest import llama
from families import sliding_mistral
import kernels.kept_keys as kept_keys
from kernels import skinny
from models.llama import KVCache
from runners import LeanRunner
from test_lean_runner import ids_for

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]

MODELS = {"llama": lambda: llama().to(torch.float32), "bfloat16": lambda: llama().to(torch.bfloat16),
          "window": lambda: sliding_mistral().to(torch.float32)}
NODES, PARENTS, PATH = [5, 7, 9, 11, 13, 17], [-1, 0, 0, 1, 2, 4], [0, 2, 4]  # the branch 0 -> 2 -> 4


def keeps(runner) -> bool:
    """Whether the runner's cache keeps its blocks current through every position it holds."""
    state = runner.cache.kept_keys
    return state is not None and state.upto == runner.cached and runner.step.structs[0].kept_blocks is not None


def scenario(model, kept: list) -> list:
    """Logits of a sequence of passes of one runner, then of another on the same step; ``kept`` collects,
    after each pass, whether the blocks were kept."""
    ids, other = ids_for(80, seed=1), ids_for(80, seed=2)
    runner, out = LeanRunner(model), []

    def run(seq, n):
        out.append(runner(seq, n))
        kept.append(keeps(runner))

    run(ids[:, :37], 3)  # a prompt: blocks 0..2, the last partial
    for n in range(38, 42):  # decoding
        run(ids[:, :n], 1)
    run(ids[:, :50], 9)  # 8 drafts verified: slots 41..49, into block 3
    runner.rollback(42)  # 7 rejected: back into block 2
    mixed = torch.cat([ids[:, :42], other[:, 42:]], 1)  # other tokens at the rolled-back positions
    for n in (43, 44, 46):
        run(mixed[:, :n], n - runner.cached)
    out.append(runner.tree_pass(mixed, 46, NODES, PARENTS))  # from slot 45 (the root's token fed again)
    runner.keep_branch(46, PATH)  # slots 48, 50 moved to 47, 48: block 2's last slot changes
    state = runner.cache.kept_keys
    kept.append(state is not None and state.upto == 46 and state.same(runner.cache))  # the blocks before the move kept
    branch = torch.cat([mixed[:, :46], torch.tensor([[NODES[i] for i in PATH]]), other[:, 60:70]], 1)
    for n in (50, 51, 56):
        run(branch[:, :n], n - runner.cached)
    runner.rollback(0)  # a fresh prompt on the same runner and cache
    run(other[:, :33], 2)
    run(other[:, :34], 1)
    second = LeanRunner(model)  # a fresh prompt on a new runner (a new cache) of the same step
    out.append(second(ids[:, 3:40], 1))
    out.append(second(ids[:, 3:41], 1))
    assert second.step is runner.step and keeps(second) == kept[-1]
    return out


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("inference", [False, True], ids=["no_grad", "inference_mode"])
def test_logits_with_kept_blocks_are_those_of_a_fresh_transposition(name, inference, monkeypatch):
    model = MODELS[name]()
    with torch.no_grad():  # the step made outside inference mode (a bfloat16 model's is refused there, as before)
        LeanRunner(model)(ids_for(20), 1)
    results = {}
    for keep in (False, True):
        monkeypatch.setattr(kept_keys, "KEEP", keep)
        kept: list = []
        with torch.inference_mode() if inference else torch.no_grad():
            results[keep] = scenario(model, kept)
        assert all(kept) if keep else not any(kept)  # the cache kept them (inference mode too), or none did
    assert all(torch.equal(a, b) for a, b in zip(results[False], results[True]))


def shared_cache_passes(model) -> list:
    """Logits of a runner over a cache whose tensors another runner's C step rewrites in between."""
    ids, other = ids_for(60, seed=3), ids_for(60, seed=4)
    first, second = LeanRunner(model), LeanRunner(model)
    out = [first(ids[:, :40], 1)]
    second.cache, second.capacity, second.cached, second.dtype = \
        KVCache(list(first.cache.layers), first.cache.capacity), first.capacity, 40, first.dtype
    out.append(second(ids[:, :41], 1))
    first.rollback(10)
    out.append(first(torch.cat([ids[:, :10], other[:, 10:41]], 1), 1))  # slots 10..40 rewritten under the second
    out.append(second(ids[:, :42], 1))
    return out


def torch_write_passes(model) -> list:
    """Logits of decoding after the keys of slot 5 were written through torch (no ``moving``)."""
    ids, runner = ids_for(60, seed=5), LeanRunner(model)
    out = [runner(ids[:, :40], 1)]
    for layer in runner.cache.layers:
        layer.keys[0, :, 5] = torch.randn(layer.keys.shape[1], layer.keys.shape[3], generator=torch.Generator().manual_seed(6))
    out.append(runner(ids[:, :41], 1))
    assert runner.cache.kept_keys is None or runner.cache.kept_keys.upto == 41
    return out


@pytest.mark.parametrize("passes", [shared_cache_passes, torch_write_passes])
def test_keys_changed_behind_the_step_are_transposed_again(passes, monkeypatch):
    """A write the kept blocks were not told of (the keys' version counters) lowers them to slot 0."""
    model = MODELS["llama"]()
    results = {}
    for keep in (False, True):
        monkeypatch.setattr(kept_keys, "KEEP", keep)
        with torch.no_grad():
            results[keep] = passes(model)
    assert all(torch.equal(a, b) for a, b in zip(results[False], results[True]))


def test_a_move_keeps_the_blocks_before_it_and_a_write_behind_it_drops_them():
    model, ids = MODELS["llama"](), ids_for(60, seed=7)
    runner = LeanRunner(model)
    with torch.no_grad():
        runner(ids[:, :40], 1)
        cache = runner.cache
        with kept_keys.moving(cache, 33):
            cache.layers[1].keys[0, :, 33] = 0.0
        assert cache.kept_keys.upto == 33 and cache.kept_keys.same(cache)
        cache.layers[0].keys[0, :, 36] = 0.0  # behind its back: the next check finds the version changed
        with kept_keys.moving(cache, 38):
            pass
        assert cache.kept_keys.upto == 0


def test_the_kept_blocks_go_with_their_cache():
    model, ids = MODELS["llama"](), ids_for(40)
    runner = LeanRunner(model)
    with torch.no_grad():
        runner(ids, 1)
    cache = weakref.ref(runner.cache)
    blocks = weakref.ref(runner.cache.kept_keys.blocks)
    del runner
    gc.collect()
    assert cache() is None and blocks() is None


def test_passes_with_keeping_off_drop_the_kept_blocks(monkeypatch):
    """Passes run with ``KEEP`` off lower no watermark: they drop the cache's blocks, and keeping on again starts
    from none (a rollback below the old watermark in between, then a pass above it, stays exact)."""
    model, ids, other = MODELS["llama"](), ids_for(60, seed=8), ids_for(60, seed=9)
    out = {}
    for toggled in (False, True):
        runner = LeanRunner(model)
        with torch.no_grad():
            runner(ids[:, :40], 1)
            monkeypatch.setattr(kept_keys, "KEEP", not toggled)
            runner.rollback(20)
            runner(torch.cat([ids[:, :20], other[:, 20:41]], 1), 1)  # slots 20..40 rewritten
            assert (runner.cache.kept_keys is None) == toggled
            monkeypatch.setattr(kept_keys, "KEEP", True)
            out[toggled] = runner(torch.cat([ids[:, :20], other[:, 20:50]], 1), 9)
    assert torch.equal(out[True], out[False])
