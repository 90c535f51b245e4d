"""The C step's per-pass currency check (models.llama.layout, kernels.c_step.CStep.bind, kernels.kept_keys): decoding
with nothing changed walks no layer's tensors, and a cache whose tensors, layers or capacity were assigned between
passes, or that was written behind the step, is bound again: the logits are those of a runner that never took the
shortcut, bit for bit, never a replay of the tensors it held before."""
import pytest
import torch

from conftest import llama
import kernels.kept_keys as kept_keys
from kernels import skinny
from models.llama import KVCache, KVLayer, layout
from runners import LeanRunner
from test_lean_runner import ids_for

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]


class CountedLayers(tuple):
    """A cache's layers that count the walks over them (iterations)."""

    walks = 0

    def __iter__(self):
        CountedLayers.walks += 1
        return super().__iter__()


def test_layout_moves_on_every_assignment_of_a_caches_tensors_layers_or_capacity_only():
    keys = torch.zeros(2, 1, 1, 4, 2)
    before = layout()
    layer = KVLayer(keys[0], keys[1])
    cache = KVCache([layer], 4)
    assert layout() > before and isinstance(cache.layers, tuple)
    for assign in (lambda: setattr(layer, "keys", keys[1]), lambda: setattr(layer, "values", keys[0]),
                   lambda: setattr(cache, "layers", (layer,)), lambda: setattr(cache, "capacity", 8)):
        before = layout()
        assign()
        assert layout() > before
    before = layout()
    cache.kept_keys, layer.is_initialized = object(), False  # bookkeeping beside the tensors
    keys[0, 0, 0, 1] = 1.0  # a write: the versions count it, not the layout
    assert layout() == before


def test_decoding_with_nothing_changed_walks_no_layer():
    model, ids = llama().to(torch.float32), ids_for(60, seed=11)
    runner = LeanRunner(model)
    with torch.no_grad():
        runner(ids[:, :30], 1)
        runner.cache.layers = CountedLayers(runner.cache.layers)  # an assignment: the next pass walks once
        runner(ids[:, :31], 1)
        CountedLayers.walks = 0
        for n in range(32, 40):
            runner(ids[:, :n], 1)
    assert CountedLayers.walks == 0 and runner.cache.kept_keys.upto == 39


def _decode(model, ids, change=None) -> list:
    """Logits of a prompt then five decoding passes; ``change(runner)`` runs before the third."""
    runner, out = LeanRunner(model), []
    with torch.no_grad():
        out.append(runner(ids[:, :30], 1))
        for n in range(31, 36):
            if n == 33 and change is not None:
                change(runner)
            out.append(runner(ids[:, :n], 1))
    return out


def _poke(layer: KVLayer) -> None:
    """A torch write of slot 3's keys and values (what a stale binding would not read)."""
    with torch.no_grad():
        layer.keys[0, :, 3] += 0.5
        layer.values[0, :, 3] -= 0.5


def _replaced_layer(runner) -> None:
    layer = runner.cache.layers[1]
    layer.keys, layer.values = layer.keys.clone(), layer.values.clone()  # no longer views of the cache's one tensor
    _poke(layer)


def _replaced_layers(runner) -> None:
    runner.cache.layers = tuple(KVLayer(x.keys.clone(), x.values.clone()) for x in runner.cache.layers)
    _poke(runner.cache.layers[0])


def _written_behind(runner) -> None:
    for layer in runner.cache.layers:
        _poke(layer)


@pytest.mark.parametrize("change", [_replaced_layer, _replaced_layers, _written_behind])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cache_changed_between_passes_is_bound_again_never_replayed(change, dtype, monkeypatch):
    """The passes after the change read the changed tensors (a stale binding would read the old ones, unpoked, and
    give other logits, or write the new keys where no one reads them): the same bits as with no kept blocks."""
    model, ids = llama().to(dtype), ids_for(60, seed=12)
    plain = _decode(model, ids)
    results = {}
    for keep in (False, True):
        monkeypatch.setattr(kept_keys, "KEEP", keep)
        results[keep] = _decode(model, ids, change)
    assert all(torch.equal(a, b) for a, b in zip(results[False], results[True]))
    assert all(torch.equal(a, b) for a, b in zip(plain[:3], results[True][:3]))
    assert not torch.equal(plain[3], results[True][3])  # the poke is read: a replay of the old tensors would miss it


def test_two_runners_alternating_on_one_step_each_read_their_own_cache():
    model, first, second = llama().to(torch.float32), ids_for(60, seed=13), ids_for(60, seed=14)
    alone = [_decode(model, first), _decode(model, second)]
    a, b, out = LeanRunner(model), LeanRunner(model), [[], []]
    with torch.no_grad():
        for n in [30] + list(range(31, 36)):
            out[0].append(a(first[:, :n], 1))
            out[1].append(b(second[:, :n], 1))
    assert a.step is b.step
    assert all(torch.equal(x, y) for run, ref in zip(out, alone) for x, y in zip(run, ref))
