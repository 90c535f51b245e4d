"""An EAGLE-3 head's draft step in one C call (``head_step.c``) on the C step's kernels: its fc, its
one decoder layer (q/k/v over ``2H`` inputs), its own KV cache, norms, RoPE and output layer, float32
on CPU over weights blocked once (``kernels.blocked``). A bfloat16 head's weights are blocked in
bfloat16 and read by the C step's bfloat16 path (``kernels.bf16``); the rest of its step, its cache
(``cache_dtype``) and its logits are float32. A row's result depends only on its own row and the
cache, never on the step's width or the thread count, as in ``c_step.c``.

``head_step_unsupported(head)`` says why a head cannot run it (None: it can); ``HeadStep(head)``
holds the weights' addresses and runs a step. ``eagle.head.Eagle3Head.draft_step`` falls back to
the head's torch step where this cannot run.
"""
import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.nn import Module

import kernels.bf16 as bf16
import kernels.skinny as skinny
import kernels.step_scratch as step_scratch
from kernels.blocked import blocked, fusable, fused

LABEL = "C head step (skinny linears on blocked weights)"
TORCH_LABEL = "torch head step"


def label(head: Module) -> str:
    """What the header calls the C head step running ``head``: ``LABEL``, with a bfloat16 head's path
    ("C head step (bfloat16 weights read by the avx512_bf16 dot, ...; skinny linears on blocked weights)")."""
    if head.fc.weight.dtype != torch.bfloat16 or not skinny.available()[0]:
        return LABEL
    library = skinny.library()
    return f"C head step ({bf16.describe(library, bf16.chosen(library, gate_up_shape(head)), gate_up_shape(head))}; {LABEL.split(' (', 1)[1]}"


def gate_up_shape(head: Module) -> Tuple[int, int]:
    """(N, K) of the head's gate/up fused: the linear a bfloat16 path is measured on, where none was yet."""
    mlp = head.layers[0].mlp
    return mlp.gate_proj.out_features + mlp.up_proj.out_features, mlp.gate_proj.in_features


def cache_dtype(head: Module) -> torch.dtype:
    """The dtype of a head cache (``eagle.head.HeadCache``) the head's draft steps write: float32 where the
    C head step runs them (a bfloat16 head's too: the step computes in float32), else the head's own."""
    return torch.float32 if head_step_unsupported(head) is None else head.fc.weight.dtype


class _Weights(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in
                ("fc", "fc_bias", "in_norm", "hidden_norm", "post_norm", "qkv", "o", "gate_up", "down", "norm", "lm_head",
                 "keys", "values")]


class _Dims(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in ("H", "F", "Hq", "Hkv", "D", "I", "Vd", "cap", "norm_before_residual")] + \
               [("eps", ctypes.c_float), ("scale", ctypes.c_float), ("weights", ctypes.c_int64)]


def head_step_unsupported(head: Module) -> Optional[str]:
    """Why ``head`` (``eagle.head.Eagle3Head``) cannot run the C head step here, or None."""
    built, why = skinny.available()
    if not built:
        return why
    layer = head.layers[0]
    a, mlp = layer.self_attn, layer.mlp
    linears = [head.fc, a.q_proj, a.k_proj, a.v_proj, a.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj, head.lm_head]
    if any(type(x) is not torch.nn.Linear or x._forward_hooks or x._forward_pre_hooks for x in linears):
        return "a linear layer is quantized, hooked or not nn.Linear"
    dtype = head.fc.weight.dtype
    if any(p.dtype != dtype or p.dtype not in (torch.float32, torch.bfloat16) or p.device.type != "cpu" for p in head.parameters()):
        return "the C head step runs float32 or bfloat16 weights on CPU"
    if dtype == torch.bfloat16 and any(x.in_features % 2 for x in linears):
        return "an input size is odd (bfloat16 weights are read in pairs)"
    if any(x.bias is not None for x in linears[1:]):
        return "its layer has biases"
    if not fusable([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]) or not fusable([mlp.gate_proj.weight, mlp.up_proj.weight]):
        return "its q/k/v or gate/up sizes are not multiples of 16"
    if a.head_dim > 512 or a.heads % a.kv_heads:
        return "head size over 512, or query heads not a multiple of key-value heads"
    return None


class HeadStep:
    """The head's weights as ``head_step.c`` reads them. Shapes: ``m`` positions a step feeds, ``H``
    the head's hidden size, ``F`` the fc's input, ``D`` head size, ``Vd`` the draft vocabulary."""

    def __init__(self, head: Module):
        reason = head_step_unsupported(head)
        if reason is not None:
            raise ValueError(reason)
        self.library = skinny.library()
        bfloat16 = head.fc.weight.dtype == torch.bfloat16
        c, layer = head.config, head.layers[0]
        a, mlp = layer.self_attn, layer.mlp
        self.hidden, self.vocab = c.hidden_size, c.draft_vocab_size
        self.dims = _Dims(c.hidden_size, head.fc.in_features, a.heads, a.kv_heads, a.head_dim, mlp.gate_proj.out_features,
                          c.draft_vocab_size, 0, int(layer.norm_before_residual), layer.input_layernorm.eps, a.head_dim ** -0.5,
                          bf16.chosen(self.library, gate_up_shape(head)) if bfloat16 else bf16.F32)
        parts = dict(fc=blocked(head.fc.weight, verify=skinny.holds), fc_bias=None if head.fc.bias is None else head.fc.bias.detach().float(),
                     in_norm=layer.input_layernorm.weight.detach().float(), hidden_norm=layer.hidden_norm.weight.detach().float(),
                     post_norm=layer.post_attention_layernorm.weight.detach().float(),
                     qkv=fused([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], verify=skinny.holds), o=blocked(a.o_proj.weight, verify=skinny.holds),
                     gate_up=fused([mlp.gate_proj.weight, mlp.up_proj.weight], verify=skinny.holds), down=blocked(mlp.down_proj.weight, verify=skinny.holds),
                     norm=head.norm.weight.detach().float(), lm_head=blocked(head.lm_head.weight, verify=skinny.holds))
        self.keep = []  # every tensor whose address the struct holds
        self.weights = _Weights()
        for name, tensor in parts.items():
            if tensor is not None:
                tensor = tensor.contiguous()
                self.keep.append(tensor)
                setattr(self.weights, name, tensor.data_ptr())
        self.scratch = torch.empty(0)  # grown to the widest step yet: no allocation per step

    def reserve(self, rows: int, capacity: int) -> None:
        """The scratch grown, before a timed run, to a step of up to ``rows`` positions over a cache of ``capacity``
        slots (``head_step_scratch`` grows with both), so that no timed step grows it (``app.steps.reserve_head_scratch``)."""
        cap, self.dims.cap = self.dims.cap, capacity
        try:
            needed = self.library.head_step_scratch(ctypes.byref(self.dims), ctypes.c_int64(rows), ctypes.c_int64(torch.get_num_threads()))
        finally:
            self.dims.cap = cap  # each step sets it from its cache
        self._grow(needed, f"steps of up to {rows} positions over {capacity} slots")

    def _grow(self, floats: int, why: str) -> None:
        """The scratch grown to ``floats`` float32 where it is smaller (``kernels.step_scratch.grow``: noted as one-time work)."""
        if self.scratch.numel() < floats:
            step_scratch.grow(self, floats, why, touch=True, whose="head step")

    def __call__(self, cache, embeds: Tensor, hidden: Optional[Tensor], features: Optional[Tensor], rope: Tuple[Tensor, Tensor],
                 start: int, mask: Optional[Tensor], n_last: int) -> Tuple[Tensor, Tensor]:
        """One step: ``embeds`` ``[m, H]``; ``hidden`` ``[m, H]`` (the layer's earlier outputs) or ``features``
        ``[m, F]`` (fused by fc); ``rope``: cos, sin ``[m, D]``; keys and values to slots ``start..`` of ``cache``
        (``eagle.head.HeadCache``, float32, holding them); ``mask`` ``[m, start + m]`` bool (a tree) or None
        (causal). Rows of any float dtype, read as float32. Returns the layer's outputs ``[m, H]`` and the
        draft logits ``[n_last, Vd]`` of the last rows (float32)."""
        m, threads = embeds.shape[0], torch.get_num_threads()
        keys, values = cache.keys, cache.values
        if keys.dtype != torch.float32:
            raise ValueError(f"the C head step writes a float32 cache, not {keys.dtype}")
        self.weights.keys, self.weights.values, self.dims.cap = keys.data_ptr(), values.data_ptr(), keys.shape[2]
        self._grow(self.library.head_step_scratch(ctypes.byref(self.dims), ctypes.c_int64(m), ctypes.c_int64(threads)),
                   f"a step of {m} positions")
        embeds, cos, sin = (t.to(torch.float32).contiguous() for t in (embeds, *rope))
        g = torch.empty((m, self.hidden)) if features is not None else hidden.to(torch.float32).contiguous()
        features = None if features is None else features.to(torch.float32).contiguous()
        out, logits = torch.empty((m, self.hidden)), torch.empty((n_last, self.vocab))
        seen = None if mask is None else mask.to(torch.uint8).contiguous()
        c = ctypes.c_void_p
        self.library.head_step(
            ctypes.byref(self.weights), ctypes.byref(self.dims), c(embeds.data_ptr()),
            c(None if features is None else features.data_ptr()), c(g.data_ptr()), c(cos.data_ptr()), c(sin.data_ptr()),
            ctypes.c_int64(m), ctypes.c_int64(start), c(None if seen is None else seen.data_ptr()), c(out.data_ptr()),
            c(logits.data_ptr()), ctypes.c_int64(n_last), c(self.scratch.data_ptr()), ctypes.c_int64(threads))
        return out, logits
