"""The reference's module path for encoder-decoder speculative decoding (``sampling.encoder_decoder``)."""
from sampling.common import max_fn
from sampling.encoder_decoder import speculative_generate_encoder_decoder

__all__ = ["speculative_generate_encoder_decoder", "max_fn"]
