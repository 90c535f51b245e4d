"""The eager runner, ``KVCacheModel``: the model's own forward, over its dynamic cache or a static one."""
import inspect

import torch
from torch import Tensor
from torch.nn import Module

from runners.cache_kind import cache_keyword, check_cache, returned_cache, runner_cache
from runners.device import model_device
from runners.dynamic import prune_cache, rollback_capable_cache
from runners.hidden import select_hidden
from runners.static import carry, grown_capacity, set_length, static_cache
from runners.trees import TreePasses


class KVCacheModel(TreePasses):
    """A model and its KV cache, for one sequence (batch size 1): a ``runners.Runner``.

    ``model(ids, n_last)`` returns the logits ``[n_last, V]`` of the last ``n_last`` positions of
    ``ids`` (shape ``[1, L]``, any device). With the cache on, only ``ids[:, cached:]`` is fed;
    ``rollback(length)`` forgets every position from ``length`` on, so rejected drafts leave no
    trace. With the cache off, the whole of ``ids`` is fed each time (the slow reference path).

    ``cache``: "static" preallocates the keys and values (``runners.static``: for the first pass's
    length plus ``STATIC_SLACK`` positions, regrown by doubling when a generation goes further),
    writes each pass at its positions and rolls back by moving the write position (no crop, no
    concatenation); "dynamic" is the model's own ``DynamicCache`` (``runners.dynamic``: recording
    past states, so a rollback reaches behind a sliding window). None: ``default_cache(model)``
    (the device's). Encoder-decoder models, and models whose cache is not a plain K/V store, use
    the dynamic cache.

    For an encoder-decoder model, pass the encoder's ``encoder_input_ids``: the encoder runs once
    and ``ids`` are then decoder tokens. The runner runs the model's modules as they are: its
    kernels (``set_prepack``, quantization) are the model's, the same for every caller.
    """

    def __init__(
        self, model: Module, use_cache: bool = True, encoder_input_ids: list[int] | None = None,
        cache: str | None = None,
    ):
        check_cache(cache)
        self.model = model
        self.cache_kind = runner_cache(model, cache)
        self.device = model_device(model)
        self.use_cache = use_cache
        self.cache = None
        self.cached = 0  # positions held by the cache
        self.forward_passes = 0
        self.encoder_outputs = None
        if encoder_input_ids is not None:
            encoder_ids = torch.tensor([encoder_input_ids], dtype=torch.long, device=self.device)
            self.encoder_outputs = model.get_encoder()(input_ids=encoder_ids)
        params = inspect.signature(model.forward).parameters
        self._logits_to_keep = "logits_to_keep" in params
        self._cache_keyword = cache_keyword(model)  # "cache" on transformers 5.24+, else "past_key_values"
        self.capacity = 0  # positions preallocated by a static cache
        self.hidden_layers: tuple = ()  # runners.base.Runner: hidden states kept with each pass
        self.hidden = None
        self.hidden_start = 0

    def __call__(self, ids: Tensor, n_last: int = 1) -> Tensor:
        length = ids.shape[1]
        start = self.cached if self.use_cache else 0
        if length - start < n_last:
            raise RuntimeError(f"asked for {n_last} logits but only {length - start} positions are new")
        new = ids[:, start:length].to(self.device, non_blocking=True)
        if self.use_cache and self.cache_kind == "static":
            self._reserve(length)
        if self.use_cache and self.cache is None and self.encoder_outputs is None:
            self.cache = rollback_capable_cache(self.model)
        kwargs = {self._cache_keyword: self.cache, "use_cache": self.use_cache}
        if self.capacity:  # static: positions are given, the write position is the cache's own
            kwargs["position_ids"] = torch.arange(start, length, device=self.device).unsqueeze(0)
        if self.encoder_outputs is not None:
            kwargs.update(encoder_outputs=self.encoder_outputs, decoder_input_ids=new)
        else:
            kwargs["input_ids"] = new
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = n_last
        out = self._forward(kwargs, start)
        if self.use_cache:
            self.cache = returned_cache(out)
            self.cached = length
        return out.logits[0, -n_last:]

    def _reserve(self, length: int) -> None:
        """Make the static cache hold ``length`` positions: allocate it, or regrow it (copying what it holds)."""
        if length <= self.capacity:
            return
        capacity = grown_capacity(length, self.capacity)
        cache = static_cache(self.model, capacity)
        if cache is None:
            self.cache_kind = "dynamic"  # the model's own dynamic cache from here on
            return
        if self.cache is not None:
            if self.capacity == 0:  # dynamic states from before (cannot happen with a fixed kind)
                raise RuntimeError("a runner cannot switch to a static cache mid-generation")
            carry(self.cache, cache, self.cached)
        self.cache, self.capacity = cache, capacity

    def rollback(self, length: int) -> None:
        """Forget the cached positions ``length`` and after (no-op when they are not cached)."""
        if self.use_cache and self.cached > length:
            if self.capacity:  # static: move the write position back; stale entries are masked, then overwritten
                set_length(self.cache, length)
            else:
                prune_cache(self.cache, self.cached - length)
            self.cached = length

    # ---- draft trees (``TreePasses``): one pass over many branches, then keep the accepted one ----
    def _tree_room(self, length: int) -> int:
        """A cache for ``length`` positions; the tree mask's key slots (static: the capacity)."""
        if self.use_cache and self.cache_kind == "static":
            self._reserve(length)
        if self.use_cache and self.cache is None:
            self.cache = rollback_capable_cache(self.model)
        return self.capacity if self.use_cache and self.capacity else length

    def _tree_forward(self, kwargs: dict, start: int, n: int) -> Tensor:
        """Logits ``[1 + n, V]`` of the tree pass ``kwargs`` feeding positions ``start..``."""
        kwargs.update({self._cache_keyword: self.cache, "use_cache": self.use_cache})
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = n + 1
        out = self._forward(kwargs, start)
        if self.use_cache:
            self.cache = returned_cache(out)
        return out.logits[0, -(n + 1) :]

    def _forward(self, kwargs: dict, start: int):
        """One forward pass feeding positions ``start..``; keeps the hidden states asked for."""
        if self.hidden_layers:
            kwargs["output_hidden_states"] = True
        out = self.model(**kwargs)
        self.forward_passes += 1
        if self.hidden_layers:
            self.hidden, self.hidden_start = select_hidden(out.hidden_states, self.hidden_layers), start
        return out
