"""Encoder-decoder models (T5, BART, ...): the encoder reads the prompt once, the decoder generates
from its start token. ``autoregressive_generate`` and ``speculative_generate`` take both kinds of
model; the reference's ``*_encoder_decoder`` names are the same functions. Both return the
generated decoder tokens, without the decoder start token."""
from typing import List, Tuple

from torch.nn import Module

from sampling.common import generation_end

from runners.limits import context_window


def is_encoder_decoder(model: Module) -> bool:
    return bool(getattr(model.config, "is_encoder_decoder", False))


def _decoder_start(model: Module) -> int:
    start = getattr(model.config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(model.generation_config, "decoder_start_token_id", None)
    if start is None:
        raise ValueError("the model's config has no decoder_start_token_id: is it an encoder-decoder model?")
    return int(start)


def decoder_inputs(prompt: List[int], target: Module, drafter: Module | None = None) -> Tuple[List[int], List[int] | None]:
    """What the loops start from: for encoder-decoder models the decoder's prompt (its start token)
    and the encoder's input ids (the prompt, checked against each encoder's window); for
    decoder-only models the prompt itself and None."""
    if not is_encoder_decoder(target):
        if drafter is not None and is_encoder_decoder(drafter):
            raise ValueError("drafter and target must both be decoder-only or both encoder-decoder")
        return prompt, None
    models = [m for m in (target, drafter) if m is not None]
    if not all(is_encoder_decoder(m) for m in models):
        raise ValueError("drafter and target must both be decoder-only or both encoder-decoder")
    start = _decoder_start(target)
    if any(_decoder_start(m) != start for m in models):
        raise ValueError("drafter and target use different decoder start tokens")
    for model in models:
        generation_end(len(prompt), 1, context_window(model))  # the encoder must hold the prompt
    return [start], prompt
