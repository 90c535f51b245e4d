"""How the compiled step (``runners.step``) turns passes into graphs: ``step_graphs`` reads the choice
(``SPECDEC_STEP_GRAPHS``), and ``CapturedPasses`` captures a pass whose layers were compiled one by one
as one CUDA graph (the "regional" mode)."""
import os
from typing import Callable, Dict, Tuple

import torch
from torch import Tensor

from models.llama import KVCache

GRAPHS = ("regional", "whole")


def step_graphs() -> str:
    """How the step is compiled (``SPECDEC_STEP_GRAPHS``): "regional" (the default: one decoder layer
    compiled once and shared by every layer, the whole pass captured as one CUDA graph per (width,
    keys) on CUDA; a graph costs one layer's compilation, not thirty) or "whole" (the whole pass compiled
    per (width, keys), ``mode="reduce-overhead"``: inductor's CUDA graphs)."""
    mode = os.environ.get("SPECDEC_STEP_GRAPHS", "regional")
    if mode not in GRAPHS:
        raise ValueError(f"SPECDEC_STEP_GRAPHS must be one of {', '.join(GRAPHS)}, got {mode!r}")
    return mode


class CapturedPasses:
    """``forward``'s passes captured as CUDA graphs, one per (inputs' addresses, width, hidden layers):
    the first call of a key warms up twice on a side stream (building the compiled layer's kernels for
    these shapes), captures one pass, and replays it; every later call only replays. The outputs are
    the graph's own tensors, overwritten by its next replay (the runner clones them)."""

    def __init__(self, forward: Callable, device: torch.device):
        self.forward, self.device = forward, device
        self.graphs: Dict[tuple, Tuple[object, tuple]] = {}
        self.pool = None  # one memory pool shared by every graph of this model

    def __call__(self, ids: Tensor, positions: Tensor, slots: Tensor, mask: Tensor, cache: KVCache, n_last: int,
                 layers: Tuple[int, ...]):
        key = (ids.data_ptr(), mask.data_ptr(), cache.layers[0].keys.data_ptr(), n_last, layers)
        found = self.graphs.get(key)
        if found is None:
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
