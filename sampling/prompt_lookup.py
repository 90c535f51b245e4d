"""Prompt lookup decoding (Saxena 2023; transformers' ``prompt_lookup_num_tokens``, vLLM's ``ngram``)."""
from typing import Callable, List, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from sampling.common import check_positive_int, check_prompt, context_window, generation_end, stop_token_set
from sampling.draft_policy import DraftPolicy
from sampling.speculative_decoding import draft_and_verify
from sampling.stats import GenerationStats
from utils.caching import KVCacheModel
from utils.logits_processor import GreedyProcessor, LogitsProcessor


def lookup_continuation(tokens: Sequence[int], min_ngram: int, max_ngram: int, count: int) -> List[int]:
    """Up to ``count`` tokens that followed the earliest earlier occurrence of the sequence's last
    n-gram, trying n from ``max_ngram`` down to ``min_ngram``; [] when none occurs."""
    length = len(tokens)
    for size in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        tail = list(tokens[length - size :])
        first = tail[0]
        for start in range(length - size):
            if tokens[start] == first and list(tokens[start : start + size]) == tail:
                return list(tokens[start + size : start + size + count])
    return []


class PromptLookupDrafter:
    """Drafts by copying what followed the last n-gram earlier in the prompt or the generation."""

    cheap = True

    def __init__(self, min_ngram: int = 1, max_ngram: int = 3):
        self.min_ngram, self.max_ngram = min_ngram, max_ngram

    def max_drafts(self, position: int) -> int:
        return 1 << 30

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, None]:
        drafts = lookup_continuation(tokens, self.min_ngram, self.max_ngram, k)
        if drafts:
            ids[0, len(tokens) : len(tokens) + len(drafts)] = torch.tensor(drafts, dtype=torch.long)
        return len(drafts), None

    def fetch(self, target_probs: Tensor) -> None:
        return None

    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: List[int]) -> None:
        pass


@torch.no_grad()
def prompt_lookup_generate(
    inputs: List[int],
    target: Module,
    tokenizer=None,
    num_pred_tokens: int = 10,
    max_ngram_size: int = 3,
    min_ngram_size: int = 1,
    logits_processor: LogitsProcessor = GreedyProcessor(),
    max_gen_len: int = 40,
    eos_tokens_id: int | List[int] = 1,
    pad_token_id: int = 0,
    use_cache: bool = False,
    first_target: bool = True,
    debug: bool = False,
    stats: GenerationStats | None = None,
    policy: DraftPolicy | None = None,
    streamer: Callable[[List[int], int], None] | None = None,
) -> Tuple[List[int], float]:
    """Prompt lookup decoding: speculative decoding whose drafts are copied from the context.

    The longest suffix n-gram (``max_ngram_size`` down to ``min_ngram_size`` tokens) is searched
    in prompt + generated text; the ``num_pred_tokens`` tokens that followed its earliest
    occurrence are the drafts, verified by the target (M_p) in one pass. Drafts are deterministic,
    so acceptance compares them with the target's own token at each position (argmax when
    greedy, a sample otherwise), which keeps greedy exact and sampling lossless.

    Returns:
        (new token ids, acceptance rate = accepted drafts / drafted tokens).
    """
    prompt = check_prompt(inputs)
    check_positive_int("num_pred_tokens", num_pred_tokens)
    check_positive_int("min_ngram_size", min_ngram_size)
    check_positive_int("max_ngram_size", max_ngram_size)
    if min_ngram_size > max_ngram_size:
        raise ValueError(f"min_ngram_size ({min_ngram_size}) must be <= max_ngram_size ({max_ngram_size})")
    end = generation_end(len(prompt), max_gen_len, context_window(target))
    stats = stats if stats is not None else GenerationStats()
    out = draft_and_verify(
        prompt, KVCacheModel(target, use_cache), PromptLookupDrafter(min_ngram_size, max_ngram_size), logits_processor,
        num_pred_tokens, end, stop_token_set(eos_tokens_id), None, first_target, False, stats, debug, tokenizer, policy, streamer,
    )
    return out, stats.acceptance_rate
