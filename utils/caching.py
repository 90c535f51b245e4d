"""KV-cache handling: feed a model only the tokens it has not seen, roll the cache back in place."""
import inspect

import torch
from torch import Tensor
from torch.nn import Module


def prune_cache(cache, num_tokens_to_discard: int):
    """Drop the last ``num_tokens_to_discard`` positions of a transformers ``Cache`` in place; returns it.

    Uses ``Cache.crop`` with a negative count, which means "remove that many tokens" both in
    transformers 4.x (where a positive argument is an absolute length) and 5.x (which only
    accepts negative counts).
    """
    if cache is not None and num_tokens_to_discard > 0:
        cache.crop(-num_tokens_to_discard)
    return cache


def model_device(model: Module) -> torch.device:
    """Device of the model's first parameters (where its inputs go, also with an accelerate device map)."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(model.parameters()).device


class KVCacheModel:
    """A model and its KV cache, for one sequence (batch size 1).

    ``model(ids, n_last)`` returns the logits ``[n_last, V]`` of the last ``n_last`` positions of
    ``ids`` (shape ``[1, L]``, any device). With the cache on, only ``ids[:, cached:]`` is fed;
    ``rollback(length)`` forgets every position from ``length`` on, so rejected drafts leave no
    trace. With the cache off, the whole of ``ids`` is fed each time (the slow reference path).

    For an encoder-decoder model, pass the encoder's ``encoder_input_ids``: the encoder runs once
    and ``ids`` are then decoder tokens.
    """

    def __init__(self, model: Module, use_cache: bool = True, encoder_input_ids: list[int] | None = None):
        self.model = model
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

    def __call__(self, ids: Tensor, n_last: int = 1) -> Tensor:
        length = ids.shape[1]
        start = self.cached if self.use_cache else 0
        if length - start < n_last:
            raise RuntimeError(f"asked for {n_last} logits but only {length - start} positions are new")
        new = ids[:, start:length].to(self.device, non_blocking=True)
        kwargs = {"past_key_values": self.cache, "use_cache": self.use_cache}
        if self.encoder_outputs is not None:
            kwargs.update(encoder_outputs=self.encoder_outputs, decoder_input_ids=new)
        else:
            kwargs["input_ids"] = new
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = n_last
        out = self.model(**kwargs)
        self.forward_passes += 1
        if self.use_cache:
            self.cache = out.past_key_values
            self.cached = length
        return out.logits[0, -n_last:]

    def rollback(self, length: int) -> None:
        """Forget the cached positions ``length`` and after (no-op when they are not cached)."""
        if self.use_cache and self.cached > length:
            prune_cache(self.cache, self.cached - length)
            self.cached = length
