"""The reference's module path for encoder-decoder autoregressive decoding (``sampling.encoder_decoder``)."""
from sampling.encoder_decoder import autoregressive_generate_encoder_decoder

__all__ = ["autoregressive_generate_encoder_decoder"]
