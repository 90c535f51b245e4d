"""``prepare_step``: a model's compiled step (``runners.step``) made ready before anything is timed:
the graphs a run will replay, built width 1 first, one progress line each, and the state no longer lazy."""
from typing import Callable, Optional, Sequence, Tuple

import torch
from torch.nn import Module

from kernels.compile_cache import CacheCount
from kernels.step_artifacts import save_artifacts
from runners.config import step_name
from runners.step import MIN_CAPACITY, WIDTHS, StepRunner, step_state
from runners.step_graphs import cache_key, key_buckets


@torch.no_grad()
def prepare_step(model: Module, length: int = MIN_CAPACITY - max(WIDTHS), say: Callable[[str], None] = lambda text: None,
                 hidden_layers: Tuple[int, ...] = (), widths: Optional[Sequence[int]] = None, first: int = 1,
                 graphs: Optional[str] = None) -> float:
    """Build the graphs a run will replay, before anything is timed: each width (``widths``, added to
    the state's; None: the state's) at each key bucket a sequence meets between slot ``first - 1`` and
    ``length`` plus the width, at the capacity holding ``length`` positions; with ``hidden_layers``, every
    graph also returns those layers' hidden states (and serves the passes that want none). Width 1 first,
    then by bucket; one ``say`` line per graph. Afterwards the state is no longer lazy (no pass builds a
    graph). ``graphs``: the run's ``RunnerConfig.graphs`` (None: the state's). Saves the artifacts
    (``kernels.step_artifacts``) when something was built. Returns the seconds spent building (0 when
    nothing was new)."""
    state = step_state(model, graphs)
    state.set_widths(widths if widths is not None else state.widths)
    if hidden_layers:
        state.hidden_layers = tuple(hidden_layers)
    runner = StepRunner(model)
    runner._reserve(length)
    cache, layers = runner.cache, state.hidden_layers
    held = cache_key(cache)
    todo = sorted({(w, k) for w in state.widths for k in key_buckets(max(1, first), length + w, cache.capacity)
                   if (w, k, held, layers) not in state.built}, key=lambda wk: (wk[0] != 1, wk[1], wk[0]))
    state.lazy = True
    before, state.cache_count = state.compile_seconds, CacheCount()
    ids = torch.zeros(max(state.widths), dtype=torch.long, device=state.device)
    for i, (width, keys) in enumerate(todo):
        say(f"compiling {type(model).__name__}'s {step_name(model)}: graph {i + 1} of {len(todo)}, width {width}, {keys} keys"
            f"{', hidden states' if layers else ''} ({'CUDA graph' if state.cuda else 'inductor'})")
        for _ in range(2 if state.cuda else 1):  # a CUDA graph records on the run after its warm-up
            state.chain(ids[:width], keys // 2, cache, width, layers)  # slots keys/2 .. keys/2 + width - 1: that bucket
    state.lazy = False
    state.cache_count.finish()
    state.prepared_seconds = state.compile_seconds - before
    if todo:
        save_artifacts(state.artifact_key, state.graphs | set(state.loaded))
    return state.prepared_seconds
