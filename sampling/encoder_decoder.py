"""Encoder-decoder variants (T5, BART, ...): the encoder reads the prompt once, the decoder generates.

Both return the generated decoder tokens, without the decoder start token.
"""
from typing import Callable, List, Tuple

import torch
from torch.nn import Module

from sampling.base_decoding import generate_with
from sampling.common import check_prompt, common_vocab_size, context_window, generation_end, reference_keywords
from sampling.config import GenerationConfig
from sampling.draft_policy import DraftPolicy
from sampling.drafters import ModelDrafter
from sampling.speculative_decoding import speculative
from sampling.stats import GenerationStats
from utils.caching import KVCacheModel
from utils.logits_processor import GreedyProcessor, LogitsProcessor


def _decoder_start(model: Module) -> int:
    start = getattr(model.config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(model.generation_config, "decoder_start_token_id", None)
    if start is None:
        raise ValueError("the model's config has no decoder_start_token_id: is it an encoder-decoder model?")
    return int(start)


def _check_encoder_room(model: Module, prompt: List[int]) -> None:
    """The encoder must hold the prompt (the decoder's length is checked by the loops)."""
    generation_end(len(prompt), 1, context_window(model))


@reference_keywords
@torch.no_grad()
def autoregressive_generate_encoder_decoder(
    inputs: List[int], model: Module, max_gen_len: int = 40, logits_processor: LogitsProcessor = GreedyProcessor(),
    eos_tokens_id: int | List[int] = 1, pad_token_id: int = 0, use_cache: bool = False, debug: bool = False,
    stats: GenerationStats | None = None, streamer: Callable[[List[int], int], None] | None = None,
) -> List[int]:
    """``autoregressive_generate`` for an encoder-decoder model; ``inputs`` go to the encoder."""
    prompt = check_prompt(inputs)
    config = GenerationConfig.of(locals())
    _check_encoder_room(model, prompt)
    return generate_with([_decoder_start(model)], KVCacheModel(model, use_cache, encoder_input_ids=prompt), config)


@reference_keywords
@torch.no_grad()
def speculative_generate_encoder_decoder(
    inputs: List[int], drafter: Module, target: Module, tokenizer=None, gamma: int = 5,
    logits_processor: LogitsProcessor = GreedyProcessor(), max_gen_len: int = 40, eos_tokens_id: int | List[int] = 1,
    pad_token_id: int = 0, use_cache: bool = False, skip_sample_adjustment: bool = False, first_target: bool = True,
    debug: bool = False, stats: GenerationStats | None = None, policy: DraftPolicy | None = None,
    streamer: Callable[[List[int], int], None] | None = None,
) -> Tuple[List[int], float]:
    """``speculative_generate`` for encoder-decoder models sharing one decoder vocabulary.

    Same algorithm and acceptance rule (Leviathan et al. 2023): both encoders read ``inputs`` once,
    the drafter's decoder proposes ``gamma`` tokens, the target's decoder verifies them in one pass.
    """
    prompt = check_prompt(inputs)
    config = GenerationConfig.of(locals(), vocab_size=common_vocab_size(drafter, target, tokenizer))
    start = _decoder_start(target)
    if _decoder_start(drafter) != start:
        raise ValueError("drafter and target use different decoder start tokens")
    for model in (target, drafter):
        _check_encoder_room(model, prompt)
    drafting = ModelDrafter.of(drafter, config, encoder_input_ids=prompt)
    return speculative([start], KVCacheModel(target, use_cache, encoder_input_ids=prompt), drafting, config)
