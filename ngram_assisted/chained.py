"""Chained drafting: the n-gram storage when it knows the context, else the drafter model."""
from typing import Callable, List, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from ngram_assisted.ngram_assisted import ngram_drafter
from ngram_assisted.ngram_storage import INgramStorage
from sampling.common import check_positive_int, check_prompt, common_vocab_size, context_window, generation_end, stop_token_set
from sampling.draft_policy import DraftPolicy
from sampling.speculative_decoding import ModelDrafter, check_gamma, draft_and_verify
from sampling.stats import GenerationStats
from utils.caching import KVCacheModel
from utils.logits_processor import GreedyProcessor, LogitsProcessor


class ChainedDrafter:
    """Each step, the first drafter of the chain that proposes something drafts (llama.cpp tries its
    n-gram caches before the draft model). Every drafter hears the outcome of every step."""

    def __init__(self, *drafters):
        self.drafters = drafters
        self.memory_key = ("chained",) + tuple(getattr(d, "memory_key", None) for d in drafters)
        self.used: List[int] = [0] * len(drafters)  # steps drafted by each

    def max_drafts(self, position: int) -> int:
        return max(d.max_drafts(position) for d in self.drafters)

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, Tensor | None]:
        for i, drafter in enumerate(self.drafters):
            count, q = drafter.propose(ids, tokens, min(k, drafter.max_drafts(len(tokens))))
            if count > 0:
                self.used[i] += 1
                return count, q
        return 0, None

    def fetch(self, target_probs: Tensor) -> Tensor | None:
        wanted = [d.fetch(target_probs) for d in self.drafters]
        self._sizes = [w.numel() if w is not None else 0 for w in wanted]
        parts = [w.reshape(-1) for w in wanted if w is not None]
        return torch.cat(parts) if parts else None

    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: List[int]) -> None:
        offset = 0
        for drafter, size in zip(self.drafters, self._sizes):
            drafter.accept(tokens, start, n_accepted, fetched[offset : offset + size])
            offset += size


@torch.no_grad()
def chained_speculative_generate(
    inputs: List[int],
    ngramstorage: INgramStorage,
    drafter: Module,
    target: Module,
    tokenizer=None,
    gamma: int = 5,
    filler_top_k: int = 3,
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
    """Speculative decoding drafting from ``ngramstorage`` when it knows the context, else from ``drafter``.

    A step drafted by the storage is verified by token comparison with the target's (M_p) own
    tokens; a step drafted by the model (M_q) by rejection sampling with ``norm(max(0, p - q))``
    (Leviathan et al. 2023). Both keep greedy exact and sampling lossless. The storage learns
    from every step as in NASD.

    Returns:
        (new token ids, acceptance rate = accepted drafts / drafted tokens).
    """
    prompt = check_prompt(inputs)
    check_gamma(gamma)
    check_positive_int("filler_top_k", filler_top_k)
    vocab_size = common_vocab_size(drafter, target, tokenizer)
    end = generation_end(len(prompt), max_gen_len, context_window(target))
    stats = stats if stats is not None else GenerationStats()
    storage_drafter = ngram_drafter(ngramstorage, prompt, filler_top_k, stop_if_unknown=True)
    model_drafter = ModelDrafter.of(drafter, use_cache, logits_processor, vocab_size, policy)
    chain = ChainedDrafter(storage_drafter, model_drafter)
    out = draft_and_verify(
        prompt, KVCacheModel(target, use_cache), chain, logits_processor, gamma, end, stop_token_set(eos_tokens_id),
        vocab_size, first_target, False, stats, debug, tokenizer, policy, streamer,
    )
    return out, stats.acceptance_rate
