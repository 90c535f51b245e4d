"""The published shapes of issue 72's families (``SHAPES``: the configs' sizes, written out here, nothing
downloaded) and how a model of one is built with random weights: shared by the CUDA run
(``scripts/gpu/family_bench.py``) and the CPU table (``scripts/family_table.py``).

Qwen3-0.6B, Gemma-3-270M and Gemma-3-1B (text models, ``Gemma3ForCausalLM``), OLMo-2-0425-1B, SmolLM3-3B.
"""
from typing import Dict, List, Optional, Tuple

import torch

# name -> (transformers class, its config class, the published config's sizes and features)
SHAPES: Dict[str, Tuple[str, str, dict]] = {
    "qwen3-0.6b": ("Qwen3ForCausalLM", "Qwen3Config", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "gemma3-270m": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, max_position_embeddings=32768, rms_norm_eps=1e-6, query_pre_attn_scalar=256,
        sliding_window=512, tie_word_embeddings=True)),
    "gemma3-1b": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, max_position_embeddings=32768, rms_norm_eps=1e-6, query_pre_attn_scalar=256,
        sliding_window=512, tie_word_embeddings=True)),
    "olmo2-1b": ("Olmo2ForCausalLM", "Olmo2Config", dict(
        vocab_size=100352, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=16, max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    "smollm3-3b": ("SmolLM3ForCausalLM", "SmolLM3Config", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=4, max_position_embeddings=65536, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 5000000.0})),
}
# --tiny: every shape at these sizes, its features kept (Gemma's sliding and full layers, SmolLM3's layer
# without RoPE, a window the rehearsal's sequences pass)
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, num_hidden_layers=2)
TINY_LAYERS = {"Gemma3TextConfig": dict(layer_types=["sliding_attention", "full_attention"], sliding_window=16, head_dim=16),
               "SmolLM3Config": dict(num_hidden_layers=4), "Qwen3Config": dict(head_dim=16)}


def build(name: str, tiny: bool, dtype: torch.dtype, device: str, seed: int = 0):
    """The shape's model, transformers' own class with random weights (its own initialization, seeded),
    on ``device`` in ``dtype``, SDPA attention (what the lean forward admits)."""
    import transformers

    cls, config_cls, sizes = SHAPES[name]
    settings = {**sizes, **TINY, **TINY_LAYERS.get(config_cls, {})} if tiny else dict(sizes)
    config = getattr(transformers, config_cls)(**settings, attn_implementation="sdpa", pad_token_id=0, bos_token_id=1,
                                               eos_token_id=2)
    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(transformers, cls)(config)
    return model.to(dtype).eval()


def asked_shapes(text: str) -> List[str]:
    """The shapes a comma-separated ``--shapes`` names; an unknown one exits with one line."""
    names = text.split(",")
    unknown = [s for s in names if s not in SHAPES]
    if unknown:
        raise SystemExit(f"error: unknown shape(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    return names


def prompt_ids(vocab: int, length: int, seed: int = 1) -> List[int]:
    """A prompt of random ids whose second half repeats its first (so that prompt lookup drafts)."""
    half = torch.randint(3, vocab, (length // 2,), generator=torch.Generator().manual_seed(seed)).tolist()
    return half + half


def first_difference(a: List[int], b: List[int]) -> Optional[int]:
    """The first index where two token lists differ (a length difference counts), or None."""
    found = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return found if found is not None or len(a) == len(b) else min(len(a), len(b))
