"""One description of a decoder layer, read from a transformers config: what the lean torch forward
(``models.llama``), the C step (``kernels.c_step``) and their runners compute, instead of a branch
per family in each. A family is a row of ``FAMILIES`` (its class, where its norms sit, their kind,
its q/k norms); everything else (activation, scales, windows, RoPE tables) is read from the config
and the model's own modules by ``model_spec``, and ``spec_unsupported`` names the one feature a model
has that the description cannot state.

Shapes: ``H`` hidden size, ``Hq``/``Hkv`` query and key/value heads, ``D`` head size.
"""
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from torch.nn import Module

# where a layer's norms sit, as the names of its modules: before attention, on its output (before the
# residual add), before the MLP, on its output; None: no norm there
PRE = ("input_layernorm", None, "post_attention_layernorm", None)  # Llama: "post_attention" is the MLP's input norm
POST = (None, "post_attention_layernorm", None, "post_feedforward_layernorm")  # OLMo 2
BOTH = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")  # Gemma 3


@dataclass(frozen=True)
class Family:
    """A row: transformers' own class, the places of its norms (``PRE``, ``POST``, ``BOTH``), their
    kind, its q/k norms, whether q/k/v and gate/up are one linear each (``qkv_proj``, ``gate_up_proj``),
    and its name in the headers ("lean Qwen3 forward")."""

    cls: str
    norms: Tuple[Optional[str], ...]
    # "w": weight * x.to(dtype) (Llama); "w32": (weight * x).to(dtype), scaled in float32 (OLMo 2);
    # "1+w": (x * (1 + weight)).to(dtype) in float32 (Gemma)
    norm: str = "w"
    qk_norm: Optional[str] = None  # "head": RMSNorm over each head's D (Qwen3, Gemma 3); "all": over Hq * D (OLMo 2)
    fused: bool = False
    name: str = ""


FAMILIES: Dict[str, Family] = {  # config.model_type -> its row
    "llama": Family("LlamaForCausalLM", PRE, name="Llama"),
    "qwen2": Family("Qwen2ForCausalLM", PRE, name="Qwen2"),
    "mistral": Family("MistralForCausalLM", PRE, name="Mistral"),
    "qwen3": Family("Qwen3ForCausalLM", PRE, qk_norm="head", name="Qwen3"),
    "smollm3": Family("SmolLM3ForCausalLM", PRE, name="SmolLM3"),
    "granite": Family("GraniteForCausalLM", PRE, name="Granite"),
    "phi3": Family("Phi3ForCausalLM", PRE, fused=True, name="Phi-3"),
    "olmo2": Family("Olmo2ForCausalLM", POST, norm="w32", qk_norm="all", name="OLMo 2"),
    "gemma3_text": Family("Gemma3ForCausalLM", BOTH, norm="1+w", qk_norm="head", name="Gemma 3"),
}
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}  # config's name -> the spec's
# RoPE types whose frequencies are fixed once (transformers' ``inv_freq`` buffer and
# ``attention_scaling``); "dynamic" and "longrope" recompute them from the sequence length
STATIC_ROPE = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer: its RoPE table (an index into ``ModelSpec.ropes``; None: no RoPE, SmolLM3's
    every fourth layer) and its attention window (the last ``window`` positions; None: all)."""

    rope: Optional[int]
    window: Optional[int]


@dataclass(frozen=True)
class ModelSpec:
    """A model's decoder as the lean forward and the C step compute it."""

    family: Family
    act: str  # "silu" or "gelu_tanh" (the MLP is down(act(gate(x)) * up(x)))
    ropes: Tuple[str, ...]  # the rotary module's tables by prefix: "" reads inv_freq, "sliding_attention_" its own
    rotary: int  # the dimensions RoPE rotates, the first of each head (D; Phi's partial_rotary_factor * D)
    scale: float  # the attention's score scale (query_pre_attn_scalar ** -0.5, Granite's attention_multiplier)
    embed_scale: float  # Granite's embedding_multiplier (Gemma's scale is inside its embedding module)
    residual_scale: float  # Granite's residual_multiplier: h = h + delta * scale
    logit_divisor: float  # Granite's logits_scaling: logits / divisor
    softcap: Optional[float]  # Gemma's final_logit_softcapping: tanh(logits / cap) * cap
    layers: Tuple[LayerSpec, ...]

    @property
    def windows(self) -> Tuple[int, ...]:
        """The distinct attention windows of the layers (none: every layer attends to all)."""
        return tuple(sorted({layer.window for layer in self.layers if layer.window is not None}))


_SPECS: Dict["ModelSpec", "ModelSpec"] = {}


def family_of(model: Module) -> Optional[Family]:
    """``model``'s row, where it is an instance of that row's transformers class itself (not a subclass
    nor a remote-code class that borrows the name: either may change any step of the forward)."""
    import transformers

    family = FAMILIES.get(getattr(getattr(model, "config", None), "model_type", None))
    if family is None or type(model) is not getattr(transformers, family.cls, None):
        return None
    return family


def family_name(model: Module) -> str:
    """``model``'s family as the headers name it ("Qwen3", "Gemma 3"); outside every row, its class's
    name less "ForCausalLM" (such a model is refused before any pass)."""
    family = family_of(model)
    return family.name if family is not None else type(model).__name__.removesuffix("ForCausalLM")


def _layer_types(config) -> Tuple[str, ...]:
    types = getattr(config, "layer_types", None)
    return tuple(types[: config.num_hidden_layers]) if types else ("full_attention",) * config.num_hidden_layers


def _rope_types(rotary: Module) -> Dict[str, str]:
    """The rotary module's RoPE type per table prefix ("" for a model with one table)."""
    kind = getattr(rotary, "rope_type", "default")
    return {f"{t}_": k for t, k in kind.items()} if isinstance(kind, dict) else {"": kind}


def spec_unsupported(model: Module) -> Optional[str]:
    """The one feature of ``model`` (a row's class) the description cannot state, in a line; None: none."""
    config, name = model.config, type(model).__name__
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return f"{name} softcaps its attention scores (attn_logit_softcapping): the lean forward's softmax takes them plain"
    if getattr(config, "use_bidirectional_attention", False):
        return f"{name} attends both ways (use_bidirectional_attention): the lean forward is causal"
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    if act not in ACTIVATIONS:
        return f"{name}'s activation {act!r} is none the lean forward computes ({', '.join(sorted(ACTIVATIONS))})"
    other = set(_layer_types(config)) - {"full_attention", "sliding_attention"}
    if other:
        return f"{name} has {', '.join(sorted(other))} layers: the lean forward takes full and sliding-window attention"
    for prefix, rope in _rope_types(model.model.rotary_emb).items():
        if rope not in STATIC_ROPE:
            return f"{name}'s RoPE scaling {rope!r} recomputes its frequencies by length: the lean forward takes {', '.join(STATIC_ROPE)}"
    return None


def _window(config, layer_type: str) -> Optional[int]:
    """A layer's attention window: the config's ``sliding_window`` where the layer slides (every layer
    where the config names no layer types: Mistral, Phi-3), else None."""
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None
    return window if layer_type == "sliding_attention" or not getattr(config, "layer_types", None) else None


def model_spec(model: Module) -> ModelSpec:
    """The description of ``model`` (a row's class that ``spec_unsupported`` takes)."""
    config, family = model.config, family_of(model)
    rotary = model.model.rotary_emb
    types = _layer_types(config)
    ropes = tuple(_rope_types(rotary))
    no_rope = getattr(config, "no_rope_layers", None)  # SmolLM3: 0 where a layer has no RoPE
    layers = tuple(LayerSpec(None if no_rope is not None and not no_rope[i] else (0 if ropes == ("",) else ropes.index(f"{t}_")),
                             _window(config, t)) for i, t in enumerate(types))
    attn = model.model.layers[0].self_attn
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    spec = ModelSpec(family, ACTIVATIONS[act], ropes, 2 * getattr(rotary, f"{ropes[0]}inv_freq").shape[0], attn.scaling,
                     float(getattr(config, "embedding_multiplier", 1.0)), float(getattr(config, "residual_multiplier", 1.0)),
                     float(getattr(config, "logits_scaling", 1.0)), getattr(config, "final_logit_softcapping", None), layers)
    # one object per description: the compiled step's regional graph (``models.llama_step.decoder_layer``)
    # takes it as an argument, and serves every model that equals it
    return _SPECS.setdefault(spec, spec)


def norm_modules(layer: Module, spec: ModelSpec) -> Tuple[Optional[Module], ...]:
    """A layer's norms at the four places (before attention, after it, before the MLP, after it)."""
    return tuple(None if name is None else getattr(layer, name) for name in spec.family.norms)


def norm_eps(norm: Module) -> float:
    """A norm module's epsilon (``variance_epsilon``, Gemma's ``eps``)."""
    eps = getattr(norm, "variance_epsilon", None)
    return norm.eps if eps is None else eps
