"""The Llama family's forward as one step of fixed shapes, for ``torch.compile`` (gpt-fast's
``model.py`` with ``decode_one_token``): tensors in, tensors out, nothing that changes per step is a
Python value, so one graph serves every pass of a width (a CUDA graph under ``mode="reduce-overhead"``).

The pieces (``rms_norm``, ``rope``, ``rotate``, ``attend``) are ``models.llama``'s, over the model's own
modules; what differs is the cache access: keys and values are written in place with ``index_copy_``
at a ``slots`` tensor, and every pass attends over the cache's first ``K`` slots under a boolean mask
``[1, 1, r, K]`` (slots not yet written, or rolled back, are masked; they hold zeros or old finite
values, so a masked slot weighs exactly 0). ``K`` is the mask's width, a key bucket
(``runners.step.key_bucket``): a graph per (width, bucket), so a pass attends to what its context
costs, not to the whole capacity. Shapes: ``r`` rows fed, ``C`` the cache capacity, ``K <= C`` the
keys attended, ``H`` hidden size, ``V`` vocabulary; the cache is ``models.llama.KVCache`` (per layer ``[1, Hkv, C, D]``).
"""
import weakref
from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from models.llama import KVCache, attend, lean_unsupported, new_cache, rms_norm, rope, rotate


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
        body = self.model.model
        r = ids.shape[0]
        h = body.embed_tokens(ids[None])  # [1, r, H]
        cos, sin = rope(positions, body.rotary_emb.inv_freq, body.rotary_emb.attention_scaling, h.dtype)
        kept = {}
        for i, layer in enumerate(body.layers[: self.model.config.num_hidden_layers]):
            if i in hidden_layers:
                kept[i] = h[0]
            kv = cache.layers[i]
            h = self.layer(layer, h, cos, sin, kv.keys, kv.values, slots, mask)
        h = rms_norm(h[:, r - n_last:], body.norm.weight, body.norm.variance_epsilon)
        hidden = torch.cat([kept[k] for k in hidden_layers], dim=-1) if hidden_layers else None
        return self.model.get_output_embeddings()(h)[0], hidden


def decoder_layer(layer: Module, h: Tensor, cos: Tensor, sin: Tensor, keys: Tensor, values: Tensor, slots: Tensor,
                  mask: Tensor) -> Tensor:
    """One decoder layer on the residual stream ``h`` ``[1, r, H]``: attention (its keys and values
    written at ``slots`` into the layer's ``keys``/``values`` ``[1, Hkv, C, D]``, attending to the first
    ``K`` slots under ``mask`` ``[1, 1, r, K]``), then the MLP; returns the new ``[1, r, H]``."""
    attn, norm = layer.self_attn, layer.input_layernorm
    x = rms_norm(h, norm.weight, norm.variance_epsilon)
    shape = (1, h.shape[1], -1, attn.head_dim)
    q = rotate(attn.q_proj(x).view(shape).transpose(1, 2), cos, sin)
    keys.index_copy_(2, slots, rotate(attn.k_proj(x).view(shape).transpose(1, 2), cos, sin))
    values.index_copy_(2, slots, attn.v_proj(x).view(shape).transpose(1, 2))
    width = mask.shape[-1]
    h = h + attn.o_proj(attend(q, keys[:, :, :width], values[:, :, :width], mask, attn.scaling))
    mlp, norm = layer.mlp, layer.post_attention_layernorm
    x = rms_norm(h, norm.weight, norm.variance_epsilon)
    return h + mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
