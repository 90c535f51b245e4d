"""The Llama family's forward and its kin's, written out over the Hugging Face model's own modules
and weights, gpt-fast style: no copy of any weight, no ``Cache`` object, no mask built by
transformers, one preallocated KV cache written by position. What differs between the families
(norm places and kinds, q/k norms, activation, scales, per-layer RoPE and windows, fused q/k/v and
gate/up) is read from one description of the model's layers (``models.layer_spec``), not branched
on by family: ``LlamaForCausalLM`` (SmolLM2), ``Qwen2ForCausalLM`` with its q/k/v biases,
``MistralForCausalLM``, ``Qwen3ForCausalLM``, ``SmolLM3ForCausalLM``, ``GraniteForCausalLM``,
``Phi3ForCausalLM``, ``Olmo2ForCausalLM`` and ``Gemma3ForCausalLM``, sliding windows included.

Every linear layer is the model's own module, called as transformers calls it: the project's kernel
plan (``kernels.prepacking.PrepackedLinear`` routing each pass width to MKL, oneDNN or the skinny
kernel; quantized layers) applies unchanged. Norms, RoPE and attention follow transformers' own
arithmetic step for step (RMSNorm in float32, cos/sin per pass in float32, SDPA called as
transformers' ``sdpa_attention_forward`` calls it, a sliding layer over the keys transformers'
dynamic sliding cache holds), so that logits match its forward bit for bit.

Shapes: ``r`` positions fed by a pass, ``L`` key slots it attends to (cached + fed), ``H`` hidden
size, ``Hq``/``Hkv`` query and key/value heads, ``D`` head size, ``R`` the dimensions RoPE rotates, ``V`` vocabulary.
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Module

from models.layer_spec import FAMILIES, STATIC_ROPE, ModelSpec, family_of, model_spec, norm_eps, norm_modules, spec_unsupported

FAMILY = tuple(FAMILIES)  # config.model_type values this forward covers
CLASSES = tuple(f.cls for f in FAMILIES.values())  # transformers' own: the classes, not their names
# the lean forward's attention is its own, whatever the model was loaded with (the headers name it); it
# admits the kinds that compute the same exact softmax attention (eager: the same, rounded apart)
ATTENTION = "SDPA"
ADMITTED_ATTENTION = ("sdpa", "eager")


def lean_unsupported(model: Module) -> Optional[str]:
    """Why ``model`` cannot run this forward (one line: the one feature missing), or None when it can."""
    name = type(model).__name__
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return f"{name} is no decoder-only transformers model"
    if family_of(model) is None:
        where = type(model).__module__
        name = name if where.startswith("transformers.") else f"{where}.{name}"
        return f"{name} ({getattr(config, 'model_type', '?')}) is outside the Llama family and its kin ({', '.join(FAMILY)})"
    attention = getattr(config, "_attn_implementation", None)
    if attention not in ADMITTED_ATTENTION:
        return f"{name} runs {attention!r} attention: the lean forward's is {ATTENTION} (it takes models loaded with {' or '.join(ADMITTED_ATTENTION)})"
    reason = spec_unsupported(model)
    if reason is not None:
        return reason
    devices = {str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()}
    if len(devices) > 1 or devices & {"disk", "meta"}:
        return f"{name} is split across devices ({', '.join(sorted(devices))})"
    return None


# ---- the cache: per layer, keys and values [1, Hkv, capacity, D], written at their positions ----
_LAYOUT = [0]  # assignments of caches' tensors, layers and capacities in this process (``layout``)


def layout() -> int:
    """A count that moves whenever any ``KVLayer``'s keys or values, or any ``KVCache``'s layers or capacity, are
    assigned (a cache made, regrown, cast, given another's layers): while it stands still, every cache holds the
    tensor objects it held, so a per-pass check of them (``kernels.c_step.CStep.bind``, ``kernels.kept_keys``)
    reads this one integer instead of every layer's tensors. (A tensor's ``.data`` replaced in place is no
    assignment: a cache's tensors are the runner's own, written through their views or the C step.)"""
    return _LAYOUT[0]


class _Counted:
    """Assignments of the attributes in ``COUNTED`` move ``layout()``."""

    COUNTED: Tuple[str, ...] = ()

    def __setattr__(self, name: str, value) -> None:
        if name in self.COUNTED:
            _LAYOUT[0] += 1
        object.__setattr__(self, name, value)


@dataclass
class KVLayer(_Counted):
    """One layer's keys and values ``[1, Hkv, capacity, D]`` (``is_initialized``: what
    ``runners.trees.gather_branch`` reads of a cache layer)."""

    COUNTED = ("keys", "values")
    keys: Tensor
    values: Tensor
    is_initialized: bool = True


@dataclass
class KVCache(_Counted):
    """The KV cache of one sequence: ``layers`` of ``KVLayer`` (a tuple: a layer is replaced only by assigning
    them all, which ``layout`` counts), ``capacity`` slots each; ``kept_keys``: the C step's keys in blocks kept
    beside it (``kernels.kept_keys``), made at its first pass."""

    COUNTED = ("layers", "capacity")
    layers: Sequence[KVLayer]
    capacity: int
    kept_keys: Optional[object] = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.layers = tuple(self.layers)


def new_cache(model: Module, capacity: int, dtype: torch.dtype, device: torch.device, empty: Callable = torch.empty) -> KVCache:
    """An empty cache for ``capacity`` positions (uninitialized: a pass reads only the slots written). Every
    layer's keys are views of one tensor ``[layers, 1, Hkv, capacity, D]`` (and the values of another): one
    version counter counts a write to any layer's keys (``kernels.kept_keys``), each layer's as laid out before.
    ``empty(shape, dtype=)``: a CPU cache's tensors (``kernels.huge_pages.empty``: on 2 MB pages)."""
    config = model.config
    layers = model.model.layers[: config.num_hidden_layers]
    shape = (len(layers), 1, config.num_key_value_heads, capacity, layers[0].self_attn.head_dim)
    with torch.inference_mode(False):  # tensors that count their writes (versions), even made under inference mode
        if device.type == "cpu":
            keys, values = empty(shape, dtype=dtype), empty(shape, dtype=dtype)
        else:
            keys, values = torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device)
        made = [KVLayer(k, v) for k, v in zip(keys.unbind(0), values.unbind(0))]
    return KVCache(made, capacity)


# ---- the pieces, as transformers computes them ----
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' ``LlamaRMSNorm``: normalised in float32, scaled in the input's dtype."""
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def norm(x: Tensor, module: Optional[Module], kind: str) -> Tensor:
    """The RMSNorm ``module`` of kind ``kind`` (``models.layer_spec.Family.norm``) on ``x``; None: ``x``."""
    if module is None:
        return x
    if kind == "w":
        return rms_norm(x, module.weight, norm_eps(module))
    dtype, x = x.dtype, x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm_eps(module))
    if kind == "1+w":  # Gemma: x * (1 + w) in float32
        return (x * (1.0 + module.weight.float())).to(dtype)
    return (module.weight * x).to(dtype)  # OLMo 2: scaled in float32, then cast


def rope(positions: Tensor, inv_freq: Tensor, scaling: float, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """cos and sin ``[1, 1, r, R]`` for ``positions`` ``[r]`` (transformers' rotary embedding: float32,
    each pass its own positions, so a position rounds the same whichever pass holds it)."""
    freqs = positions[None, :, None].float() * inv_freq.to(device=positions.device, dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(dtype)[:, None], (emb.sin() * scaling).to(dtype)[:, None]


def rope_tables(model: Module, spec: ModelSpec, positions: Tensor, dtype: torch.dtype) -> List[Tuple[Tensor, Tensor]]:
    """cos and sin ``[1, 1, r, R]`` of each of the model's RoPE tables (``ModelSpec.ropes``) at ``positions``."""
    rotary = model.model.rotary_emb
    return [rope(positions, getattr(rotary, f"{p}inv_freq"), getattr(rotary, f"{p}attention_scaling"), dtype) for p in spec.ropes]


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on ``x`` ``[1, heads, r, D]`` (transformers' ``rotate_half`` form) over its first ``R``
    dimensions (``cos``'s; Phi's partial rotary), the rest passed through."""
    rotated = cos.shape[-1]
    if rotated < x.shape[-1]:
        return torch.cat([rotate(x[..., :rotated], cos, sin), x[..., rotated:]], dim=-1)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], scale: float, pack: bool = False) -> Tensor:
    """SDPA of ``q`` ``[1, Hq, r, D]`` over ``k``/``v`` ``[1, Hkv, L, D]`` -> ``[1, r, Hq * D]``.
    ``mask``: additive or boolean ``[1, 1, r, L]``; None: every key for one position, causal for a
    pass with no cache before it (L == r). The key/value heads are shared inside the kernel, never copied.
    ``pack``: one position under a mask runs as transformers runs it (a group's queries as its rows)."""
    _, heads, r, dim = q.shape
    groups = k.shape[1]
    if pack and r == 1 and mask is not None and heads > groups:  # transformers' pack_gqa
        out = F.scaled_dot_product_attention(q.reshape(1, groups, heads // groups, dim), k, v, attn_mask=mask, scale=scale)
        return out.reshape(1, heads, 1, dim).transpose(1, 2).reshape(1, 1, heads * dim)
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


def window_seen(seen: Tensor, positions: Tensor, start: int, window: int) -> Tensor:
    """A tree pass's ``seen`` ``[r, L]`` (bool, slots ``< L``) cut to a window: row ``i`` (at
    ``positions[i]``) sees a slot whose position is within the last ``window`` (slots ``< start`` hold
    their positions; slot ``start + k`` holds the fed row ``k``'s)."""
    slots = torch.cat([torch.arange(start, device=positions.device), positions])[: seen.shape[-1]]
    return seen & (positions[:, None] - slots[None, :] < window)


def pass_masks(spec: ModelSpec, start: int, positions: Tensor, mask: Optional[Tensor]) -> Dict[Optional[int], Tuple[int, Optional[Tensor]]]:
    """Per attention window of the layers (None: full), the first key slot ``lo`` a pass attends from
    and its mask over slots ``lo..end`` (``attend``'s; ``mask``: the tree's ``[1, 1, r, >= end]``, None:
    causal). A sliding layer attends from ``start - window + 1``, the keys transformers' dynamic sliding
    cache holds, under the mask transformers builds for them (none where it builds none)."""
    r = positions.shape[0]
    end, device = start + r, positions.device
    found = {None: (0, causal_mask(start, r, device) if mask is None else mask)}
    for window in spec.windows:
        lo = max(0, start - window + 1)
        if mask is not None:
            seen = mask[0, 0, :, :end] if mask.dtype == torch.bool else mask[0, 0, :, :end] == 0
            found[window] = (lo, window_seen(seen, positions, start, window)[None, None, :, lo:])
        elif end - lo < window and (r == 1 or end - lo == r):  # transformers' _ignore_causal_mask_sdpa
            found[window] = (lo, None)
        else:
            keys, rows = torch.arange(lo, end, device=device), torch.arange(start, end, device=device)[:, None]
            found[window] = (lo, ((keys <= rows) & (rows - keys < window))[None, None])
    return found


# ---- a decoder layer's blocks, as its description states them (the lean forward's and the compiled step's) ----
def heads(attn: Module, x: Tensor, spec: ModelSpec, kv_heads: int, rotary: Optional[Tuple[Tensor, Tensor]]) -> Tuple[Tensor, ...]:
    """q ``[1, Hq, r, D]``, k and v ``[1, Hkv, r, D]`` of the attention ``attn`` on its normed input ``x``
    ``[1, r, H]``: projected (Phi-3: one linear), q/k-normed (OLMo 2: over all heads; Qwen3, Gemma 3: per
    head), q and k rotated by ``rotary`` (cos, sin; None: no RoPE)."""
    family, r = spec.family, x.shape[1]
    if family.fused:  # Phi-3: q, k and v one linear
        sizes = (attn.config.num_attention_heads * attn.head_dim, kv_heads * attn.head_dim)
        q, k, v = attn.qkv_proj(x).split([sizes[0], sizes[1], sizes[1]], dim=-1)
    else:
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    if family.qk_norm == "all":
        q, k = norm(q, attn.q_norm, family.norm), norm(k, attn.k_norm, family.norm)
    shape = (1, r, -1, attn.head_dim)
    q, k, v = q.view(shape), k.view(shape), v.view(shape)
    if family.qk_norm == "head":
        q, k = norm(q, attn.q_norm, family.norm), norm(k, attn.k_norm, family.norm)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if rotary is not None:
        q, k = rotate(q, *rotary), rotate(k, *rotary)
    return q, k, v


def residual(h: Tensor, delta: Tensor, out_norm: Optional[Module], spec: ModelSpec) -> Tensor:
    """``h`` plus a block's output: normed first where the family norms it (OLMo 2, Gemma 3), scaled
    where it scales it (Granite)."""
    if out_norm is not None:
        return h + norm(delta, out_norm, spec.family.norm)
    return h + delta if spec.residual_scale == 1.0 else h + delta * spec.residual_scale


def feed_forward(mlp: Module, x: Tensor, spec: ModelSpec) -> Tensor:
    """The MLP on its normed input: down(act(gate(x)) * up(x)) (Phi-3: gate and up one linear)."""
    if spec.family.fused:
        gate, up = mlp.gate_up_proj(x).chunk(2, dim=-1)
        return mlp.down_proj(up * mlp.activation_fn(gate))
    return mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))


def final_logits(model: Module, h: Tensor, spec: ModelSpec) -> Tensor:
    """The output layer on the final norm's output ``h``, Granite's divisor and Gemma's softcap applied."""
    logits = model.get_output_embeddings()(h)
    if spec.logit_divisor != 1.0:
        logits = logits / spec.logit_divisor
    if spec.softcap is not None:
        logits = torch.tanh(logits / spec.softcap) * spec.softcap
    return logits


# ---- the forward ----
class LlamaForward:
    """The forward over ``model``'s own modules (references only: nothing is copied), as its
    description (``models.layer_spec.model_spec``) states it. The decoder layers are kept; the modules
    inside them and the output layer are looked up at each pass: a kernel plan that swaps the model's
    linear layers (``runners.kernels``) after this was made is the one that runs."""

    def __init__(self, model: Module):
        reason = lean_unsupported(model)
        if reason is not None:
            raise ValueError(reason)
        self.model = model
        self.spec = model_spec(model)
        self.layers = list(model.model.layers)[: model.config.num_hidden_layers]  # a ModuleList's slice makes one: 0.3 ms

    @property
    def head(self) -> Module:
        """The output layer (the embeddings' own weight where they are tied)."""
        return self.model.get_output_embeddings()

    def embed(self, ids: Tensor) -> Tensor:
        """The embeddings of ``ids`` (any shape) the first layer reads (Granite's multiplier applied)."""
        h = self.model.model.embed_tokens(ids)
        return h if self.spec.embed_scale == 1.0 else h * self.spec.embed_scale

    def __call__(self, ids: Tensor, positions: Tensor, cache: KVCache, start: int, n_last: int,
                 mask: Optional[Tensor] = None, hidden_layers: Sequence[int] = ()) -> Tuple[Tensor, Optional[Tensor]]:
        """One pass over ``ids`` ``[r]`` at ``positions`` ``[r]``, their keys and values written at
        slots ``start..start + r - 1`` of ``cache``, attending to slots ``< start + r``. ``mask``:
        ``[1, 1, r, start + r]`` (a tree pass), None: causal. Returns the logits ``[n_last, V]`` of
        the last ``n_last`` positions and, with ``hidden_layers``, the residual stream entering
        those layers ``[r, len(hidden_layers) * H]`` (``runners.hidden.select_hidden``'s), else None."""
        r, body, spec = ids.shape[0], self.model.model, self.spec
        h = self.embed(ids[None])  # [1, r, H]
        ropes = rope_tables(self.model, spec, positions, h.dtype)
        masks = pass_masks(spec, start, positions, mask)
        kept = {}
        for i, layer in enumerate(self.layers):
            if i in hidden_layers:
                kept[i] = h[0]
            at = spec.layers[i]
            attn_in, attn_out, mlp_in, mlp_out = norm_modules(layer, spec)
            x = norm(h, attn_in, spec.family.norm)
            rotary = None if at.rope is None else ropes[at.rope]
            h = residual(h, self._attention(layer, x, rotary, cache.layers[i], start, masks[at.window], spec), attn_out, spec)
            h = residual(h, feed_forward(layer.mlp, norm(h, mlp_in, spec.family.norm), spec), mlp_out, spec)
        # the final norm and the output layer only where logits are asked for (the norm is per position)
        h = norm(h[:, r - n_last :], body.norm, spec.family.norm)
        hidden = torch.cat([kept[k] for k in hidden_layers], dim=-1) if hidden_layers else None
        return final_logits(self.model, h, spec)[0], hidden

    @staticmethod
    def _attention(layer: Module, x: Tensor, rotary: Optional[Tuple[Tensor, Tensor]], kv: KVLayer, start: int,
                   masked: Tuple[int, Optional[Tensor]], spec: ModelSpec) -> Tensor:
        """The attention block of ``layer`` on its normed input ``x`` ``[1, r, H]`` -> ``[1, r, H]``: keys
        and values written at slots ``start..``, attending to slots ``lo..`` under ``mask`` (``masked``)."""
        attn, end = layer.self_attn, start + x.shape[1]
        q, kv.keys[:, :, start:end], kv.values[:, :, start:end] = heads(attn, x, spec, kv.keys.shape[1], rotary)
        lo, mask = masked
        return attn.o_proj(attend(q, kv.keys[:, :, lo:end], kv.values[:, :, lo:end], mask, attn.scaling, pack=True))
