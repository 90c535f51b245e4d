"""The reference's module path for encoder-decoder autoregressive decoding (``sampling.base_decoding``, which takes both kinds of model)."""
from sampling.base_decoding import autoregressive_generate_encoder_decoder

__all__ = ["autoregressive_generate_encoder_decoder"]
