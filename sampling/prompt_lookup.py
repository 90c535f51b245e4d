"""Prompt lookup decoding (Saxena 2023; transformers' ``prompt_lookup_num_tokens``, vLLM's ``ngram``)."""
from runners.config import RunnerConfig
from typing import Callable, List, Tuple

import torch
from torch.nn import Module

from drafters.prompt_lookup import PromptLookupDrafter, lookup_continuation  # noqa: F401 (importable from here, as before)
from sampling.common import check_prompt
from utils.parsing import check_positive_int
from sampling.draft_policy import DraftPolicy
from sampling.entry import generate
from sampling.stats import GenerationStats
from utils.logits_processor import GreedyProcessor, LogitsProcessor


@torch.no_grad()
def prompt_lookup_generate(
    inputs: List[int], target: Module, tokenizer=None, num_pred_tokens: int = 10, max_ngram_size: int = 3,
    min_ngram_size: int = 1, logits_processor: LogitsProcessor = GreedyProcessor(), max_gen_len: int = 40,
    eos_tokens_id: int | List[int] = 1, pad_token_id: int = 0, use_cache: bool = False, first_target: bool = True,
    debug: bool = False, stats: GenerationStats | None = None, policy: DraftPolicy | None = None,
    streamer: Callable[[List[int], int], None] | None = None, compile: bool | None = None, runner: RunnerConfig | None = None,
) -> Tuple[List[int], float]:
    """Prompt lookup decoding: speculative decoding whose drafts are copied from the context.

    The longest suffix n-gram (``max_ngram_size`` down to ``min_ngram_size`` tokens) is searched
    in prompt + generated text; the ``num_pred_tokens`` tokens that followed its earliest
    occurrence are the drafts, verified by the target (M_p) in one pass. Drafts are deterministic,
    so acceptance compares them with the target's own token at each position (argmax when
    greedy, a sample otherwise), which keeps greedy exact and sampling lossless. The other
    arguments are as in ``speculative_generate``.

    Returns:
        (new token ids, acceptance rate = accepted drafts / drafted tokens).
    """
    prompt = check_prompt(inputs)
    check_positive_int("num_pred_tokens", num_pred_tokens)
    low, high = check_positive_int("min_ngram_size", min_ngram_size), check_positive_int("max_ngram_size", max_ngram_size)
    if low > high:
        raise ValueError(f"min_ngram_size ({low}) must be <= max_ngram_size ({high})")
    return generate(prompt, target, PromptLookupDrafter(low, high), locals(), gamma=num_pred_tokens)
