"""The Llama family's forward (and its kin's: ``models.layer_spec``) as one step of fixed shapes, for ``torch.compile`` (gpt-fast's
``model.py`` with ``decode_one_token``): tensors in, tensors out, nothing that changes per step is a
Python value, so one graph serves every pass of a width (a CUDA graph under ``mode="reduce-overhead"``).

The pieces (``rms_norm``, ``rope``, ``rotate``, ``attend``) are ``models.llama``'s, over the model's own
modules; what differs is the cache access: keys and values are written in place with ``index_copy_``
at a ``slots`` tensor, and every pass attends over the cache's first ``K`` slots under a boolean mask
``[1, 1, r, K]`` (slots not yet written, or rolled back, are masked; they hold zeros or old finite
values, so a masked slot weighs exactly 0; a sliding layer's mask is cut to its window by the positions
the slots hold). ``K`` is the mask's width, a key bucket
(``runners.step.key_bucket``): a graph per (width, bucket), so a pass attends to what its context
costs, not to the whole capacity. Shapes: ``r`` rows fed, ``C`` the cache capacity, ``K <= C`` the
keys attended, ``H`` hidden size, ``V`` vocabulary; the cache is ``models.llama.KVCache`` (per layer ``[1, Hkv, C, D]``).
"""
import weakref
from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from models.layer_spec import ModelSpec, model_spec, norm_modules
from models.llama import KVCache, attend, feed_forward, final_logits, heads, lean_unsupported, new_cache, norm, residual, rope_tables


def zeroed_cache(model: Module, capacity: int, dtype: torch.dtype, device: torch.device) -> KVCache:
    """A cache of ``capacity`` slots filled with zeros: a masked slot must hold a finite value
    (a NaN left by ``torch.empty`` would poison the attention even where masked)."""
    cache = new_cache(model, capacity, dtype, device)
    for layer in cache.layers:
        layer.keys.zero_()
        layer.values.zero_()
    return cache


class LlamaStep:
    """One pass of ``model`` (the Llama family, ``lean_unsupported``) over a ``KVCache`` of fixed
    capacity; references the model's modules, copies nothing. ``forward`` is what gets compiled whole,
    or, regionally, ``layer`` (``decoder_layer`` compiled once: every layer of the model is the same
    code over other weights, so one graph serves them all). Holds the model weakly: a step lives in its
    model's state (``runners.step._STATES``), a value that must not keep its own key alive."""

    def __init__(self, model: Module, layer: Callable = None):
        reason = lean_unsupported(model)
        if reason is not None:
            raise ValueError(reason)
        self._model = weakref.ref(model)
        self.spec = model_spec(model)
        self.layer = layer or decoder_layer

    @property
    def model(self) -> Module:
        return self._model()

    def forward(self, ids: Tensor, positions: Tensor, slots: Tensor, mask: Tensor, cache: KVCache, n_last: int,
                hidden_layers: Sequence[int] = ()) -> Tuple[Tensor, Optional[Tensor]]:
        """``ids`` ``[r]`` at RoPE ``positions`` ``[r]`` (int64), their keys and values written at cache
        ``slots`` ``[r]`` (== positions for a chain; a tree's node ``i`` at ``cur + i``), each row
        attending to the slots ``mask`` ``[1, 1, r, K]`` (boolean; ``K <= C``, every slot written < ``K``) allows. Returns the logits
        ``[n_last, V]`` of the last ``n_last`` rows and, with ``hidden_layers``, the residual stream
        entering those layers ``[r, len(hidden_layers) * H]`` (else None)."""
        body, spec = self.model.model, self.spec
        r = ids.shape[0]
        h = body.embed_tokens(ids[None])  # [1, r, H]
        h = h if spec.embed_scale == 1.0 else h * spec.embed_scale
        ropes = rope_tables(self.model, spec, positions, h.dtype)
        masks = {None: mask}
        if spec.windows:  # the position each slot < K holds: its own, or the fed row's written there
            held = torch.arange(mask.shape[-1], device=mask.device).index_copy(0, slots, positions)
            masks.update({w: mask & (positions[:, None] - held[None, :] < w)[None, None] for w in spec.windows})
        kept = {}
        for i, layer in enumerate(body.layers[: self.model.config.num_hidden_layers]):
            if i in hidden_layers:
                kept[i] = h[0]
            kv, at = cache.layers[i], spec.layers[i]
            h = self.layer(layer, h, None if at.rope is None else ropes[at.rope], kv.keys, kv.values, slots, masks[at.window], spec)
        h = norm(h[:, r - n_last:], body.norm, spec.family.norm)
        hidden = torch.cat([kept[k] for k in hidden_layers], dim=-1) if hidden_layers else None
        return final_logits(self.model, h, spec)[0], hidden


def decoder_layer(layer: Module, h: Tensor, rotary: Optional[Tuple[Tensor, Tensor]], keys: Tensor, values: Tensor, slots: Tensor,
                  mask: Tensor, spec: ModelSpec) -> Tensor:
    """One decoder layer on the residual stream ``h`` ``[1, r, H]`` as ``spec`` states it: attention (its
    keys and values written at ``slots`` into the layer's ``keys``/``values`` ``[1, Hkv, C, D]``, rotated
    by ``rotary`` (cos, sin; None: no RoPE), attending to the first ``K`` slots under ``mask``
    ``[1, 1, r, K]``, the layer's window drawn in), then the MLP; returns the new ``[1, r, H]``."""
    attn_in, attn_out, mlp_in, mlp_out = norm_modules(layer, spec)
    attn = layer.self_attn
    q, k, v = heads(attn, norm(h, attn_in, spec.family.norm), spec, keys.shape[1], rotary)
    keys.index_copy_(2, slots, k)
    values.index_copy_(2, slots, v)
    width = mask.shape[-1]
    h = residual(h, attn.o_proj(attend(q, keys[:, :, :width], values[:, :, :width], mask, attn.scaling)), attn_out, spec)
    return residual(h, feed_forward(layer.mlp, norm(h, mlp_in, spec.family.norm), spec), mlp_out, spec)
