"""Chained drafting: the n-gram storage when it knows the context, else the drafter model."""
from runners.config import RunnerConfig
from typing import Callable, List, Tuple

import torch
from torch.nn import Module

from drafters import ChainedDrafter, ModelDrafter, ngram_drafter
from ngram_assisted.ngram_storage import INgramStorage
from utils.parsing import check_positive_int
from runners.limits import common_vocab_size
from sampling.draft_policy import DraftPolicy
from sampling.entry import generate
from sampling.stats import GenerationStats
from utils.logits_processor import GreedyProcessor, LogitsProcessor


@torch.no_grad()
def chained_speculative_generate(
    inputs: List[int], ngramstorage: INgramStorage, drafter: Module, target: Module, tokenizer=None, gamma: int = 5,
    filler_top_k: int = 3, logits_processor: LogitsProcessor = GreedyProcessor(), max_gen_len: int = 40,
    eos_tokens_id: int | List[int] = 1, pad_token_id: int = 0, use_cache: bool = False, first_target: bool = True,
    debug: bool = False, stats: GenerationStats | None = None, policy: DraftPolicy | None = None,
    streamer: Callable[[List[int], int], None] | None = None, compile: bool | None = None, runner: RunnerConfig | None = None, drafter_runner: RunnerConfig | None = None,
) -> Tuple[List[int], float]:
    """Speculative decoding drafting from ``ngramstorage`` when it knows the context, else from ``drafter``.

    A step drafted by the storage is verified by token comparison with the target's (M_p) own
    tokens; a step drafted by the model (M_q) by rejection sampling with ``norm(max(0, p - q))``
    (Leviathan et al. 2023). Both keep greedy exact and sampling lossless. The storage learns
    from every step as in NASD. The other arguments are as in ``speculative_generate``.

    Returns:
        (new token ids, acceptance rate = accepted drafts / drafted tokens).
    """
    filler = check_positive_int("filler_top_k", filler_top_k)

    def make(prompt, config):
        return ChainedDrafter(ngram_drafter(ngramstorage, prompt, filler, stop_if_unknown=True), ModelDrafter.of(drafter, config))

    return generate(inputs, target, make, locals(), vocab_size=common_vocab_size(drafter, target, tokenizer))
