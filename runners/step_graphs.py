"""How the compiled step (``runners.step``) turns passes into graphs, the run's choice
(``runners.config.RunnerConfig.graphs``, ``--step-graphs``): "regional" (the default: one decoder layer
compiled once and shared by every layer, the whole pass captured as one CUDA graph per (width, keys) on
CUDA; a graph costs one layer's compilation, not thirty) or "whole" (the whole pass compiled per (width,
keys), ``mode="reduce-overhead"``: inductor's CUDA graphs). ``CapturedPasses`` captures a pass whose
layers were compiled one by one as one CUDA graph (the "regional" mode)."""
import weakref
from itertools import chain
from typing import Callable, Dict, List, Tuple

import torch
from torch import Tensor

from models.llama import KVCache
from runners.config import STEP_GRAPHS as GRAPHS  # noqa: F401 (the choices, named here too)

MIN_KEYS = 256  # the smallest key bucket (``key_bucket``)


def key_bucket(keys: int, capacity: int) -> int:
    """The keys a pass whose last slot is ``keys - 1`` attends to: the power of two >= ``keys`` (at least
    ``MIN_KEYS``), at most the cache's ``capacity``."""
    return min(capacity, max(MIN_KEYS, 1 << (max(1, keys) - 1).bit_length()))


def key_buckets(first: int, last: int, capacity: int) -> List[int]:
    """Every bucket a sequence spanning slots ``first - 1`` to ``last - 1`` meets, in order."""
    buckets, keys = [], key_bucket(first, capacity)
    while True:
        buckets.append(keys)
        if keys >= key_bucket(last, capacity):
            return buckets
        keys = key_bucket(keys + 1, capacity)


def failure(what: str, error: Exception, width: int, keys: int) -> str:
    """What failed, in one line: "compiling the graph of width 4, 256 keys failed (RuntimeError: ...)"."""
    first_line = next(iter(str(error).strip().splitlines()), "")
    return f"{what} the graph of width {width}, {keys} keys failed ({type(error).__name__}: {first_line})"


def cache_key(cache: KVCache) -> tuple:
    """What a graph captures of ``cache``: its capacity, dtype and every layer's key and value storage
    (their addresses; layer 0's alone would let a cache that shares it, or lands where it was freed,
    replay a graph that writes the other layers where they are no longer)."""
    first = cache.layers[0].keys
    return (cache.capacity, first.dtype, first.device) + \
        tuple(t.data_ptr() for layer in cache.layers for t in (layer.keys, layer.values))


def weights_key(module: torch.nn.Module, captured: bool) -> tuple:
    """What a state's graphs depend on of ``module``'s weights. ``captured`` (CUDA graphs: they read the
    weights at the addresses they captured, so a cast, a move or a load with ``assign=True`` must not
    replay them; an in-place load keeps the addresses): each parameter's and buffer's identity, address,
    dtype, device and shape. Else (CPU: dynamo guards the compiled layer on what it reads, and the CPU
    kernels swap linears for ``PrepackedLinear`` ones in place) the dtypes and devices: a cast or a move."""
    tensors = list(chain(module.parameters(), module.buffers()))
    if not captured:
        return tuple(sorted({(str(t.dtype), str(t.device)) for t in tensors}))
    return tuple((id(t), t.data_ptr(), t.dtype, t.device, tuple(t.shape)) for t in tensors)


def forget_when_freed(owner: object, held: object, key: tuple) -> None:
    """Call ``owner.forget(key)`` when ``held`` (a cache) is freed, holding ``owner`` only weakly."""
    weakref.finalize(held, _forget, weakref.ref(owner), key)


def _forget(owner: "weakref.ref", key: tuple) -> None:
    alive = owner()
    if alive is not None:
        alive.forget(key)


class CapturedPasses:
    """``forward``'s passes captured as CUDA graphs, one per (inputs' addresses, the cache's ``cache_key``,
    width, hidden layers): the first call of a key warms up twice on a side stream (building the
    compiled layer's kernels for these shapes), captures one pass, and replays it; every later call only
    replays. A cache's graphs go when the cache is freed. The outputs are the graph's own tensors,
    overwritten by its next replay (the runner clones them). One instance serves one set of weights
    (``runners.step.step_state`` makes a new state when they change: ``weights_key``)."""

    def __init__(self, forward: Callable, device: torch.device):
        self.forward, self.device = forward, device
        self.graphs: Dict[tuple, Tuple[object, tuple]] = {}  # (cache key, inputs, n_last, layers) -> graph, outputs
        self.pool = None  # one memory pool shared by every graph of this model

    def forget(self, held: tuple) -> None:
        """Drop the graphs captured over the cache whose ``cache_key`` is ``held`` (it was freed)."""
        for key in [key for key in self.graphs if key[0] == held]:
            del self.graphs[key]

    def __call__(self, ids: Tensor, positions: Tensor, slots: Tensor, mask: Tensor, cache: KVCache, n_last: int,
                 layers: Tuple[int, ...]):
        held = cache_key(cache)
        key = (held, ids.data_ptr(), positions.data_ptr(), slots.data_ptr(), mask.data_ptr(), n_last, layers)
        found = self.graphs.get(key)
        if found is None:
            if not any(other[0] == held for other in self.graphs):
                forget_when_freed(self, cache, held)
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.forward(ids, positions, slots, mask, cache, n_last, layers)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = self.forward(ids, positions, slots, mask, cache, n_last, layers)
            self.pool = graph.pool()
            found = self.graphs[key] = (graph, outputs)
        found[0].replay()
        return found[1]
