"""The EAGLE-3 head's draft step as compiled steps, for a target on the compiled lean step (CUDA's
default; ``runners.step``): the head's one decoder layer over a KV cache at a static address, written
with ``index_copy_`` at a tensor of slots, attending to a key bucket under a boolean mask, compiled
gpt-fast style (``torch.compile(fullgraph=True, dynamic=False)``, ``mode="reduce-overhead"``: one CUDA
graph per (width, keys) on CUDA; inductor's default mode on CPU, where it is only tested).

``HeadStep(head)`` is one sequence's decoder: ``decode(embeds, hidden, start, mask, positions)`` is
``Eagle3Head.decode`` with the drafter's cache inside. A feed of ``m`` rows runs in the smallest width
``>= m`` (``WIDTHS``: 1, and the widest a chain's catch-up or a tree depth feeds), the padded rows
written after the valid ones (never attended to by them, overwritten by the next feed). Wider feeds run
the same arithmetic uncompiled. The graphs live per head (``head_steps``), its caches in a pool of one
capacity, so every generation's drafter replays the graphs built before. Like the target's step, a
state is lazy (builds what a feed needs) until ``prepare_head_step`` built what the programs' rows
need; then a feed without a graph runs uncompiled and counts in ``fallbacks``.

Shapes: ``m`` rows fed, ``H`` the head's hidden size, ``C`` the cache's capacity, ``K <= C`` keys attended."""
import sys
import weakref
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from eagle.head import Eagle3Head, HeadCache
from runners.compiled import compile_events
from runners.step import key_bucket, key_buckets
from runners.step_graphs import failure, forget_when_freed, weights_key

WIDTHS = (1, 8)  # a draft step; a chain's catch-up (at most gamma + 1 rows) and a tree depth (top_k rows), padded
MAX_WIDTH = 64  # the widest feed a graph is built for (``runners.step``'s): a wider one (a prompt) runs uncompiled
MIN_CAPACITY = 1024


def head_cache_key(cache: HeadCache) -> tuple:
    """What a graph captures of ``cache``: its capacity, dtype and the keys' and values' addresses."""
    return cache.keys.shape[2], cache.keys.dtype, cache.keys.device, cache.keys.data_ptr(), cache.values.data_ptr()


class HeadSteps:
    """A head's compiled decode, its pool of caches (one capacity) and the (width, keys, ``head_cache_key``)
    graphs built (a cache's entries go when it is freed). One state serves one set of weights
    (``weights``: ``head_steps`` makes a new one after a cast or a move, and on CUDA after a load with
    ``assign=True``: ``runners.step_graphs.weights_key``)."""

    def __init__(self, head: Eagle3Head):
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 1024)
        self._head = weakref.ref(head)  # weakly: the state is the head's value in ``_STEPS``
        self.weights = weights_key(head, head.fc.weight.device.type == "cuda")
        weight = head.fc.weight
        self.device, self.dtype, self.cuda = weight.device, weight.dtype, weight.device.type == "cuda"
        self.compiled = torch.compile(self.forward, fullgraph=True, dynamic=False, mode="reduce-overhead" if self.cuda else None)
        self.capacity, self.caches = 0, []
        self.slots = torch.arange(0, device=self.device)
        self.inputs: dict = {}  # (width, keys) -> the graph's input buffers
        self.widths = WIDTHS  # widened by ``prepare_head_step`` (a catch-up under ``/gamma auto``: up to 12 rows)
        self.lazy, self.fallbacks = True, 0
        self.failure = ""  # why compiling or capturing failed (one line): every feed then runs uncompiled
        self.built: set = set()

    @property
    def head(self) -> Eagle3Head:
        return self._head()

    def take_cache(self, length: int) -> HeadCache:
        """A free zeroed cache of the pool's capacity (grown to hold ``length`` plus a wide feed)."""
        capacity = max(self.capacity, MIN_CAPACITY, 1 << (length + max(self.widths) - 1).bit_length())
        if capacity > self.capacity:
            self.capacity, self.caches = capacity, []
            self.slots = torch.arange(capacity, device=self.device)
        if self.caches:
            return self.caches.pop()
        cache = HeadCache(self.head, capacity, self.device, self.dtype)
        torch._dynamo.mark_static_address(cache.keys, guard=True)
        torch._dynamo.mark_static_address(cache.values, guard=True)
        return cache

    def give_back(self, cache: HeadCache) -> None:
        if cache.keys.shape[2] == self.capacity:
            self.caches.append(cache)

    def forward(self, embeds: Tensor, hidden: Tensor, positions: Tensor, slots: Tensor, mask: Tensor, cache: HeadCache) -> Tensor:
        """The head's layer on ``embeds``/``hidden`` ``[1, m, H]`` at RoPE ``positions`` ``[m]``, keys and
        values written at ``slots`` ``[m]``, attending where ``mask`` ``[1, 1, m, K]`` allows -> ``[1, m, H]``."""
        head = self.head
        layer = head.layers[0]
        x, residual = layer.inputs(embeds, hidden)
        cos, sin = head.rotary(positions.unsqueeze(0))
        q, k, v = layer.self_attn.qkv(x, cos, sin)
        cache.keys.index_copy_(2, slots, k)
        cache.values.index_copy_(2, slots, v)
        keys = mask.shape[-1]
        attended = F.scaled_dot_product_attention(q, cache.keys[:, :, :keys], cache.values[:, :, :keys], attn_mask=mask,
                                                  enable_gqa=True)
        return layer.finish(attended, residual)

    @torch.no_grad()  # as the graphs were built: grad mode is part of what they are guarded on
    def decode(self, cache: HeadCache, embeds: Tensor, hidden: Tensor, start: int, mask: Optional[Tensor] = None,
               positions: Optional[Tensor] = None) -> Tensor:
        """``Eagle3Head.decode`` over ``cache`` (one of the pool's): ``m`` rows into slots ``start..``, each
        attending to the slots before ``start`` and causally among themselves, or where ``mask``
        ``[m, start + m]`` allows, at ``positions`` ``[m]`` (default ``start..``); returns ``[1, m, H]``."""
        m = embeds.shape[1]
        width = next((w for w in self.widths if w >= m), None)
        if positions is None:
            positions = torch.arange(start, start + m, device=self.device)
        if width is None or start + width > cache.keys.shape[2] or self.failure:
            if width is None and not self.lazy and start > 0 and m <= MAX_WIDTH:  # a graph could have run it
                self.fallbacks += 1
            return self._uncompiled(cache, embeds, hidden, start, mask, positions)
        keys = key_bucket(start + width, cache.keys.shape[2])
        held = head_cache_key(cache)
        key = (width, keys, held)
        first = key not in self.built
        if first:
            if not self.lazy:
                self.fallbacks += 1
                return self._uncompiled(cache, embeds, hidden, start, mask, positions)
            if not any(other[2] == held for other in self.built):
                forget_when_freed(self, cache, held)
            self.built.add(key)
            compile_events.append(("Eagle3Head step", width, keys))
        embeds_in, hidden_in, positions_in, slots, full = self.buffers(width, keys)
        embeds_in[:, :m].copy_(embeds)
        hidden_in[:, :m].copy_(hidden)  # padded rows: whatever the last feed left (finite), never attended to by valid rows
        torch.add(self.slots[:width], start, out=slots)
        positions_in.copy_(slots)
        positions_in[:m].copy_(positions)
        torch.le(self.slots[None, :keys], slots[:, None], out=full[0, 0])  # padded rows: causal, at their own slots
        if mask is not None:
            full[0, 0, :m, : start + m].copy_(mask)
            full[0, 0, :m, start + m:] = False
        if self.cuda:
            torch.compiler.cudagraph_mark_step_begin()
        try:
            out = self.compiled(embeds_in, hidden_in, positions_in, slots, full, cache)[:, :m]
        except Exception as error:  # a build that failed (a replay that fails is a bug: raised)
            if not first:
                raise
            self.built.discard(key)
            self.failure = failure("compiling", error, width, keys)
            print(f"the EAGLE-3 head's draft step: {self.failure}; its feeds run eagerly (uncompiled) from now on", file=sys.stderr)
            return self.forward(embeds_in, hidden_in, positions_in, slots, full, cache)[:, :m]
        return out.clone() if self.cuda else out  # a graph's output is overwritten by its next replay

    def forget(self, held: tuple) -> None:
        """Drop the entries of the cache whose ``head_cache_key`` is ``held`` (it was freed)."""
        self.built = {key for key in self.built if key[2] != held}

    def buffers(self, width: int, keys: int) -> Tuple[Tensor, ...]:
        """The (``width``, ``keys``) graph's inputs at static addresses: embeddings and hidden states
        ``[1, width, H]``, positions and slots ``[width]``, the mask ``[1, 1, width, keys]``."""
        made = self.inputs.get((width, keys))
        if made is None:
            size, on = self.head.config.hidden_size, dict(device=self.device)
            made = (torch.zeros((1, width, size), dtype=self.dtype, **on), torch.zeros((1, width, size), dtype=self.dtype, **on),
                    torch.zeros(width, dtype=torch.long, **on), torch.zeros(width, dtype=torch.long, **on),
                    torch.zeros((1, 1, width, keys), dtype=torch.bool, **on))
            for tensor in made:
                torch._dynamo.mark_static_address(tensor, guard=True)
            self.inputs[(width, keys)] = made
        return made

    def _uncompiled(self, cache: HeadCache, embeds: Tensor, hidden: Tensor, start: int, mask: Optional[Tensor],
                    positions: Tensor) -> Tensor:
        m = embeds.shape[1]
        full = self.slots[None, : start + m] <= self.slots[start: start + m, None] if mask is None else mask
        return self.forward(embeds, hidden, positions, self.slots[start: start + m], full[None, None], cache)


_STEPS: "weakref.WeakKeyDictionary[Eagle3Head, HeadSteps]" = weakref.WeakKeyDictionary()


def head_steps(head: Eagle3Head) -> HeadSteps:
    """The head's compiled decode, made on first use, and made again when its weights moved (a cast, a
    move; on CUDA a load with ``assign=True`` too), read at each generation's ``HeadStepCache``."""
    steps = _STEPS.get(head)
    if steps is None or steps.weights != weights_key(head, steps.cuda):
        steps = _STEPS[head] = HeadSteps(head)
    return steps


class HeadStepCache:
    """What the drafter holds for one generation: a cache of the pool's, given back when dropped, and
    the compiled decode over it (``decode`` has ``Eagle3Head.decode``'s arguments after the cache)."""

    def __init__(self, head: Eagle3Head, length: int):
        self.head, self.steps = head, head_steps(head)
        self._held = [self.steps.take_cache(length)]  # the cache held now: given back when the holder is dropped
        weakref.finalize(self, _give_back, self.steps, self._held)

    @property
    def cache(self) -> HeadCache:
        return self._held[0]

    def decode(self, embeds: Tensor, hidden: Tensor, start: int, mask: Optional[Tensor] = None,
               positions: Optional[Tensor] = None) -> Tensor:
        if start + embeds.shape[1] + max(self.steps.widths) > self.cache.keys.shape[2]:  # past its capacity: a larger one, carried
            old, new = self.cache, self.steps.take_cache(start + embeds.shape[1])
            new.keys[:, :, :start].copy_(old.keys[:, :, :start])
            new.values[:, :, :start].copy_(old.values[:, :, :start])
            self._held[0] = new
        return self.steps.decode(self.cache, embeds, hidden, start, mask, positions)


    def draft_step(self, ids: Tensor, start: int, hidden: Optional[Tensor] = None, features: Optional[Tensor] = None,
                   mask: Optional[Tensor] = None, positions: Optional[Tensor] = None, n_last: int = 1) -> Tuple[Tensor, Tensor]:
        """``Eagle3Head.draft_step`` on the compiled decode: tokens ``ids`` ``[m]`` with ``hidden`` ``[m, H]`` or
        the target's ``features`` ``[m, F]`` (fused by ``fc``); outputs ``[m, H]`` and the draft logits of
        the last ``n_last`` rows ``[n_last, Vd]`` (the output layer and ``fc`` run around the graph)."""
        head = self.head
        if features is not None:
            hidden = head.fc(features.to(head.fc.weight.dtype))
        out = self.decode(head.embed(ids.unsqueeze(0)), hidden.unsqueeze(0), start, mask, positions)[0]
        return out, head.logits(out[out.shape[0] - n_last:])


def _give_back(steps: HeadSteps, held: List[HeadCache]) -> None:
    steps.give_back(held[0])


@torch.no_grad()
def prepare_head_step(head: Eagle3Head, first: int, last: int, say: Callable[[str], None] = lambda text: None,
                      widths: Sequence[int] = ()) -> int:
    """Build the head's graphs (each width of ``WIDTHS``, and of ``widths``: the widest catch-up a row
    feeds, at most ``MAX_WIDTH``, added to the state's, at each key bucket between slot ``first - 1``
    and ``last``) before anything is timed, a line each; then the state is no longer lazy. Returns the
    number of graphs built."""
    steps = head_steps(head)
    steps.widths = tuple(sorted(set(steps.widths) | {min(int(w), MAX_WIDTH) for w in widths}))
    holder = HeadStepCache(head, last)
    cache, size = holder.cache, head.config.hidden_size
    todo: List[Tuple[int, int]] = [(w, k) for w in steps.widths for k in key_buckets(max(1, first), last + w, cache.keys.shape[2])
                                   if (w, k, head_cache_key(cache)) not in steps.built]
    steps.lazy = True
    for i, (width, keys) in enumerate(sorted(todo, key=lambda wk: (wk[1], wk[0]))):
        say(f"compiling the EAGLE-3 head's draft step: graph {i + 1} of {len(todo)}, width {width}, {keys} keys "
            f"({'CUDA graph' if steps.cuda else 'inductor'})")
        zeros = torch.zeros((1, width, size), device=steps.device, dtype=steps.dtype)
        for _ in range(2 if steps.cuda else 1):  # a CUDA graph records on the run after its warm-up
            steps.decode(cache, zeros, zeros.clone(), keys // 2, None)
    steps.lazy = False
    return len(todo)
