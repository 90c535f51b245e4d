"""Tiny random models of each family the lean forward and the C step take beyond Llama
(``models.layer_spec.FAMILIES``), transformers' own classes built from their configs (nothing
downloaded), in float64, each with every feature of its family switched on: q/k norms, post-norms,
(1 + w) norms, GELU-tanh, embedding/residual/attention/logit scales, a final softcap, partial and
per-layer RoPE, layers without RoPE, and sliding windows shorter than the tests' contexts."""
import torch

from conftest import VOCAB

WINDOW = 8  # a sliding window well inside the tests' contexts (up to 40 positions)
SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=256, tie_word_embeddings=False,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _made(cls, config, seed: int):
    """``cls(config)`` in float64, its norms' weights and biases random (transformers starts them at 1,
    0 or Gemma's 0: a norm's weight or a bias that read nothing would pass any test)."""
    torch.manual_seed(seed)
    model = cls(config).to(torch.float64).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.normal_(0.0 if "gemma" in config.model_type else 1.0, 0.3)
            elif name.endswith(".bias"):
                parameter.normal_(0, 0.3)
    return model


def qwen3():
    """Per-head q/k norms, q/k/v biases, sliding windows on the layers past the first."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(num_hidden_layers=3, attention_bias=True, use_sliding_window=True, sliding_window=WINDOW,
                         max_window_layers=1, **SMALL)
    return _made(Qwen3ForCausalLM, config, 11)


def olmo2():
    """Norms after each block only, q/k norms over all heads."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    return _made(Olmo2ForCausalLM, Olmo2Config(num_hidden_layers=2, **SMALL), 12)


def smollm3():
    """No RoPE on every fourth layer, and those layers sliding."""
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    config = SmolLM3Config(num_hidden_layers=4, use_sliding_window=True, sliding_window=WINDOW, **SMALL)
    assert config.no_rope_layers == [1, 1, 1, 0] and config.layer_types[3] == "sliding_attention"
    return _made(SmolLM3ForCausalLM, config, 13)


def granite():
    """Embedding, residual, attention and logit scales."""
    from transformers import GraniteConfig, GraniteForCausalLM

    config = GraniteConfig(num_hidden_layers=2, embedding_multiplier=6.0, residual_multiplier=0.3, attention_multiplier=0.1,
                           logits_scaling=4.0, **{k: v for k, v in SMALL.items() if k != "head_dim"})
    return _made(GraniteForCausalLM, config, 14)


def phi3():
    """Fused q/k/v and gate/up, half the head rotated, a sliding window on every layer."""
    from transformers import Phi3Config, Phi3ForCausalLM

    settings = {k: v for k, v in SMALL.items() if k != "head_dim"}
    config = Phi3Config(num_hidden_layers=2, sliding_window=WINDOW, partial_rotary_factor=0.5, **settings)
    model = _made(Phi3ForCausalLM, config, 15)
    assert model.model.rotary_emb.inv_freq.shape[0] * 2 == 8  # of 16
    return model


def gemma3():
    """(1 + w) norms before and after each block, GELU-tanh, per-head q/k norms, the embedding scale,
    query_pre_attn_scalar, sliding layers with their own RoPE base, a final softcap."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    rope = {"full_attention": {"rope_type": "default", "rope_theta": 100000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}}
    config = Gemma3TextConfig(num_hidden_layers=3, sliding_window=WINDOW, sliding_window_pattern=2, query_pre_attn_scalar=24,
                              final_logit_softcapping=3.0, rope_parameters=rope, **SMALL)
    assert config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    return _made(Gemma3ForCausalLM, config, 16)


def sliding_mistral():
    from transformers import MistralConfig, MistralForCausalLM

    return _made(MistralForCausalLM, MistralConfig(num_hidden_layers=2, sliding_window=WINDOW, **SMALL), 17)


def sliding_qwen2():
    """Qwen2 sliding on its layers past the first (max_window_layers), with its q/k/v biases."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
                         **{k: v for k, v in SMALL.items() if k != "head_dim"})
    return _made(Qwen2ForCausalLM, config, 18)


FAMILY_MODELS = {"qwen3": qwen3, "olmo2": olmo2, "smollm3": smollm3, "granite": granite, "phi3": phi3, "gemma3": gemma3,
                 "mistral_window": sliding_mistral, "qwen2_window": sliding_qwen2}
