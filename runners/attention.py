"""Attention in our compiled passes: transformers' SDPA with the key/value heads shared inside the
kernel (``enable_gqa``) instead of copied to every query head.

Under ``torch.compile`` transformers' SDPA path expands a grouped-query model's keys and values to
the query heads (``repeat_kv``): with a static cache that is a copy of the whole cache per layer
and pass (SmolLM2-135M: 9 query heads over 3 key/value heads, 1,024 positions, 4.7 MB a layer).
SDPA's CPU flash kernel takes the groups itself, with the same result (a 1-position pass: 0.16 ms
a layer against 0.42 ms, measured on a 2-core AVX2 EPYC). Only our compiled graphs use it: the
model's attention is switched for the duration of their calls (``shared_kv_heads``), so eager
passes and transformers' own paths (the peers) run transformers' SDPA unchanged.
"""
import contextlib
from typing import Optional

import torch
from torch.nn import Module

NAME = "specdec_sdpa_gqa"


def sdpa_shared_kv(module: Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: Optional[torch.Tensor], **kwargs):
    """transformers' attention-interface signature: ``query`` ``[B, Hq, r, D]``, ``key``/``value``
    ``[B, Hkv, L, D]``, a mask over the L positions, and keywords (``dropout``, ``scaling``,
    ``is_causal``, ...); returns ``([B, r, Hq, D], None)``. Anything but a masked grouped-query call
    (a bias, a soft cap, no mask) goes to transformers' own SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if groups == 1 or attention_mask is None or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)  # its defaults: as ours
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=kwargs.get("dropout", 0.0), scale=kwargs.get("scaling"),
                                                           enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    """The attention, and its mask: transformers builds no mask for a name its mask interface does not know."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, sdpa_shared_kv)
        AttentionMaskInterface.register(NAME, sdpa_mask)


@contextlib.contextmanager
def shared_kv_heads(model: Module):
    """``model``'s attention is ``sdpa_shared_kv`` inside (only where it was transformers' "sdpa")."""
    config = model.config
    before = getattr(config, "_attn_implementation_internal", None)
    if before != "sdpa":
        yield
        return
    _register()
    config._attn_implementation_internal = NAME  # the property's store: its setter would also rewrite sub-configs
    try:
        yield
    finally:
        config._attn_implementation_internal = before
