"""The ctypes mirrors of ``c_step.c``'s structs, field for field: ``Layer`` (a decoder layer's weights, its cache's
keys and values, its kept key blocks) and ``Dims`` (the model's sizes and scalars, the pass's variant), and a
model's ``Dims``; ``Top``, what the step reads of each logits row (``Dims.tops``)."""
import ctypes

from torch.nn import Module

from models.layer_spec import ModelSpec, norm_eps


class Layer(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in
                ("in_norm", "post_norm", "qkv", "qkv_bias", "o", "o_bias", "gate_up", "down", "keys", "values",
                 "attn_out_norm", "mlp_out_norm", "q_norm", "k_norm")] + [("window", ctypes.c_int64), ("rope", ctypes.c_int64), ("kept_blocks", ctypes.c_void_p)]


class Dims(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in ("layers", "H", "Hq", "Hkv", "D", "I", "cap")] + \
               [("eps", ctypes.c_float), ("scale", ctypes.c_float)] + [(name, ctypes.c_int64) for name in ("rot", "qk_norm", "act")] + \
               [(name, ctypes.c_float) for name in ("residual_scale", "logit_divisor", "softcap")] + \
               [("weights", ctypes.c_int64), ("tile", ctypes.c_int64), ("kept", ctypes.c_int64), ("tops", ctypes.c_void_p),
                ("kv", ctypes.c_int64)]  # the cache's element: 0 float32, 1 bfloat16


class Top(ctypes.Structure):
    """``logits_top.h``'s ``Top``: a logits row's argmax as torch.argmax gives it, its value, the largest of the rest."""

    _fields_ = [("at", ctypes.c_int64), ("top", ctypes.c_float), ("others", ctypes.c_float)]


QK_NORMS = {None: 0, "head": 1, "all": 2}  # Dims.qk_norm
ACTS = {"silu": 0, "gelu_tanh": 1}  # Dims.act


def dims(model: Module, spec: ModelSpec) -> Dims:
    """A model's ``Dims`` (``cap``, ``weights``, ``tile``, ``kept``, ``kv``: 0, set by the step)."""
    config, attn = model.config, model.model.layers[0].self_attn
    return Dims(config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                 attn.head_dim, config.intermediate_size, 0, norm_eps(model.model.norm), spec.scale, spec.rotary,
                 QK_NORMS[spec.family.qk_norm], ACTS[spec.act], spec.residual_scale, spec.logit_divisor, spec.softcap or 0.0)


__all__ = ["ACTS", "Dims", "Layer", "QK_NORMS", "Top", "dims"]
