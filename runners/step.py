"""``StepRunner``: the lean Llama forward as compiled steps (``models.llama_step``), one graph per pass
width, gpt-fast style (``torch.compile(mode="reduce-overhead", fullgraph=True)``: one CUDA graph per
width on CUDA; inductor's default mode on CPU, where it is only tested).

* A pass over ``r`` new rows runs in the smallest prepared width >= r (``WIDTHS``); the padded rows are
  written at slots after the valid ones, each attends causally to its own slot, and is then ignored
  (forgotten by moving ``cached``). A pass wider than every width (a prompt, a large tree) runs the
  same step uncompiled into the same cache.
* The inputs of a width (ids, positions, slots, mask) and the cache live at static addresses
  (``mark_static_address``); the cache's capacity is a power of two chosen by ``prepare_step``, taken
  from a per-model pool so that a new runner (every generation makes one) builds no graph.
* Chain and tree passes share a width's graph: a tree only fills the mask and the slots differently.
* ``compile_events`` (``runners.compiled``) records every graph built, as "<model class> step".
"""
import time
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch._dynamo
from torch import Tensor
from torch.nn import Module

from kernels.compile_cache import CacheCount, use_compile_cache
from models.llama import KVCache, lean_unsupported
from models.llama_step import LlamaStep, zeroed_cache
from runners.compiled import compile_events
from runners.config import STEP_LABEL
from runners.device import model_device
from runners.static import fed
from runners.trees import TreePasses, compute_dtype

WIDTHS = (1, 2, 4, 8, 16, 32)  # decoding, chain verification (suffix drafts up to 24), a tree of 16 nodes
MIN_CAPACITY = 1024


def _capacity(length: int) -> int:
    return max(MIN_CAPACITY, 1 << (max(1, length) - 1).bit_length())


class StepState:
    """A model's compiled step, its pool of caches (one capacity) and each width's input buffers."""

    def __init__(self, model: Module):
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 1024)
        torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 4096)
        use_compile_cache()
        self.step = LlamaStep(model)  # refuses a model outside the family, with its reason
        self.model, self.device, self.dtype = model, model_device(model), compute_dtype(model)
        self.cuda = self.device.type == "cuda"
        self.compiled = torch.compile(self.step.forward, fullgraph=True, dynamic=False,
                                      mode="reduce-overhead" if self.cuda else None)
        self.capacity = 0
        self.caches: List[KVCache] = []  # free caches of ``capacity``
        self.inputs: Dict[Tuple[int, int], Tuple[Tensor, ...]] = {}  # (width, capacity) -> ids, positions, slots, mask
        self.slot_ranges: Dict[int, Tensor] = {}  # capacity -> its slot indices
        self.set_widths(WIDTHS)
        self.built: set = set()
        self.compile_seconds = self.prepared_seconds = 0.0
        self.cache_count = CacheCount()

    def set_widths(self, widths: Tuple[int, ...]) -> None:
        """The widths passes are padded to from now on (1 always among them)."""
        self.widths = tuple(sorted(set(widths) | {1}))
        self.steps = torch.arange(max(self.widths), device=self.device)

    def width(self, rows: int) -> Optional[int]:
        """The smallest prepared width holding ``rows``; None past the largest."""
        return next((w for w in self.widths if w >= rows), None)

    def take_cache(self, length: int) -> KVCache:
        """A free cache holding ``length`` positions plus one pass of the largest width (zeroed,
        static addresses); the pool moves to a larger capacity (new graphs) only when it must."""
        capacity = _capacity(length + max(self.widths))
        if capacity > self.capacity:
            self.capacity, self.caches = capacity, []
            self.slot_ranges[capacity] = torch.arange(capacity, device=self.device)
        if self.caches:
            return self.caches.pop()
        cache = zeroed_cache(self.model, capacity, self.dtype, self.device)
        for layer in cache.layers:
            torch._dynamo.mark_static_address(layer.keys, guard=True)
            torch._dynamo.mark_static_address(layer.values, guard=True)
        return cache

    def give_back(self, cache: KVCache) -> None:
        if cache.capacity == self.capacity:
            self.caches.append(cache)

    def buffers(self, width: int, capacity: int) -> Tuple[Tensor, ...]:
        """``width``'s inputs: ids, positions, slots ``[width]`` and the boolean mask ``[1, 1, width, capacity]``
        (per capacity: a runner still holding a smaller cache keeps its own)."""
        made = self.inputs.get((width, capacity))
        if made is None:
            long = dict(dtype=torch.long, device=self.device)
            made = (torch.zeros(width, **long), torch.zeros(width, **long), torch.zeros(width, **long),
                    torch.zeros((1, 1, width, capacity), dtype=torch.bool, device=self.device))
            for tensor in made:
                torch._dynamo.mark_static_address(tensor, guard=True)
            self.inputs[(width, capacity)] = made
        return made

    def chain(self, new: Tensor, start: int, cache: KVCache, n_last: int, layers: Tuple[int, ...]):
        """A causal pass of ``new`` ``[r]`` at positions (and slots) ``start..``: logits ``[n_last, V]``, hidden ``[r, .]``."""
        rows, width, slot_range = new.shape[0], self.width(new.shape[0]), self.slot_ranges[cache.capacity]
        if width is None:
            positions = torch.arange(start, start + rows, device=self.device)
            mask = (slot_range[None, :] <= positions[:, None])[None, None]
            return self.step.forward(new, positions, positions, mask, cache, n_last, layers)
        ids, positions, slots, mask = self.buffers(width, cache.capacity)
        ids[:rows].copy_(new, non_blocking=True)
        torch.add(self.steps[:width], start, out=positions)
        slots.copy_(positions)
        torch.le(slot_range[None, :], positions[:, None], out=mask[0, 0])
        return self.run(width, cache, rows, n_last, layers)

    def tree(self, new: Tensor, positions_in: Tensor, allowed: Tensor, start: int, cache: KVCache, layers: Tuple[int, ...]):
        """A tree pass: ``new`` ``[m]`` at ``positions_in`` ``[m]``, row ``i`` at slot ``start + i``,
        attending where ``allowed`` ``[1, 1, m, C]`` (boolean); logits ``[m, V]``, hidden ``[m, .]``."""
        rows, width = new.shape[0], self.width(new.shape[0])
        if width is None:
            slots = torch.arange(start, start + rows, device=self.device)
            return self.step.forward(new, positions_in, slots, allowed, cache, rows, layers)
        ids, positions, slots, mask = self.buffers(width, cache.capacity)
        ids[:rows].copy_(new)
        torch.add(self.steps[:width], start, out=slots)
        positions.copy_(slots)  # padded rows: at their own slot, causal, finite
        positions[:rows].copy_(positions_in)
        torch.le(self.slot_ranges[cache.capacity][None, :], slots[:, None], out=mask[0, 0])
        mask[0, 0, :rows].copy_(allowed[0, 0])
        return self.run(width, cache, rows, rows, layers)

    def run(self, width: int, cache: KVCache, rows: int, n_last: int, layers: Tuple[int, ...]):
        """Replay (or build) ``width``'s graph over its buffers; the valid rows' outputs, cloned on CUDA."""
        key = (width, cache.capacity, cache.layers[0].keys.data_ptr(), layers)
        first, clock = key not in self.built, time.perf_counter()
        if self.cuda:
            torch.compiler.cudagraph_mark_step_begin()
        logits, hidden = self.compiled(*self.buffers(width, cache.capacity), cache, width, layers)
        logits = logits[rows - n_last: rows]
        hidden = hidden[:rows] if hidden is not None else None
        if self.cuda:  # a graph's outputs are overwritten by its next replay
            logits, hidden = logits.clone(), hidden.clone() if hidden is not None else None
        if first:
            self.built.add(key)
            compile_events.append((f"{type(self.model).__name__} step", width, cache.capacity))
            if self.cuda:
                torch.cuda.synchronize(self.device)
            self.compile_seconds += time.perf_counter() - clock
        return logits, hidden


_STATES: "weakref.WeakKeyDictionary[Module, StepState]" = weakref.WeakKeyDictionary()


def step_state(model: Module) -> StepState:
    """The model's compiled step, made on first use."""
    state = _STATES.get(model)
    if state is None:
        state = _STATES[model] = StepState(model)
    return state


class StepRunner(TreePasses):
    """A ``runners.Runner`` over ``StepState``'s compiled steps: ``runner(ids, n_last)`` returns the
    logits ``[n_last, V]`` of the last ``n_last`` positions of ``ids`` ``[1, L]``, feeding only
    ``ids[:, cached:]``; ``rollback(length)`` only moves ``cached`` (masked slots are never read).
    Tree passes (``TreePasses``) run the width's graph with the tree's mask over the capacity.
    No ``.item()``, no host sync: the loop's one sync per step is the only one."""

    cache_kind = "static"
    use_cache = True

    def __init__(self, model: Module):
        reason = lean_unsupported(model)
        if reason is not None:
            raise ValueError(reason)
        self.model = model
        self.state = step_state(model)
        self.device = self.state.device
        self.cache: Optional[KVCache] = None
        self.cached = 0
        self.forward_passes = 0
        self._release = None
        self.hidden_layers: tuple = ()  # runners.base.Runner: hidden states kept with each pass
        self.hidden: Optional[Tensor] = None
        self.hidden_start = 0

    def __call__(self, ids: Tensor, n_last: int = 1) -> Tensor:
        length, start = ids.shape[1], self.cached
        new = fed(self, ids, n_last)[0]
        with torch.no_grad():
            logits, hidden = self.state.chain(new, start, self.cache, n_last, self.hidden_layers)
        self._passed(hidden, start)
        self.cached = length
        return logits

    def rollback(self, length: int) -> None:
        """Forget the cached positions ``length`` and after (no-op when they are not cached)."""
        if self.cached > length:
            self.cached = length

    def _passed(self, hidden: Optional[Tensor], start: int) -> None:
        self.forward_passes += 1
        if self.hidden_layers:
            self.hidden, self.hidden_start = hidden, start

    def _reserve(self, length: int) -> None:
        """Hold a pooled cache with room for ``length`` positions plus the widest padded pass; a
        regrowth copies what the old one holds (the new capacity builds its graphs)."""
        if self.cache is not None and length + max(self.state.widths) <= self.cache.capacity:
            return
        old, self.cache = self.cache, self.state.take_cache(length)
        if old is not None and self.cached:
            for before, after in zip(old.layers, self.cache.layers):
                after.keys[:, :, : self.cached].copy_(before.keys[:, :, : self.cached])
                after.values[:, :, : self.cached].copy_(before.values[:, :, : self.cached])
        if self._release is not None:
            self._release.detach()
        self._release = weakref.finalize(self, self.state.give_back, self.cache)

    # ---- draft trees (``TreePasses``): the mask spans the cache's capacity ----
    def _tree_room(self, length: int) -> int:
        self._reserve(length)
        return self.cache.capacity

    def _tree_forward(self, kwargs: dict, start: int, n: int) -> Tensor:
        """Logits ``[1 + n, V]`` of the tree pass ``kwargs`` (``runners.trees.tree_inputs``) from ``start``."""
        ids, positions, mask = kwargs["input_ids"][0], kwargs["position_ids"][0], kwargs["attention_mask"]
        with torch.no_grad():
            logits, hidden = self.state.tree(ids, positions, mask == 0, start, self.cache, self.hidden_layers)
        self._passed(hidden, start)
        return logits[-(n + 1):]


@torch.no_grad()
def prepare_step(model: Module, length: int = MIN_CAPACITY - max(WIDTHS), say: Callable[[str], None] = lambda text: None,
                 hidden_layers: Tuple[int, ...] = (), widths: Optional[Tuple[int, ...]] = None) -> float:
    """Build ``model``'s step graphs for every width (``widths``: None keeps ``WIDTHS``), at the capacity
    holding ``length`` positions (and, with ``hidden_layers``, the graphs also returning those hidden
    states), before anything is timed; returns the seconds spent building (0 when nothing was new)."""
    state = step_state(model)
    if widths is not None:
        state.set_widths(widths)
    runner = StepRunner(model)
    runner._reserve(length)
    pointer = runner.cache.layers[0].keys.data_ptr()
    wanted = [(w, ()) for w in state.widths] + [(w, tuple(hidden_layers)) for w in state.widths if hidden_layers]
    todo = [(w, layers) for w, layers in wanted if (w, state.capacity, pointer, layers) not in state.built]
    if not todo:
        return 0.0
    say(f"compiling {type(model).__name__}'s {STEP_LABEL}: widths {', '.join(str(w) for w, _ in todo)}, "
        f"cache of {state.capacity} positions ({'CUDA graphs' if state.cuda else 'inductor'})")
    before, state.cache_count = state.compile_seconds, CacheCount()
    ids = torch.zeros((1, max(state.widths)), dtype=torch.long, device=state.device)
    for _ in range(2 if state.cuda else 1):  # CUDA graphs record on the run after their warm-up
        for width, layers in todo:
            runner.hidden_layers = layers
            runner(ids[:, :width], width)
            runner.rollback(0)
    state.cache_count.finish()
    state.prepared_seconds = state.compile_seconds - before
    return state.prepared_seconds


def step_source(model: Module) -> str:
    """Where the last ``prepare_step`` got its graphs ("cached", "fresh", ...), "" when none."""
    state = _STATES.get(model)
    return state.cache_count.source if state is not None else ""


def step_label(model: Module) -> str:
    """How ``model``'s passes run, for the header lines: "compiled lean Llama step (...)"."""
    state = _STATES.get(model)
    how = "CUDA graphs" if model_device(model).type == "cuda" else "inductor"
    widths = "/".join(map(str, state.widths if state is not None else WIDTHS))
    capacity = f", cache of {state.capacity} positions" if state is not None and state.capacity else ""
    built = f", compiled in {state.prepared_seconds:.0f} s" if state is not None and state.prepared_seconds else ""
    return f"{STEP_LABEL} ({how}, one graph per pass width {widths}{capacity}{built})"
