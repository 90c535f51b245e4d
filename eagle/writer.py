"""The head's training answers written fast: a batched greedy decode loop of ours over a static KV
cache whose rows are refilled with new questions as soon as enough of them have finished.

* **Cache by row and position** (``SlotCache``): transformers' ``StaticLayer`` storage
  ``[B, kv heads, capacity, head dim]``, but each row writes its keys and values at its own
  positions (slot = position), so rows at different lengths share one decoding pass. What a row may
  read is given by a 4-D additive mask ``[B, 1, q, capacity]``: slot ``j`` is visible to a query at
  position ``p`` when ``j <= p``. A refilled row's stale slots past its position are never visible,
  and are written over as it grows.
* **Prefill** of new questions: only the rows being (re)filled, right-padded to the longest of them
  (the pads' slots lie past their row's prompt, unseen, and written over by its first answer tokens).
* **Decode**: one token for every row a pass, the argmax of its logits (the first maximum, as
  ``generate``). A row stops being written at an end token or at the answer budget; its slot is
  refilled from the queue once a quarter of the batch is free (``REFILL``) or nothing is live.
  Refilling, rather than compacting the batch, keeps every pass full of live rows until the queue
  is empty, so a long answer never holds a half-empty batch waiting for it.
* On CUDA the decoding pass may be compiled (``torch.compile(mode="reduce-overhead")``: CUDA graphs,
  one shape); on CPU nothing is compiled unless asked. The CUDA path is written for, not tested here.

Greedy output equals transformers' greedy ``generate`` on each prompt alone wherever no two logits are
within rounding of each other (tested in float32; in bfloat16 a near-tie can flip, as between any two
batchings of the same model).
"""
import functools
from collections import deque
from typing import Deque, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from runners.attention import shared_kv_heads

REFILL = 4  # rows are refilled when at least batch // REFILL of them are free (or none is live)


class SlotLayer:
    """One layer's keys and values ``[rows, kv heads, capacity, head dim]``, written at ``owner.slots``."""

    is_compileable, is_sliding, is_initialized = True, False, False

    def __init__(self, owner: "SlotCache"):
        self.owner = owner
        self.keys: Optional[Tensor] = None
        self.values: Optional[Tensor] = None

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> Tuple[Tensor, Tensor]:
        """Write ``key_states`` / ``value_states`` ``[b, heads, q, dim]`` of rows ``owner.rows`` (all
        when None) at slots ``owner.slots`` ``[b, q]``; returns those rows' whole keys and values
        (the first ``owner.limit`` slots)."""
        owner = self.owner
        if not self.is_initialized:
            shape = (owner.batch, key_states.shape[1], owner.capacity)
            self.keys = key_states.new_zeros(*shape, key_states.shape[-1])
            self.values = value_states.new_zeros(*shape, value_states.shape[-1])
            if not torch.compiler.is_compiling():
                torch._dynamo.mark_static_address(self.keys)
                torch._dynamo.mark_static_address(self.values)
            self.is_initialized = True
        slots, rows = owner.slots, owner.rows
        if rows is None:
            where = slots[:, None, :, None]
            self.keys.scatter_(2, where.expand_as(key_states), key_states)
            self.values.scatter_(2, where.expand_as(value_states), value_states)
            keys, values = self.keys, self.values
        else:
            self.keys[rows[:, None], :, slots] = key_states.transpose(1, 2)
            self.values[rows[:, None], :, slots] = value_states.transpose(1, 2)
            keys, values = self.keys[rows], self.values[rows]
        limit = owner.limit
        return (keys, values) if limit is None else (keys[:, :, :limit], values[:, :, :limit])


def supported(model: Module) -> Optional[str]:
    """Why ``model`` cannot be written with (None when it can): every layer must be full attention
    over plain keys and values (a sliding window would need its own mask), taking ``position_ids``."""
    config = model.config.get_text_config(decoder=True)
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder model"
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        return f"layers of kinds {sorted(kinds)} (only full attention is written by slot)"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True) and \
            getattr(config, "layer_types", None) is None:
        return "a sliding-window model"
    if getattr(model, "_supports_cache_class", True) is False or config.model_type in ("gpt2", "gpt_bigcode", "bloom"):
        return f"a {config.model_type} model (no position-indexed static cache)"
    return None


@functools.lru_cache(maxsize=None)
def _cache_class():
    from transformers.cache_utils import Cache

    class SlotCache(Cache):
        """transformers' cache interface over ``SlotLayer``s: ``batch`` rows of ``capacity`` slots;
        ``slots`` ``[b, q]``, ``rows`` ``[b]`` or None and ``limit`` (slots read) say where the next pass goes."""

        def __init__(self, layers: int, batch: int, capacity: int):
            self.batch, self.capacity = batch, capacity
            self.slots: Tensor = torch.zeros(0, dtype=torch.long)
            self.rows: Optional[Tensor] = None
            self.limit: Optional[int] = None
            super().__init__(layers=[SlotLayer(self) for _ in range(layers)])

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return 0  # positions are always given; masks are always 4-D

        @property
        def is_compileable(self) -> bool:
            return True

    return SlotCache


def slot_cache(model: Module, batch: int, capacity: int):
    """A ``SlotCache`` of ``batch`` rows and ``capacity`` slots for every layer of ``model``."""
    config = model.config.get_text_config(decoder=True)
    return _cache_class()(config.num_hidden_layers, batch, capacity)


def visible(positions: Tensor, capacity: int, dtype: torch.dtype) -> Tensor:
    """The additive mask ``[b, 1, q, capacity]`` for queries at ``positions`` ``[b, q]``: 0 on slots
    ``j <= position``, the dtype's lowest value elsewhere."""
    slots = torch.arange(capacity, device=positions.device)
    seen = slots[None, None, None, :] <= positions[:, None, :, None]
    return torch.zeros(seen.shape, dtype=dtype, device=positions.device).masked_fill_(~seen, torch.finfo(dtype).min)


class Writer:
    """Greedy answers for a queue of prompts, ``batch`` rows at a time (module docstring)."""

    def __init__(self, model: Module, batch: int, capacity: int, stop: Sequence[int], compile: bool = False):
        why = supported(model)
        if why is not None:
            raise ValueError(f"our answer writer cannot run {why}: use --writer transformers")
        self.model, self.batch, self.capacity, self.stop = model, batch, capacity, list(stop)
        weight = next(model.parameters())
        self.device, self.dtype = weight.device, weight.dtype
        self.cache = slot_cache(model, batch, capacity)
        self.step_slots = torch.zeros((batch, 1), dtype=torch.long, device=self.device)  # the decoding pass's, kept
        self.cache.slots = self.step_slots
        self.stops = torch.tensor(self.stop, device=self.device)
        self.compiled = compile
        self.decode = self._decode
        if compile:
            mode = "reduce-overhead" if self.device.type == "cuda" else None
            self.decode = torch.compile(self._decode, dynamic=False, mode=mode)

    def _decode(self, ids: Tensor, mask: Tensor) -> Tensor:
        """One pass over every row: ``ids`` ``[B, 1]`` at ``cache.slots`` ``[B, 1]`` (their positions),
        ``mask`` ``[B, 1, 1, limit]``; returns the next greedy token ``[B]``."""
        logits = self.model(input_ids=ids, position_ids=self.cache.slots, attention_mask=mask,
                            cache=self.cache, use_cache=True).logits
        return logits[:, -1].argmax(-1)

    def _prefill(self, rows: List[int], prompts: List[List[int]]) -> List[int]:
        """Write ``prompts`` into ``rows`` (right-padded to the longest); their first answer tokens."""
        width = max(len(p) for p in prompts)
        ids = torch.tensor([p + [self.stop[0]] * (width - len(p)) for p in prompts], device=self.device)
        positions = torch.arange(width, device=self.device).expand(len(rows), width)
        cache = self.cache
        cache.rows, cache.slots, cache.limit = torch.tensor(rows, device=self.device), positions, width
        try:
            logits = self.model(input_ids=ids, position_ids=positions, attention_mask=visible(positions, width, self.dtype),
                                cache=cache, use_cache=True,
                                logits_to_keep=torch.tensor([[len(p) - 1] for p in prompts], device=self.device)).logits
        finally:
            cache.rows, cache.limit, cache.slots = None, None, self.step_slots
        return logits[:, -1].argmax(-1).tolist()

    @torch.no_grad()
    def run(self, prompts: Sequence[Sequence[int]], max_new: int) -> List[List[int]]:
        """Each prompt's greedy answer: at most ``max_new`` tokens, cut after the first end token."""
        if any(len(p) + max_new > self.capacity for p in prompts):
            raise ValueError(f"a prompt of {max(map(len, prompts))} tokens and {max_new} new ones exceed {self.capacity} slots")
        answers: List[List[int]] = [[] for _ in prompts]
        queue: Deque[int] = deque(range(len(prompts)))
        owner = [-1] * self.batch  # the prompt each row writes (-1: free)
        position = torch.zeros(self.batch, dtype=torch.long)  # each row's next slot (host copy)
        last = torch.full((self.batch,), self.stop[0], dtype=torch.long)
        with shared_kv_heads(self.model):
            while True:
                free = [r for r in range(self.batch) if owner[r] < 0]
                if queue and (len(free) >= max(1, self.batch // REFILL) or len(free) == self.batch):
                    rows = free[: len(queue)]
                    taken = [queue.popleft() for _ in rows]
                    firsts = self._prefill(rows, [list(prompts[i]) for i in taken])
                    for row, index, token in zip(rows, taken, firsts):
                        owner[row], position[row], last[row] = index, len(prompts[index]), token
                        answers[index].append(token)
                        if token in self.stop or max_new == 1:
                            owner[row], position[row] = -1, 0
                live = [r for r in range(self.batch) if owner[r] >= 0]
                if not live:
                    if queue:
                        continue
                    return answers
                self.cache.slots.copy_(position[:, None])
                limit = self.capacity if self.compiled else min(self.capacity, -(-(int(position.max()) + 1) // 32) * 32)
                mask = visible(self.cache.slots, limit, self.dtype)
                self.cache.limit = None if self.compiled else limit
                tokens = self.decode(last.to(self.device)[:, None], mask).clone().cpu()
                self.cache.limit = None
                for row in live:
                    index, token = owner[row], int(tokens[row])
                    answers[index].append(token)
                    last[row], position[row] = token, position[row] + 1
                    if token in self.stop or len(answers[index]) >= max_new:
                        owner[row], position[row] = -1, 0


KEPT = "_specdec_answer_writers"  # the model's attribute keeping its compiled writers, by (batch, capacity, stop)


def write_answers(model: Module, prompts: Sequence[Sequence[int]], max_new: int, stop: Sequence[int], batch: int,
                  compile: bool = False) -> List[List[int]]:
    """The greedy answers of ``model`` to ``prompts`` (token ids), ``batch`` rows at a time, each cut
    after its first token in ``stop`` and at ``max_new`` tokens; in the prompts' order. ``compile``:
    the decoding pass compiled (CUDA graphs on CUDA), its writer kept for later calls of the same shape."""
    if not prompts:
        return []
    capacity, batch = max(len(p) for p in prompts) + max_new, min(batch, len(prompts))
    if not compile:
        return Writer(model, batch, capacity, stop).run(prompts, max_new)
    capacity = -(-capacity // 256) * 256  # one graph for nearby lengths
    kept: Dict[tuple, Writer] = model.__dict__.setdefault(KEPT, {})  # every chunk reuses one graph
    key = (batch, capacity, tuple(stop))
    if key not in kept:
        kept[key] = Writer(model, batch, capacity, stop, compile=True)
    return kept[key].run(prompts, max_new)
