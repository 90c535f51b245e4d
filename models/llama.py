"""The Llama family's forward, written out over the Hugging Face model's own modules and weights
(``LlamaForCausalLM``, SmolLM2, ``Qwen2ForCausalLM`` with its q/k/v biases, ``MistralForCausalLM``
without a sliding window), gpt-fast style: no copy of any weight, no ``Cache`` object, no mask
built by transformers, one preallocated KV cache written by position.

Every linear layer is the model's own module, called as transformers calls it: the project's kernel
plan (``kernels.prepacking.PrepackedLinear`` routing each pass width to MKL, oneDNN or the skinny
kernel; quantized layers) applies unchanged. Norms, RoPE and attention follow transformers' own
arithmetic step for step (RMSNorm in float32, cos/sin per pass in float32, SDPA called as
transformers' ``sdpa_attention_forward`` calls it), so that logits match its forward bit for bit.

Shapes: ``r`` positions fed by a pass, ``L`` key slots it attends to (cached + fed), ``H`` hidden
size, ``Hq``/``Hkv`` query and key/value heads, ``D`` head size, ``V`` vocabulary.
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Module

FAMILY = ("llama", "qwen2", "mistral")  # config.model_type values this forward covers
CLASSES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")  # transformers' own: the classes, not their names
# the lean forward's attention is its own, whatever the model was loaded with (the headers name it); it
# admits the kinds that compute the same exact softmax attention (eager: the same, rounded apart)
ATTENTION = "SDPA"
ADMITTED_ATTENTION = ("sdpa", "eager")
# RoPE types whose frequencies are fixed once (transformers' ``inv_freq`` buffer and
# ``attention_scaling``); "dynamic" and "longrope" recompute them from the sequence length
STATIC_ROPE = ("default", "linear", "llama3", "yarn")


def lean_unsupported(model: Module) -> Optional[str]:
    """Why ``model`` cannot run this forward (one line), or None when it can."""
    name = type(model).__name__
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return f"{name} is no decoder-only transformers model"
    if not _family_class(model) or getattr(config, "model_type", None) not in FAMILY:
        where = type(model).__module__
        name = name if where.startswith("transformers.") else f"{where}.{name}"
        return f"{name} ({getattr(config, 'model_type', '?')}) is outside the Llama family ({', '.join(FAMILY)})"
    attention = getattr(config, "_attn_implementation", None)
    if attention not in ADMITTED_ATTENTION:
        return f"{name} runs {attention!r} attention: the lean forward's is {ATTENTION} (it takes models loaded with {' or '.join(ADMITTED_ATTENTION)})"
    layer_types = getattr(config, "layer_types", None)
    if (any(t != "full_attention" for t in layer_types) if layer_types else getattr(config, "sliding_window", None) is not None):
        return f"{name} has sliding-window layers: the lean forward attends to every position"
    rope = getattr(model.model.rotary_emb, "rope_type", "default")
    if rope not in STATIC_ROPE:
        return f"{name}'s RoPE scaling {rope!r} recomputes its frequencies by length: the lean forward takes {', '.join(STATIC_ROPE)}"
    devices = {str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()}
    if len(devices) > 1 or devices & {"disk", "meta"}:
        return f"{name} is split across devices ({', '.join(sorted(devices))})"
    return None


def _family_class(model: Module) -> bool:
    """Whether ``model`` is an instance of one of transformers' own ``CLASSES`` (the class itself, not a
    subclass nor a remote-code class that borrows the name: either may change any step of the forward)."""
    import transformers

    return any(type(model) is getattr(transformers, name, None) for name in CLASSES)


# ---- the cache: per layer, keys and values [1, Hkv, capacity, D], written at their positions ----
@dataclass
class KVLayer:
    """One layer's keys and values ``[1, Hkv, capacity, D]`` (``is_initialized``: what
    ``runners.trees.gather_branch`` reads of a cache layer)."""

    keys: Tensor
    values: Tensor
    is_initialized: bool = True


@dataclass
class KVCache:
    """The KV cache of one sequence: ``layers`` of ``KVLayer``, ``capacity`` slots each."""

    layers: List[KVLayer]
    capacity: int


def new_cache(model: Module, capacity: int, dtype: torch.dtype, device: torch.device) -> KVCache:
    """An empty cache for ``capacity`` positions (uninitialized: a pass reads only the slots written)."""
    config = model.config
    layers = model.model.layers[: config.num_hidden_layers]
    shape = (1, config.num_key_value_heads, capacity, layers[0].self_attn.head_dim)
    made = [KVLayer(torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device)) for _ in layers]
    return KVCache(made, capacity)


# ---- the pieces, as transformers computes them ----
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' ``LlamaRMSNorm``: normalised in float32, scaled in the input's dtype."""
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rope(positions: Tensor, inv_freq: Tensor, scaling: float, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """cos and sin ``[1, 1, r, D]`` for ``positions`` ``[r]`` (transformers' rotary embedding: float32,
    each pass its own positions, so a position rounds the same whichever pass holds it)."""
    freqs = positions[None, :, None].float() * inv_freq.to(device=positions.device, dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(dtype)[:, None], (emb.sin() * scaling).to(dtype)[:, None]


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on ``x`` ``[1, heads, r, D]`` (transformers' ``rotate_half`` form)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], scale: float) -> Tensor:
    """SDPA of ``q`` ``[1, Hq, r, D]`` over ``k``/``v`` ``[1, Hkv, L, D]`` -> ``[1, r, Hq * D]``.
    ``mask``: additive or boolean ``[1, 1, r, L]``; None: every key for one position, causal for a
    pass with no cache before it (L == r). The key/value heads are shared inside the kernel, never copied."""
    _, heads, r, dim = q.shape
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, is_causal=mask is None and r > 1,
                                         enable_gqa=heads > k.shape[1])
    return out.transpose(1, 2).reshape(1, r, heads * dim)


def causal_mask(start: int, r: int, device: torch.device) -> Optional[Tensor]:
    """The boolean mask ``[1, 1, r, start + r]`` of a pass feeding positions ``start..start + r - 1``
    after ``start`` cached ones; None where ``attend`` needs none (one position, or nothing cached)."""
    if r == 1 or start == 0:
        return None
    keys = torch.arange(start + r, device=device)
    return (keys[None, :] <= torch.arange(start, start + r, device=device)[:, None])[None, None]


# ---- the forward ----
class LlamaForward:
    """The family's forward over ``model``'s own modules (references only: nothing is copied). The
    decoder layers are kept; the modules inside them and the output layer are looked up at each pass:
    a kernel plan that swaps the model's linear layers (``runners.kernels``) after this was made is
    the one that runs."""

    def __init__(self, model: Module):
        reason = lean_unsupported(model)
        if reason is not None:
            raise ValueError(reason)
        self.model = model
        self.layers = list(model.model.layers[: model.config.num_hidden_layers])

    @property
    def head(self) -> Module:
        """The output layer (the embeddings' own weight where they are tied)."""
        return self.model.get_output_embeddings()

    def __call__(self, ids: Tensor, positions: Tensor, cache: KVCache, start: int, n_last: int,
                 mask: Optional[Tensor] = None, hidden_layers: Sequence[int] = ()) -> Tuple[Tensor, Optional[Tensor]]:
        """One pass over ``ids`` ``[r]`` at ``positions`` ``[r]``, their keys and values written at
        slots ``start..start + r - 1`` of ``cache``, attending to slots ``< start + r``. ``mask``:
        ``[1, 1, r, start + r]`` (a tree pass), None: causal. Returns the logits ``[n_last, V]`` of
        the last ``n_last`` positions and, with ``hidden_layers``, the residual stream entering
        those layers ``[r, len(hidden_layers) * H]`` (``runners.hidden.select_hidden``'s), else None."""
        r, end, body = ids.shape[0], start + ids.shape[0], self.model.model
        h = body.embed_tokens(ids[None])  # [1, r, H]
        cos, sin = rope(positions, body.rotary_emb.inv_freq, body.rotary_emb.attention_scaling, h.dtype)
        if mask is None:
            mask = causal_mask(start, r, h.device)
        kept = {}
        for i, layer in enumerate(self.layers):
            if i in hidden_layers:
                kept[i] = h[0]
            h = h + self._attention(layer, h, cos, sin, cache.layers[i], start, end, mask)
            mlp = layer.mlp
            x = rms_norm(h, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
            h = h + mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
        # the final norm and the output layer only where logits are asked for (the norm is per position)
        h = rms_norm(h[:, r - n_last :], body.norm.weight, body.norm.variance_epsilon)
        hidden = torch.cat([kept[k] for k in hidden_layers], dim=-1) if hidden_layers else None
        return self.head(h)[0], hidden

    @staticmethod
    def _attention(layer: Module, h: Tensor, cos: Tensor, sin: Tensor, kv: KVLayer, start: int, end: int,
                   mask: Optional[Tensor]) -> Tensor:
        """The attention block of ``layer`` on ``h`` ``[1, r, H]`` (its input norm included) -> ``[1, r, H]``."""
        attn, norm = layer.self_attn, layer.input_layernorm
        x = rms_norm(h, norm.weight, norm.variance_epsilon)
        shape = (1, h.shape[1], -1, attn.head_dim)
        q = rotate(attn.q_proj(x).view(shape).transpose(1, 2), cos, sin)
        kv.keys[:, :, start:end] = rotate(attn.k_proj(x).view(shape).transpose(1, 2), cos, sin)
        kv.values[:, :, start:end] = attn.v_proj(x).view(shape).transpose(1, 2)
        out = attend(q, kv.keys[:, :, :end], kv.values[:, :, :end], mask, attn.scaling)
        return attn.o_proj(out)
