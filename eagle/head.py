"""The EAGLE-3 draft head (Li et al. 2025, arXiv:2503.01840) as one small module.

The target's residual stream entering three of its layers (``aux_layers``, by default
``[2, n // 2, n - 3]``) is fused by ``fc`` into one hidden state ``g_t`` per position ``t``. One
decoder layer reads ``[embed(x_{t+1}); g_t]`` (``2H`` wide) and its output, through ``norm`` and
``lm_head``, scores the token ``x_{t+2}`` over a reduced draft vocabulary (``d2t``: draft id ->
target id offset; ``t2d``: which target ids the draft vocabulary holds). Later draft steps feed the
layer's own output back in place of ``g`` (the "training-time test" of the paper).

Module and buffer names are those of the speculators format (``fc``, ``layers.0.*``, ``norm``,
``lm_head``, ``d2t``, ``t2d``), so ``state_dict()`` is what ``eagle.format`` saves.
Shapes: ``H`` the head's hidden size, ``Ht`` the target's, ``Vd`` the draft vocabulary, ``V`` the target's.
"""
import weakref
from dataclasses import asdict, dataclass, field
from typing import Optional, Tuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F


@dataclass(frozen=True)
class HeadConfig:
    """The head's shape and how it reads its target."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    target_hidden_size: int
    target_vocab_size: int
    draft_vocab_size: int
    aux_layers: Tuple[int, ...]  # target layers whose input is fused (transformers' ``hidden_states[k]``)
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    head_dim: Optional[int] = None  # None: hidden_size // num_attention_heads
    norm_before_residual: bool = False
    fc_bias: bool = False
    max_position_embeddings: int = 8192
    rope_scaling: Optional[dict] = field(default=None, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "aux_layers", tuple(int(k) for k in self.aux_layers))
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    @staticmethod
    def default_layers(num_layers: int) -> Tuple[int, ...]:
        """EAGLE-3's choice: the residual stream entering layers 2, n // 2 and n - 3 (low, mid, high)."""
        return (min(2, num_layers - 1), num_layers // 2, max(0, num_layers - 3))

    @classmethod
    def for_target(cls, target: nn.Module, draft_vocab_size: int, **changes) -> "HeadConfig":
        """A head shaped like one decoder layer of ``target`` (its hidden size, heads, MLP width)."""
        c = target.config.get_text_config(decoder=True)
        values = dict(
            hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
            num_key_value_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
            intermediate_size=getattr(c, "intermediate_size", None) or 4 * c.hidden_size,
            target_hidden_size=c.hidden_size, target_vocab_size=target.get_output_embeddings().weight.shape[0],
            draft_vocab_size=draft_vocab_size, aux_layers=cls.default_layers(c.num_hidden_layers),
            rms_norm_eps=getattr(c, "rms_norm_eps", 1e-5), rope_theta=_rope_theta(c),
            max_position_embeddings=getattr(c, "max_position_embeddings", 8192),
        )
        values.update(changes)
        return cls(**values)

    def to_dict(self) -> dict:
        return asdict(self)


def _rope_theta(config) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return float(theta)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.to(torch.promote_types(dtype, torch.float32))
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(2 * c.hidden_size, self.heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, self.kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, self.kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * c.head_dim, c.hidden_size, bias=False)

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """Queries ``[B, heads, T, d]``, keys and values ``[B, kv_heads, T, d]`` of ``x`` ``[B, T, 2H]``,
        rotated by ``cos``/``sin`` ``[B or 1, T, d]``."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class MLP(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """One llama layer whose attention reads ``[norm(embedding); norm(hidden)]``."""

    def __init__(self, c: HeadConfig):
        super().__init__()
        self.norm_before_residual = c.norm_before_residual
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.mlp = MLP(c)

    def inputs(self, embeds: Tensor, hidden: Tensor) -> Tuple[Tensor, Tensor]:
        """The attention's input ``[B, T, 2H]`` and the residual ``[B, T, H]``."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        return torch.cat([self.input_layernorm(embeds), normed], dim=-1), residual

    def finish(self, attended: Tensor, residual: Tensor) -> Tensor:
        """After attention: ``o_proj``, the residual, the MLP block; returns the layer's output ``[B, T, H]``."""
        b, t = attended.shape[0], attended.shape[2]
        h = residual + self.self_attn.o_proj(attended.transpose(1, 2).reshape(b, t, -1))
        return h + self.mlp(self.post_attention_layernorm(h))


# head -> (its parameters' addresses and versions, its C head step or None), held weakly on the head and
# outside its ``__dict__``: the step (ctypes structs of addresses) neither copies nor pickles, and a copy
# of the head (``copy.deepcopy``) makes its own rather than replay the original's weights
_C_STEPS: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


class Eagle3Head(nn.Module):
    """The head's weights and its passes: ``decode`` over a KV cache (drafting), ``ttt`` over whole
    sequences (training). The token embedding is the target's unless the head owns one
    (``embed_tokens``, when a published head ships it)."""

    step_cost: Optional[float] = None  # a draft step against a target pass, once measured here (``eagle.cost``)

    def __init__(self, config: HeadConfig, embed_tokens: Optional[nn.Module] = None, own_embedding: bool = False):
        super().__init__()
        c = self.config = config
        self.fc = nn.Linear(len(c.aux_layers) * c.target_hidden_size, c.hidden_size, bias=c.fc_bias)
        self.layers = nn.ModuleList([DecoderLayer(c)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c.target_vocab_size, dtype=torch.bool))
        if own_embedding:
            self.embed_tokens = nn.Embedding(c.target_vocab_size, c.hidden_size)
        self._target_embed = (embed_tokens,)  # a tuple: not a submodule, so never saved or trained here
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        self.register_buffer("inv_freq", inv.float(), persistent=False)

    # ---- pieces ---------------------------------------------------------------------------------
    def embed(self, ids: Tensor) -> Tensor:
        module = getattr(self, "embed_tokens", None) or self._target_embed[0]
        if module is None:
            raise ValueError("the head has no token embedding: give the target's (embed_tokens=)")
        return module(ids).to(self.fc.weight.dtype)

    def set_vocabulary(self, draft_to_target: Tensor) -> None:
        """The draft vocabulary: ``draft_to_target[i]`` is draft token ``i``'s target id (distinct ids)."""
        ids = draft_to_target.to(torch.long)
        self.d2t.copy_(ids - torch.arange(len(ids)))
        self.t2d.zero_()
        self.t2d[ids] = True

    def target_ids(self) -> Tensor:
        """``[Vd]`` the target id of every draft token."""
        return self.d2t + torch.arange(len(self.d2t), device=self.d2t.device)

    def rotary(self, positions: Tensor, dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
        """cos, sin ``[..., d]`` at ``positions`` (any shape), in ``dtype`` (None: the head's)."""
        angles = positions.to(torch.float32).unsqueeze(-1) * self.inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        dtype = dtype or self.fc.weight.dtype
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def logits(self, hidden: Tensor) -> Tensor:
        """Draft-vocabulary logits ``[..., Vd]`` of layer outputs ``[..., H]``."""
        return self.lm_head(self.norm(hidden))

    # ---- drafting: one sequence over a KV cache -------------------------------------------------
    def decode(self, cache: "HeadCache", embeds: Tensor, hidden: Tensor, start: int, mask: Optional[Tensor] = None,
               positions: Optional[Tensor] = None) -> Tensor:
        """Feed ``m`` pairs (``embeds``, ``hidden`` ``[1, m, H]``) into cache slots ``start..start+m-1``;
        returns the layer's outputs ``[1, m, H]``. Default: positions ``start..``, each attending to
        the ``start`` slots before it and causally among themselves; a draft tree gives its own
        ``positions`` ``[m]`` and ``mask`` ``[m, start + m]`` (True: attends)."""
        layer = self.layers[0]
        x, residual = layer.inputs(embeds, hidden)
        m = x.shape[1]
        if positions is None:
            positions = torch.arange(start, start + m, device=x.device)
        cos, sin = self.rotary(positions.unsqueeze(0))
        q, k, v = layer.self_attn.qkv(x, cos, sin)
        keys, values = cache.write(start, k, v)
        if mask is None and m > 1:
            mask = torch.ones((m, start + m), dtype=torch.bool, device=x.device).tril(diagonal=start)
        attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        return layer.finish(attended, residual)

    def draft_step(self, cache: "HeadCache", ids: Tensor, start: int, hidden: Optional[Tensor] = None,
                   features: Optional[Tensor] = None, mask: Optional[Tensor] = None, positions: Optional[Tensor] = None,
                   n_last: int = 1) -> Tuple[Tensor, Tensor]:
        """``decode`` of tokens ``ids`` ``[m]`` with ``hidden`` ``[m, H]`` (the layer's outputs) or the target's
        ``features`` ``[m, F]`` (fused by ``fc``), then the draft logits of the last ``n_last`` rows: returns
        outputs ``[m, H]`` and logits ``[n_last, Vd]``. One C call (``kernels.head_step``) where the head runs
        it (float32 or bfloat16 CPU, library built, no forward hooks, a float32 ``cache``: ``step_kind``), else the
        torch step (a bfloat16 head's float32 cache cast to bfloat16 for it, and kept so); the same up to rounding."""
        m = ids.shape[0]
        if positions is None:
            positions = torch.arange(start, start + m, device=ids.device)
        # a hooked head: the torch step, whose modules fire their hooks
        step = None if self.hooked() or cache.keys.dtype != torch.float32 else self._c_step()
        embeds = self.embed(ids.unsqueeze(0))[0]
        if step is None:
            dtype = self.fc.weight.dtype
            cache.cast(dtype)
            hidden = self.fc(features.to(dtype)) if features is not None else hidden.to(dtype)
            out = self.decode(cache, embeds.unsqueeze(0), hidden.unsqueeze(0), start, mask, positions)[0]
            return out, self.logits(out[m - n_last :])
        cache.reserve(start + m)
        return step(cache, embeds, hidden, features, self.rotary(positions, torch.float32), start, mask, n_last)

    def step_kind(self) -> str:
        """What runs the draft step here: the C head step, or the torch step and why."""
        from kernels.head_step import TORCH_LABEL, head_step_unsupported, label

        from runners.hooks import hooked_modules

        hooks = hooked_modules(self)
        why = f"the head has forward hooks: {', '.join(hooks)}" if hooks else head_step_unsupported(self)
        return label(self) if why is None else f"{TORCH_LABEL} ({why})"

    def hooked(self) -> bool:
        """Whether the head has forward hooks now (``runners.hooks``, read at every step): its draft steps then
        run the torch step, where the modules it calls fire their hooks (the embedding, ``fc``, the norms,
        the linears, the MLP, ``lm_head``; its decoder layer and attention are no module call there)."""
        watch = self.__dict__.get("_hook_watch")
        if watch is None:
            from runners.hooks import HookWatch

            watch = self.__dict__["_hook_watch"] = HookWatch(self)
        return watch.hooked()

    def kept_c_step(self):
        """The C head step made so far (by a step drafted already: the warm-up's), or None; makes none."""
        found = _C_STEPS.get(self)
        return found[1] if found is not None else None

    def _c_step(self):
        """The C head step over the current weights (remade when one changes), or None where it cannot run."""
        identity = tuple((p.data_ptr(), p._version) for p in self.parameters())
        found = _C_STEPS.get(self)
        if found is None or found[0] != identity:
            from kernels.head_step import HeadStep, head_step_unsupported

            found = (identity, HeadStep(self) if head_step_unsupported(self) is None else None)
            _C_STEPS[self] = found
        return found[1]

    # ---- training: the training-time test over whole sequences ----------------------------------
    def ttt(self, features: Tensor, ids: Tensor, steps: int):
        """The training-time test over sequences: ``features`` ``[B, T, 3Ht]`` (the target's, at every
        position), ``ids`` ``[B, T]``. Step ``i`` (0-based) at index ``t`` reads token ``x_{t+1+i}`` and,
        for ``i = 0``, ``fc(f_t)``, else step ``i - 1``'s output at ``t``; it sits at position ``t + i``
        and attends to step 0's keys at indices ``<= t`` and to steps ``1..i``'s keys at ``t`` only, as
        a chain drafted from position ``t`` does. Yields each step's draft logits ``[B, T - 1 - i, Vd]``
        (index ``t`` scores ``x_{t+2+i}``)."""
        layer = self.layers[0]
        b, t_len, _ = features.shape
        hidden = self.fc(features.to(self.fc.weight.dtype))[:, :-1]
        n = t_len - 1
        index = torch.arange(n, device=features.device)
        causal = index.unsqueeze(1) >= index.unsqueeze(0)  # [n, n]
        keys, values = [], []
        for i in range(steps):
            m = n - i  # indices t < m have a token x_{t+1+i}
            if m <= 0:
                break
            embeds = self.embed(ids[:, 1 + i : 1 + i + m])
            x, residual = layer.inputs(embeds, hidden[:, :m])
            cos, sin = self.rotary((index[:m] + i).unsqueeze(0))
            q, k, v = layer.self_attn.qkv(x, cos, sin)
            keys.append(k)
            values.append(v)
            attended = _ttt_attention(q, keys, values, causal[:m, :n])
            hidden = layer.finish(attended, residual)
            yield self.logits(hidden)


def _ttt_attention(q: Tensor, keys: list, values: list, causal: Tensor) -> Tensor:
    """Attention of step ``len(keys) - 1``'s queries ``[B, h, m, d]``: over step 0's keys by ``causal``
    ``[m, n]``, and over each later step's key at the query's own index."""
    groups = q.shape[1] // keys[0].shape[1]
    m = q.shape[2]
    scale = q.shape[-1] ** -0.5
    k0 = keys[0].repeat_interleave(groups, dim=1)
    scores = [torch.matmul(q, k0.transpose(-1, -2)).mul(scale).masked_fill(~causal, float("-inf"))]
    for k in keys[1:]:
        scores.append((q * k[:, :, :m].repeat_interleave(groups, dim=1)).sum(-1, keepdim=True).mul(scale))
    weights = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(q.dtype)
    n = causal.shape[1]
    out = torch.matmul(weights[..., :n], values[0].repeat_interleave(groups, dim=1))
    for j, v in enumerate(values[1:]):
        out = out + weights[..., n + j : n + j + 1] * v[:, :, :m].repeat_interleave(groups, dim=1)
    return out


class HeadCache:
    """The head's keys and values for one sequence, written by slot: rolling back is writing over.
    Grows by doubling (copying what it holds) when a write goes past its capacity."""

    def __init__(self, head: Eagle3Head, capacity: int, device, dtype):
        c = head.config
        self.shape = (1, c.num_key_value_heads, capacity, c.head_dim)
        self.keys = torch.zeros(self.shape, device=device, dtype=dtype)
        self.values = torch.zeros(self.shape, device=device, dtype=dtype)

    def reserve(self, end: int) -> None:
        """Room for slots ``0..end-1``: grown by doubling, keeping every slot held."""
        if end > self.keys.shape[2]:
            shape = self.shape[:2] + (1 << (end - 1).bit_length(),) + self.shape[3:]
            keys, values = self.keys.new_zeros(shape), self.values.new_zeros(shape)
            held = self.keys.shape[2]
            keys[:, :, :held], values[:, :, :held] = self.keys, self.values
            self.keys, self.values = keys, values

    def cast(self, dtype: torch.dtype) -> None:
        """Keys and values in ``dtype`` from now on (a torch step after C ones: float32 rounded once)."""
        if self.keys.dtype != dtype:
            self.keys, self.values = self.keys.to(dtype), self.values.to(dtype)

    def write(self, start: int, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
        """Keys and values at slots ``start..``; returns views over slots ``0..start+m-1``."""
        end = start + k.shape[2]
        self.reserve(end)
        self.keys[:, :, start:end] = k
        self.values[:, :, start:end] = v
        return self.keys[:, :, :end], self.values[:, :, :end]
