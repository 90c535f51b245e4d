"""Compiled passes: a runner whose decoding and verification passes are ``torch.compile``d graphs
over a static KV cache kept per model (gpt-fast's ``prefill`` / ``decode_one_token`` /
``model_forward`` split, on transformers' own models and ``StaticCache``).

* One graph per pass-length bucket (``BUCKETS``: 1 for decoding, 2-32 for verification); a pass
  over r new positions runs in the smallest bucket >= r, the extra positions are padding whose
  keys and values are written past the sequence and forgotten by moving the write position back.
  A pass over more positions than the largest bucket (a prompt) runs eagerly into the same cache, and
  so does every pass of a model with forward hooks (``runners.hooks``: a graph would run none).
* On CPU: the model's kernels (``set_prepack``): prepacked linears as one opaque call each
  (``kernels.prepacking.packed_linear``), or the model's own with inductor's ``freezing`` (weights
  become constants, packed for MKL; ``FREEZING``); graphs are kept on disk (``kernels.compile_cache``);
  on CUDA: CUDA graphs (``mode="reduce-overhead"``), each output cloned before the next replay.
* The cache is kept per model and reused across prompts and strategies: a runner takes one from
  the model's pool (``_Compiled.caches``) and gives it back when it is dropped; its capacity is a
  power of two chosen once (``prepare``), so that steady state never compiles anything new.
  ``compile_events`` counts every graph built; a graph built after ``prepare`` is a bug the tests catch.
"""
import contextlib
import time
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch._dynamo
from torch import Tensor
from torch.nn import Module

from runners.attention import shared_kv_heads
from runners.cache_kind import cache_keyword
from kernels.compile_cache import CacheCount, use_compile_cache
from kernels.one_copy import keep
from runners.config import why_not_compiled
from runners.device import model_device
from runners.hidden import select_hidden
from runners.hooks import HookWatch
from kernels.plans import plan_label
from kernels.prepacking import plan, prepacked
from runners.static import capacity as cache_capacity, carry, fed, set_length, static_cache
from runners.trees import TreePasses

# inductor's freezing for the model's own CPU linears (their weights constants, packed for this CPU). Freezing
# alone does not keep a graph from inductor's disk cache on torch 2.13 (frozen weights are keyed by shape and
# dtype, bound again from the model at a hit: a float64 model's frozen graphs are kept, tests/test_compile_cache.py);
# what does is the packing (``torch._inductor.config.cpp.weight_prepack``, on by default): a float32 linear's
# weight becomes a oneDNN (mkldnn) tensor, which the cache cannot pickle ("mkldnn tensors unpickleable":
# ``fxgraph_cache_bypass``), so those graphs are compiled at every start (checked on a tiny float32 Llama;
# with the packing off, a second start hits)
FREEZING = True
# the frozen linears' kernels (``--gemm``): "templates", inductor's C++ GEMM templates autotuned against
# MKL when a graph is built, so the faster one per shape on this CPU is kept; "mkl": MKL's alone. On a
# 2-core AVX2 EPYC (docs/profile.md) MKL's 1-row products run on one core at ~12 GB/s, the templates on
# both at ~18 GB/s (a pass 2x faster), but building them takes inductor ~17 min for the embedded model's
# six pass lengths, at every start (measured: its frozen graphs bypassed the cache too), against ~4 min with MKL; "skinny":
# the linears unfrozen, each one opaque call (``packed_linear``) to the skinny kernel up to 12 positions
# (``kernels.skinny``: every core, the weight read once) and MKL past them (``SKINNY_ROUTE``), so the
# graphs are not frozen and inductor's disk cache keeps them
CPU_GEMM = "mkl"
GEMMS = ("mkl", "templates", "skinny")
SKINNY_ROUTE = ("skinny",) * 12 + ("own",)


def set_cpu_gemm(name: str) -> None:
    """The kernels of the frozen linears in graphs built from now on (``GEMMS``)."""
    global CPU_GEMM
    if name not in GEMMS:
        raise ValueError(f"gemm must be one of {', '.join(GEMMS)}, got {name!r}")
    CPU_GEMM = name
BUCKETS = (1, 2, 4, 8, 16, 32)  # 32: suffix decoding's longest draft (24) and a tree of 16 nodes stay compiled
MIN_CAPACITY = 1024


def bucket(rows: int) -> Optional[int]:
    """The smallest compiled pass length holding ``rows`` positions; None past the largest."""
    return next((b for b in BUCKETS if b >= rows), None)


def _capacity(length: int) -> int:
    return max(MIN_CAPACITY, 1 << (max(1, length) - 1).bit_length())


class _Compiled:
    """A model's compiled forward, its input buffers and its pool of static caches (one capacity)."""

    def __init__(self, model: Module):
        import torch._dynamo

        # one graph per bucket and capacity, for every model of the session: past the default limit of 8
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 1024)
        torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 4096)
        use_compile_cache()  # built once per machine: later starts read the graphs from the disk
        keep(model)  # its layers under the graphs stay as they are: the C step of an eager row frees no weight of theirs
        self._model = weakref.ref(model)  # weakly: the state is the model's value in ``_STATE``
        self.cache_keyword = cache_keyword(model)  # "cache" on transformers 5.24+, else "past_key_values"
        self.device = model_device(model)
        self.cuda = self.device.type == "cuda"
        mode = "reduce-overhead" if self.cuda else None
        self.forward = torch.compile(self._forward, fullgraph=True, dynamic=False, mode=mode)
        self.forward_hidden = torch.compile(self._forward_hidden, fullgraph=True, dynamic=False, mode=mode)
        self.capacity = 0
        self.caches: List = []  # free caches of ``capacity``
        self.ids = {b: torch.zeros((1, b), dtype=torch.long, device=self.device) for b in BUCKETS}
        self.positions = {b: torch.zeros((1, b), dtype=torch.long, device=self.device) for b in BUCKETS}
        self.steps = torch.arange(BUCKETS[-1], device=self.device).unsqueeze(0)
        self.built: set = set()  # (bucket, capacity, cache, prepacked) graphs built
        self.packed = False  # whether the linear layers are prepacked ones (read by every new runner)
        self.compile_seconds = 0.0
        self.cache_count = CacheCount()  # inductor's disk-cache hits and misses of the last ``prepare``
        self.prepared_seconds = 0.0  # what the last ``prepare`` that built something took

    @property
    def model(self) -> Module:
        return self._model()

    def _forward(self, input_ids: Tensor, position_ids: Tensor, cache) -> Tensor:
        return self.model(input_ids=input_ids, position_ids=position_ids, **{self.cache_keyword: cache}, use_cache=True).logits

    def _forward_hidden(self, input_ids: Tensor, position_ids: Tensor, cache, layers: Tuple[int, ...]) -> Tuple[Tensor, Tensor]:
        """The logits and the hidden states entering ``layers`` (``runners.hidden``), in one graph."""
        out = self.model(input_ids=input_ids, position_ids=position_ids, **{self.cache_keyword: cache}, use_cache=True,
                         output_hidden_states=True)
        return out.logits, select_hidden(out.hidden_states, layers)

    def take_cache(self, length: int):
        """A free static cache holding at least ``length`` positions plus one pass of the largest
        bucket; the pool moves to a larger capacity (new graphs) only when ``length`` needs it."""
        capacity = _capacity(length + BUCKETS[-1])
        if capacity > self.capacity:
            self.capacity, self.caches = capacity, []
        if self.caches:
            return self.caches.pop()
        cache = static_cache(self.model, self.capacity)
        if cache is None:
            raise RuntimeError(why_not_compiled(self.model) or "no static cache")
        # one eager pass allocates every layer's keys and values (their heads, dtype and device are
        # the model's), outside any graph: a graph then only ever writes into them. Asking for the
        # hidden states makes transformers install its output-capturing hooks here, under a lock
        # that dynamo cannot trace, rather than inside the first graph that returns them
        one = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        self.model(input_ids=one, position_ids=one, **{self.cache_keyword: cache}, use_cache=True, logits_to_keep=1,
                   output_hidden_states=True)
        set_length(cache, 0)
        # transformers marks them static and unguarded: a graph (frozen on CPU, replayed on CUDA)
        # would keep reading the first cache's tensors for any later cache; guarded, a graph
        # belongs to one cache, and another cache of the pool gets graphs of its own
        for layer in cache.layers:
            for tensor in (layer.keys, layer.values, layer.cumulative_length):
                torch._dynamo.mark_static_address(tensor, guard=True)
        return cache

    def give_back(self, cache) -> None:
        if cache is not None and cache_capacity(cache) == self.capacity:
            self.caches.append(cache)

    def run(self, ids: Tensor, start: int, cache, layers: Tuple[int, ...] = ()) -> Tuple[Tensor, Optional[Tensor]]:
        """Logits ``[r, V]`` of one compiled pass over ``ids`` ``[1, r]`` (r <= the largest bucket)
        at positions ``start..``, and the hidden states ``[r, len(layers) * H]`` entering ``layers``
        (None when none are asked for); the cache's write position is left after the r positions."""
        rows = ids.shape[1]
        size = bucket(rows)
        buffer, positions = self.ids[size], self.positions[size]
        buffer[:, :rows].copy_(ids)
        torch.add(self.steps[:, :size], start, out=positions)
        # a graph per pass length, cache, kernels and hidden layers
        key = (size, self.capacity, cache.layers[0].keys.data_ptr(), self.packed) + ((layers,) if layers else ())
        first = key not in self.built
        clock = time.perf_counter()
        hidden = None
        # the build reads the freezing patch, a replay does not; the attention switch is read by both (a guard)
        with _frozen(first and FREEZING and not self.cuda and not self.packed), \
                (contextlib.nullcontext() if self.cuda else shared_kv_heads(self.model)):
            if layers:
                logits, hidden = self.forward_hidden(buffer, positions, cache, layers)
                logits = logits[0]
            else:
                logits = self.forward(buffer, positions, cache)[0]
        if self.cuda:
            logits = logits.clone()  # the graph's output buffer is overwritten by its next replay
            hidden = hidden.clone() if hidden is not None else None
        if first:
            self.built.add(key)
            compile_events.append((type(self.model).__name__, size, self.capacity))
            if self.cuda:
                torch.cuda.synchronize(self.device)
            self.compile_seconds += time.perf_counter() - clock
        if size != rows:
            set_length(cache, start + rows)
        return logits[:rows], hidden[:rows] if hidden is not None else None


@contextlib.contextmanager
def _frozen(on: bool):
    """Inductor's ``freezing`` (weights as constants, packed for this CPU) while our graphs are built,
    and only then: ``options={"freezing": True}`` is not read, and set globally it broke transformers'
    own compiled static-cache ``generate`` (its cache was taken for a constant)."""
    if not on:
        yield
        return
    import torch._inductor.config

    autotune = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"} if CPU_GEMM == "templates" else {}
    with torch._inductor.config.patch(freezing=True, **autotune):
        yield


compile_events: List[Tuple[str, int, int]] = []  # (model class, bucket, capacity) of every graph built
_STATE: "weakref.WeakKeyDictionary[Module, _Compiled]" = weakref.WeakKeyDictionary()


def compiled(model: Module) -> _Compiled:
    """The model's compiled state, made on first use."""
    state = _STATE.get(model)
    if state is None:
        state = _STATE[model] = _Compiled(model)
    return state


class CompiledRunner(TreePasses):
    """A ``runners.Runner`` over compiled passes: ``runner(ids, n_last)`` returns the logits
    ``[n_last, V]`` of the last ``n_last`` positions of ``ids`` ``[1, L]``, feeding only the positions
    the cache does not hold; ``rollback(length)`` moves the write position back. Same tokens as the
    eager runner up to floating-point rounding (a pass over a bucket of r positions rounds as a
    pass over r positions does). Batch size 1, decoder-only models (``why_not_compiled``)."""

    cache_kind = "static"
    use_cache = True

    def __init__(self, model: Module):
        reason = why_not_compiled(model)
        if reason is not None:
            raise ValueError(reason)
        self.model = model
        self.cache_keyword = cache_keyword(model)  # "cache" on transformers 5.24+, else "past_key_values"
        self.hooks = HookWatch(model)
        self.hooked_passes = 0  # passes run eagerly, the model having forward hooks then
        self.state = compiled(model)
        self.state.packed = prepacked(model)  # the graphs call the same kernels as the eager runner (``set_prepack``)
        self.device = self.state.device
        self.cache = None
        self.cached = 0
        self.forward_passes = 0
        self._release = None
        self.hidden_layers: tuple = ()  # runners.base.Runner: hidden states kept with each pass
        self.hidden = None
        self.hidden_start = 0

    def _reserve(self, length: int) -> None:
        """Hold a cache of the pool with room for ``length`` positions plus one pass of the largest
        bucket: a regrowth mid-generation carries what the old cache holds (``runners.static.carry``)."""
        if self.cache is not None and length + BUCKETS[-1] <= self.cache.layers[0].max_cache_len:  # per pass: inline
            return
        old, self.cache = self.cache, self.state.take_cache(length)
        if old is not None and self.cached:
            carry(old, self.cache, self.cached)
        else:
            set_length(self.cache, 0)
        if self._release is not None:
            self._release.detach()
        self._release = weakref.finalize(self, self.state.give_back, self.cache)

    # no gradients whoever calls: dynamo guards the grad mode, so a caller with it on would rebuild
    # every graph ``prepare`` (under no_grad) built, unseen by ``compile_events``
    @torch.no_grad()
    def __call__(self, ids: Tensor, n_last: int = 1) -> Tensor:
        length, start = ids.shape[1], self.cached
        new = fed(self, ids, n_last)
        hooked = self.hooks.hooked()  # a graph runs no hook: a hooked model's passes run eagerly (``runners.hooks``)
        self.hooked_passes += hooked
        if new.shape[1] > BUCKETS[-1] or hooked:  # a prompt, or a hooked pass: one eager pass into the same cache
            positions = torch.arange(start, length, device=self.device).unsqueeze(0)
            logits = self._eager(dict(input_ids=new, position_ids=positions, logits_to_keep=n_last), start)
        else:
            logits, hidden = self.state.run(new, start, self.cache, self.hidden_layers)
            if hidden is not None:
                self.hidden, self.hidden_start = hidden, start
        self.forward_passes += 1
        self.cached = length
        return logits[-n_last:]

    def rollback(self, length: int) -> None:
        """Forget the cached positions ``length`` and after (no-op when they are not cached)."""
        if self.cached > length:
            set_length(self.cache, length)
            self.cached = length

    # draft trees (``TreePasses``): the tree pass runs eagerly into the static cache (a tree's mask
    # is an input the compiled graphs do not take); the chain passes around it stay compiled
    def _tree_room(self, length: int) -> int:
        """A cache of the pool for ``length`` positions; the tree mask spans its capacity."""
        self._reserve(length)
        return cache_capacity(self.cache)

    def _tree_forward(self, kwargs: dict, start: int, n: int) -> Tensor:
        """Logits ``[1 + n, V]`` of the tree pass ``kwargs`` feeding positions ``start..``."""
        logits = self._eager(dict(kwargs, logits_to_keep=n + 1), start)
        self.forward_passes += 1
        return logits

    def _eager(self, kwargs: dict, start: int) -> Tensor:
        """Logits ``[n, V]`` of an eager pass into this runner's cache (a prompt, a tree) feeding
        positions ``start..``, keeping the hidden states asked for."""
        out = self.model(**kwargs, **{self.cache_keyword: self.cache}, use_cache=True, output_hidden_states=bool(self.hidden_layers))
        if self.hidden_layers:
            self.hidden, self.hidden_start = select_hidden(out.hidden_states, self.hidden_layers), start
        return out.logits[0]


class NotReady(RuntimeError):
    """``prepare`` stopped building: the graphs would not be ready within its ``limit`` (one line why)."""


def past_limit(spent: float, last: float, built: int, total: int, limit: float) -> Optional[str]:
    """Why graphs would not be ready within ``limit`` seconds, ``built`` of ``total`` having taken ``spent``
    and the last of them ``last`` (each one left taken to cost what the last did: the first pays for
    tracing set-up and cold caches); None where they would."""
    expected = spent + last * (total - built)
    if expected <= limit:
        return None
    return (f"its compiled graphs would be ready in about {expected:.0f} s ({built} of {total} built in {spent:.0f} s), "
            f"past the first-answer limit of {limit:g} s")


@torch.no_grad()
def prepare(model: Module, length: int = MIN_CAPACITY - BUCKETS[-1], say: Callable[[str], None] = lambda text: None,
            hidden_layers: Tuple[int, ...] = (), limit: Optional[float] = None,
            clock: Callable[[], float] = time.perf_counter, plain: bool = True) -> float:
    """Build every graph of ``model`` (each bucket, at the capacity holding ``length`` positions; with
    ``hidden_layers``, each bucket's graph that also returns those hidden states, for a learned head;
    ``plain=False`` with them: those alone, for a runner that always asks for them, one graph a bucket less)
    before anything is timed; returns the seconds spent compiling (0 when nothing was new).
    Tells ``say`` what it compiles and how long it took. With ``limit`` (seconds), raises ``NotReady``
    after a graph when the rest would not be ready within it (``past_limit``, read on ``clock``); the
    graphs built stay built (inductor's disk cache keeps them for the next start)."""
    state = compiled(model)
    runner = CompiledRunner(model)
    runner._reserve(length)
    pointer = runner.cache.layers[0].keys.data_ptr()
    wanted = [(b, tuple(hidden_layers)) for b in BUCKETS if hidden_layers]
    wanted = ([(b, ()) for b in BUCKETS] if plain or not wanted else []) + wanted
    todo = [(b, layers) for b, layers in wanted
            if (b, state.capacity, pointer, state.packed) + ((layers,) if layers else ()) not in state.built]
    if not todo:
        return 0.0
    sizes = sorted({b for b, _ in todo})
    plain_too = any(not layers for _, layers in todo)  # plain=False: the hidden states' graphs alone
    with_hidden = f" ({'and ' * plain_too}with hidden states of layers {list(hidden_layers)})" if any(layers for _, layers in todo) else ""
    say(f"compiling {type(model).__name__}: passes over {', '.join(map(str, sizes))} positions{with_hidden}, "
        f"cache of {state.capacity} positions ({_how(state.cuda, state.packed, next(model.parameters()).dtype, plan(model))})")
    before, state.cache_count = state.compile_seconds, CacheCount()
    ids = torch.zeros((1, BUCKETS[-1]), dtype=torch.long, device=state.device)
    start = clock()
    for round in range(2):  # twice: CUDA graphs record on the run after their warm-up
        for i, (size, layers) in enumerate(todo):
            began = clock()
            runner.hidden_layers = layers
            runner(ids[:, :size], size)
            runner.rollback(0)
            why = past_limit(clock() - start, clock() - began, i + 1, len(todo), limit) if round == 0 and limit is not None else None
            if why is not None:
                raise NotReady(why)
    runner.hidden_layers = ()
    state.cache_count.finish()
    state.prepared_seconds = state.compile_seconds - before
    return state.prepared_seconds


def compile_source(model: Module) -> str:
    """Where the last ``prepare`` of ``model`` got its graphs: "cached" (all from the disk, see
    ``kernels.compile_cache``), "fresh", "partly cached", or "" when it built nothing."""
    state = _STATE.get(model)
    return state.cache_count.source if state is not None else ""


def _how(cuda: bool, packed: bool, dtype: torch.dtype, route: Optional[Tuple[str, ...]] = None) -> str:
    if cuda:
        return "CUDA graphs"
    if packed:
        return "inductor, prepacked linears" if route in (None, ("prepacked",)) else f"inductor, linears on {plan_label(route)}"
    templates = CPU_GEMM == "templates" and dtype in (torch.float32, torch.bfloat16, torch.float16)  # none for float64
    return "inductor, frozen weights" + (", GEMM templates autotuned against MKL" if templates else ", MKL")


def compiled_label(model: Module) -> str:
    """How ``model``'s passes run, for the header lines: "compiled (...)"."""
    state = _STATE.get(model)
    how = _how(model_device(model).type == "cuda", prepacked(model), next(model.parameters()).dtype, plan(model))
    shapes = f", passes of {'/'.join(map(str, BUCKETS))} positions"
    capacity = f", cache of {state.capacity} positions" if state is not None and state.capacity else ""
    source = compile_source(model)
    built = f", compiled in {state.prepared_seconds:.0f} s ({source})" if source else ""
    return f"compiled ({how}{shapes}{capacity}{built})"


def compiled_graphs() -> Dict[str, int]:
    """How many graphs each model class has built so far (for the record and the tests)."""
    counts: Dict[str, int] = {}
    for name, _, _ in compile_events:
        counts[name] = counts.get(name, 0) + 1
    return counts
