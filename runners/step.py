"""``StepRunner``: the lean forward (the Llama family's and its kin's) as compiled steps
(``models.llama_step``), one graph per pass width and key bucket, gpt-fast style
(``torch.compile(mode="reduce-overhead", fullgraph=True)``: one CUDA graph per (width, keys) on CUDA;
inductor's default mode on CPU, where it is only tested). The default runner on CUDA of a model the
lean forward takes (``runners.config.RunnerConfig.step_for``).

* A pass over ``r`` new rows runs in the smallest width >= r (``StepState.widths``); the padded rows are
  written at slots after the valid ones, each attends causally to its own slot, and is then ignored
  (forgotten by moving ``cached``). A pass wider than every width (a prompt, a large tree) runs the
  same step uncompiled into the same cache, over exactly the keys it needs.
* Keys in buckets (``key_bucket``: powers of two from ``MIN_KEYS``): a pass whose last slot is below
  ``K`` attends to the cache's first ``K`` slots, not to its whole capacity.
* Built when? ``StepState.lazy`` (the default: a notebook's calls) builds a graph when a pass first
  needs it. ``prepare_step`` (``runners.step_prepare``) builds the graphs asked for (width 1 first, a progress line each) and
  turns ``lazy`` off: the programs prepare what their enabled rows need before a timed run, and a
  pass with no built graph then takes a built one of a larger bucket, or runs uncompiled; it never
  builds one (``StepState.fallbacks`` counts those passes, and every later pass wider than every
  prepared width: a width the programs forgot to prepare).
* The inputs of a (width, keys) graph (ids, positions, slots, mask) and the cache live at static
  addresses (``mark_static_address``); the cache's capacity is a power of two, taken from a per-model
  pool at the pool's capacity, so that a new runner (every generation makes one) builds no graph.
* A graph is keyed on all it captured of its cache (``cache_key``: capacity, dtype, every layer's keys and
  values) and goes when the cache is freed; a state serves one set of weights (``step_state`` makes a
  new one after a cast or a move, and on CUDA after a load with ``assign=True``: ``weights_key``).
* Chain and tree passes share a graph: a tree only fills the mask and the slots differently.
* A build that fails (a compile, a capture) is one line on stderr (what failed, what runs instead) and
  the header's label says so; that pass and every later one run the step's eager forward.
* With ``hidden_layers`` prepared (a learned head drafts), every graph also returns those layers'
  hidden states, and a pass that wants none takes the same graph: one set of graphs, not two.
* A pass of a model with forward hooks (``runners.hooks``, checked at every pass) runs transformers'
  own forward into the same cache, uncompiled, so that every hook fires (a graph would run none).
* ``compile_events`` (``runners.compiled``) records every graph built, as "<model class> step";
  ``kernels.step_artifacts`` keeps what was built for the next start.
"""
import sys
import time
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch._dynamo
from torch import Tensor
from torch.nn import Module

from kernels.compile_cache import CacheCount, use_compile_cache
from kernels.step_artifacts import artifact_key, load_artifacts
from models.llama import KVCache, lean_unsupported
from models.llama_step import LlamaStep, decoder_layer, zeroed_cache
from runners.compiled import compile_events
from runners.config import step_name
from runners.device import model_device
from runners.hooks import HookWatch, transformers_pass
from runners.static import fed
from runners.step_graphs import (MIN_KEYS, CapturedPasses, cache_key, failure, forget_when_freed, key_bucket,  # noqa: F401
                                 key_buckets, weights_key)
from runners.trees import TreePasses, compute_dtype

WIDTHS = (1, 2, 4, 8, 16, 32)  # a notebook's widths: decoding, chain verification (suffix drafts up to 24), a tree of 16 nodes
MAX_WIDTH = 64  # the widest pass a graph is built for; wider ones (prompts) run uncompiled
MIN_CAPACITY = 1024


def _capacity(length: int) -> int:
    return max(MIN_CAPACITY, 1 << (max(1, length) - 1).bit_length())


class StepState:
    """A model's compiled step, its pool of caches (one capacity), each (width, keys)'s input buffers
    and the graphs built, by (width, keys, the cache's ``cache_key``, hidden layers): a cache's entries go
    when it is freed. One state serves one set of weights (``weights``: ``step_state`` makes a new one
    when a cast or a load with ``assign=True`` moved them)."""

    def __init__(self, model: Module, graphs: str = "regional"):
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 1024)
        torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 4096)
        use_compile_cache()
        self.mode = graphs  # ``RunnerConfig.graphs``: "regional" or "whole" (``runners.step_graphs``)
        self.step = LlamaStep(model)  # refuses a model outside the family, with its reason
        self.eager = LlamaStep(model)  # the same arithmetic, never compiled: prompts, passes without a graph
        self._model = weakref.ref(model)  # weakly: the state is the model's value in ``_STATES``
        self.weights = weights_key(model, model_device(model).type == "cuda")
        self.device, self.dtype = model_device(model), compute_dtype(model)
        self.cuda = self.device.type == "cuda"
        if self.mode == "whole":
            self.compiled = torch.compile(self.step.forward, fullgraph=True, dynamic=False,
                                          mode="reduce-overhead" if self.cuda else None)
        else:  # one compiled layer for every layer; on CUDA the whole pass captured as one CUDA graph
            self.step.layer = torch.compile(decoder_layer, fullgraph=True, dynamic=False)
            self.compiled = CapturedPasses(self.step.forward, self.device) if self.cuda else self.step.forward
        self.capacity = 0
        self.caches: List[KVCache] = []  # free caches of ``capacity``
        self.inputs: Dict[Tuple[int, int], Tuple[Tensor, ...]] = {}  # (width, keys) -> ids, positions, slots, mask
        self.slots = torch.arange(0, device=self.device)  # 0..n-1, grown with the capacity: the masks' comparisons
        self.widths, self.fixed = WIDTHS, False  # ``fixed``: set by ``prepare_step`` (and widened by later calls)
        self.lazy = True  # a pass may build the graph it needs (off once the programs prepare theirs)
        self.hidden_layers: Tuple[int, ...] = ()  # prepared: every graph returns these layers' hidden states
        self.built: set = set()
        self.graphs: set = set()  # (width, keys, hidden layers) built in this process, for the artifacts' line
        self.failure = ""  # why compiling or capturing failed (one line): every pass then runs uncompiled
        self.fallbacks = 0  # passes of at most MAX_WIDTH rows run uncompiled while not lazy (prompts aside)
        self.compile_seconds = self.prepared_seconds = 0.0
        self.cache_count = CacheCount()
        self.artifact_key = artifact_key(model, self.dtype, self.device)
        self.loaded, self.artifact_problem = load_artifacts(self.artifact_key)

    @property
    def model(self) -> Module:
        return self._model()

    def set_widths(self, widths: Sequence[int]) -> None:
        """The widths passes are padded to from now on (1 always among them; the first call replaces
        the notebook's ``WIDTHS``, later ones add to it)."""
        wanted = {min(int(w), MAX_WIDTH) for w in widths} | {1}
        self.widths = tuple(sorted(wanted | (set(self.widths) if self.fixed else set())))
        self.fixed = True

    def width(self, rows: int) -> Optional[int]:
        """The smallest width holding ``rows``; None past the largest."""
        return next((w for w in self.widths if w >= rows), None)

    def take_cache(self, length: int) -> KVCache:
        """A free cache holding ``length`` positions plus one pass of the largest width (zeroed, static
        addresses), of the pool's capacity or larger: the pool moves to a larger capacity only when it must."""
        capacity = max(_capacity(length + max(self.widths)), self.capacity)
        if capacity > self.capacity:
            self.capacity, self.caches = capacity, []
            self.slots = torch.arange(capacity, device=self.device)
        if self.caches:
            return self.caches.pop()
        cache = zeroed_cache(self.model, capacity, self.dtype, self.device)
        for layer in cache.layers if self.mode == "whole" else ():  # regional: a captured graph holds its addresses itself
            torch._dynamo.mark_static_address(layer.keys, guard=True)
            torch._dynamo.mark_static_address(layer.values, guard=True)
        return cache

    def give_back(self, cache: KVCache) -> None:
        if cache.capacity == self.capacity:
            self.caches.append(cache)

    def buffers(self, width: int, keys: int) -> Tuple[Tensor, ...]:
        """The inputs of the (``width``, ``keys``) graph: ids, positions, slots ``[width]`` and the boolean
        mask ``[1, 1, width, keys]``."""
        made = self.inputs.get((width, keys))
        if made is None:
            long = dict(dtype=torch.long, device=self.device)
            made = (torch.zeros(width, **long), torch.zeros(width, **long), torch.zeros(width, **long),
                    torch.zeros((1, 1, width, keys), dtype=torch.bool, device=self.device))
            for tensor in made if self.mode == "whole" else ():
                torch._dynamo.mark_static_address(tensor, guard=True)
            self.inputs[(width, keys)] = made
        return made

    def graph(self, rows: int, start: int, cache: KVCache, layers: Tuple[int, ...]) -> Optional[Tuple[int, int, Tuple[int, ...]]]:
        """The graph a pass of ``rows`` from slot ``start`` runs: ``(width, keys, layers)``, or None (uncompiled).
        Lazy: the smallest width and bucket, built if new. Else a built one: the smallest width, then the
        smallest bucket holding the pass, with the prepared hidden layers where the pass wants none."""
        width = self.width(rows)
        if width is None or start + width > cache.capacity or self.failure:
            return None
        keys, held = key_bucket(start + width, cache.capacity), cache_key(cache)
        options = [layers] + ([self.hidden_layers] if not layers and self.hidden_layers else [])
        if self.lazy:
            return width, keys, options[-1] if (width, keys, held, options[-1]) in self.built else layers
        for bucket in key_buckets(keys, cache.capacity, cache.capacity):
            for kept in options:
                if (width, bucket, held, kept) in self.built:
                    return width, bucket, kept
        return None

    def chain(self, new: Tensor, start: int, cache: KVCache, n_last: int, layers: Tuple[int, ...]):
        """A causal pass of ``new`` ``[r]`` at positions (and slots) ``start..``: logits ``[n_last, V]``, hidden ``[r, .]``."""
        rows = new.shape[0]
        chosen = self.graph(rows, start, cache, layers)
        if chosen is None:
            return self._uncompiled(new, torch.arange(start, start + rows, device=self.device), start, None, cache, n_last, layers)
        width, keys, kept = chosen
        ids, positions, slots, mask = self.buffers(width, keys)
        ids[:rows].copy_(new, non_blocking=True)
        torch.add(self.slots[:width], start, out=positions)
        slots.copy_(positions)
        torch.le(self.slots[None, :keys], positions[:, None], out=mask[0, 0])
        return self.run(width, keys, cache, rows, n_last, kept, layers)

    def tree(self, new: Tensor, positions_in: Tensor, allowed: Tensor, start: int, cache: KVCache, layers: Tuple[int, ...]):
        """A tree pass: ``new`` ``[m]`` at ``positions_in`` ``[m]``, row ``i`` at slot ``start + i``,
        attending where ``allowed`` ``[1, 1, m, C]`` (boolean; nothing at or past slot ``start + m``);
        logits ``[m, V]``, hidden ``[m, .]``."""
        rows = new.shape[0]
        chosen = self.graph(rows, start, cache, layers)
        if chosen is None:
            return self._uncompiled(new, positions_in, start, allowed[..., : start + rows], cache, rows, layers)
        width, keys, kept = chosen
        ids, positions, slots, mask = self.buffers(width, keys)
        ids[:rows].copy_(new)
        torch.add(self.slots[:width], start, out=slots)
        positions.copy_(slots)  # padded rows: at their own slot, causal, finite
        positions[:rows].copy_(positions_in)
        torch.le(self.slots[None, :keys], slots[:, None], out=mask[0, 0])
        mask[0, 0, :rows].copy_(allowed[0, 0, :, :keys])
        return self.run(width, keys, cache, rows, rows, kept, layers)

    def _uncompiled(self, new: Tensor, positions: Tensor, start: int, mask: Optional[Tensor], cache: KVCache, n_last: int,
                    layers: Tuple[int, ...]):
        """The step's forward without a graph, over exactly the keys the pass needs (a prompt, a pass too
        wide, or one with no built graph outside lazy mode)."""
        rows = new.shape[0]
        if mask is None:
            mask = (self.slots[None, : start + rows] <= positions[:, None])[None, None]
        if not self.lazy and (rows <= max(self.widths) or 0 < start and rows <= MAX_WIDTH):
            self.fallbacks += 1  # a pass a graph could have run (a sequence's first pass, its prompt, is not one)
        slots = torch.arange(start, start + rows, device=self.device)
        return self.eager.forward(new, positions, slots, mask, cache, n_last, layers)

    def run(self, width: int, keys: int, cache: KVCache, rows: int, n_last: int, kept: Tuple[int, ...], layers: Tuple[int, ...]):
        """Replay (or build) the (``width``, ``keys``, ``kept``) graph over its buffers; the valid rows'
        outputs (hidden states only where ``layers`` asked), cloned on CUDA."""
        held = cache_key(cache)
        key = (width, keys, held, kept)
        first, clock = key not in self.built, time.perf_counter()
        if self.cuda and self.mode == "whole":
            torch.compiler.cudagraph_mark_step_begin()
        try:
            logits, hidden = self.compiled(*self.buffers(width, keys), cache, width, kept)
        except Exception as error:  # a build that failed (a replay that fails is a bug: raised)
            if not first:
                raise
            self._failed(error, width, keys)
            logits, hidden = self.eager.forward(*self.buffers(width, keys), cache, width, kept)  # the same pass, uncompiled
            first = False
        logits = logits[rows - n_last: rows]
        hidden = hidden[:rows] if hidden is not None and layers else None
        if self.cuda:  # a graph's outputs are overwritten by its next replay
            logits, hidden = logits.clone(), hidden.clone() if hidden is not None else None
        if first:
            if not any(other[2] == held for other in self.built):
                forget_when_freed(self, cache, held)
            self.built.add(key)
            self.graphs.add((width, keys, kept))
            compile_events.append((f"{type(self.model).__name__} step", width, keys))
            if self.cuda:
                torch.cuda.synchronize(self.device)
            self.compile_seconds += time.perf_counter() - clock
        return logits, hidden

    def _failed(self, error: Exception, width: int, keys: int) -> None:
        """Say in one line (stderr) what failed and what runs instead; every later pass runs uncompiled."""
        self.failure = failure("capturing" if self.cuda and self.mode == "regional" else "compiling", error, width, keys)
        print(f"{type(self.model).__name__}'s {step_name(self.model)}: {self.failure}; its passes run the step's eager forward "
              "(uncompiled) from now on", file=sys.stderr)

    def forget(self, held: tuple) -> None:
        """Drop the entries of the cache whose ``cache_key`` is ``held`` (it was freed: a new cache at its
        addresses has no graph yet)."""
        self.built = {key for key in self.built if key[2] != held}


# a state holds its model weakly (and its steps too): a value that referred to its key would keep the
# model, its pool of caches and every graph alive for the whole process
_STATES: "weakref.WeakKeyDictionary[Module, StepState]" = weakref.WeakKeyDictionary()


def step_state(model: Module, graphs: Optional[str] = None) -> StepState:
    """The model's compiled step, made on first use, and made again when its weights moved (a cast, a
    move; on CUDA a load with ``assign=True`` too: ``weights_key``) or when ``graphs`` (the
    run's ``RunnerConfig.graphs``; None: the state's own, "regional" for a new one) asks for the other
    mode. Read when a runner is made (every generation makes one) and by ``prepare_step``; a runner made
    before the change keeps the old state."""
    state = _STATES.get(model)
    if state is None or state.weights != weights_key(model, state.cuda) or graphs not in (None, state.mode):
        state = _STATES[model] = StepState(model, graphs or (state.mode if state is not None else "regional"))
    return state


class StepRunner(TreePasses):
    """A ``runners.Runner`` over ``StepState``'s compiled steps: ``runner(ids, n_last)`` returns the
    logits ``[n_last, V]`` of the last ``n_last`` positions of ``ids`` ``[1, L]``, feeding only
    ``ids[:, cached:]``; ``rollback(length)`` only moves ``cached`` (masked slots are never read).
    Tree passes (``TreePasses``) run the (width, keys) graph with the tree's mask.
    No ``.item()``, no host sync: the loop's one sync per step is the only one."""

    cache_kind = "static"
    use_cache = True
    compiled_step = True  # a learned head drafting for it runs its own compiled step (``eagle.head_step``)

    def __init__(self, model: Module, graphs: Optional[str] = None):
        reason = lean_unsupported(model)
        if reason is not None:
            raise ValueError(reason)
        self.model = model
        self.state = step_state(model, graphs)  # graphs: ``RunnerConfig.graphs`` (None: the state's)
        self.device = self.state.device
        self.cache: Optional[KVCache] = None
        self.cached = 0
        self.forward_passes = 0
        self._release = None
        self.hidden_layers: tuple = ()  # runners.base.Runner: hidden states kept with each pass
        self.hidden: Optional[Tensor] = None
        self.hidden_start = 0
        self.hooks = HookWatch(model)
        self.hooked_passes = 0  # passes run on transformers' forward, the model having hooks then

    def __call__(self, ids: Tensor, n_last: int = 1) -> Tensor:
        length, start = ids.shape[1], self.cached
        new = fed(self, ids, n_last)[0]
        with torch.no_grad():
            if self.hooks.hooked():
                logits, hidden = self._hooked(new, torch.arange(start, length, device=self.device), start, n_last, None)
            else:
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
    def _tree_refusal(self) -> Optional[str]:
        """None: the step takes every model it runs through a tree (a sliding layer's mask cut by the
        positions its slots hold, ``models.llama_step``; its cache keeping every layer's full length)."""
        return None

    def _tree_room(self, length: int) -> int:
        self._reserve(length)
        return self.cache.capacity

    def _tree_forward(self, kwargs: dict, start: int, n: int) -> Tensor:
        """Logits ``[1 + n, V]`` of the tree pass ``kwargs`` (``runners.trees.tree_inputs``) from ``start``."""
        ids, positions, mask = kwargs["input_ids"][0], kwargs["position_ids"][0], kwargs["attention_mask"]
        with torch.no_grad():
            if self.hooks.hooked():
                logits, hidden = self._hooked(ids, positions, start, n + 1, mask)
            else:
                logits, hidden = self.state.tree(ids, positions, mask == 0, start, self.cache, self.hidden_layers)
        self._passed(hidden, start)
        return logits[-(n + 1):]

    def _hooked(self, ids: Tensor, positions: Tensor, start: int, n_last: int, mask: Optional[Tensor]):
        """A pass of the hooked model on transformers' forward (``runners.hooks.transformers_pass``)."""
        self.hooked_passes += 1
        return transformers_pass(self.model, ids, positions, self.cache, start, n_last, mask, self.hidden_layers)


def step_source(model: Module) -> str:
    """Where the last ``prepare_step`` got its graphs ("cached", "fresh", ...), "" when none."""
    state = _STATES.get(model)
    return state.cache_count.source if state is not None else ""


def step_label(model: Module) -> str:
    """How ``model``'s passes run, for the header lines: "compiled lean Qwen3 step (...)" (``step_name``)."""
    state = _STATES.get(model)
    how = "CUDA graphs" if model_device(model).type == "cuda" else "inductor"
    widths = "/".join(map(str, state.widths if state is not None else WIDTHS))
    capacity = f", cache of {state.capacity} positions" if state is not None and state.capacity else ""
    built = f", compiled in {state.prepared_seconds:.0f} s" if state is not None and state.prepared_seconds else ""
    reused = f", {len(state.loaded)} graphs' artifacts reused" if state is not None and state.loaded else ""
    if state is not None and state.failure:
        return f"{step_name(model)} (compile failed, every pass runs uncompiled: {state.failure})"
    if state is not None and state.artifact_problem:  # a file was there and was not loaded: say why
        reused = f", saved artifacts not loaded: {state.artifact_problem}"
    mode = state.mode if state is not None else "regional"
    compiled = "one decoder layer compiled for all, each pass captured whole" if mode == "regional" else "each pass compiled whole"
    return (f"{step_name(model)} ({how}, {compiled}, one graph per pass width {widths} and key bucket (from {MIN_KEYS} keys, "
            f"powers of two){capacity}{built}{reused})")
