"""The reference's module path for encoder-decoder speculative decoding (``sampling.speculative_decoding``, which takes both kinds of model)."""
from sampling.common import max_fn
from sampling.speculative_decoding import speculative_generate_encoder_decoder

__all__ = ["speculative_generate_encoder_decoder", "max_fn"]
