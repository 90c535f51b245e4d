"""NASD: n-gram assisted speculative decoding (an n-gram storage replaces the drafter model): the
reference's ``ngram_assisted_speculative_generate``, a thin wrapper over the one entry
(``sampling.generate`` with ``drafters.NGramSpec``)."""
from typing import Callable, List, Tuple

import torch
from torch.nn import Module

from drafters.ngram import NGramDrafter, NGramSpec, TensorStorageDrafter, ngram_drafter  # noqa: F401 (importable from here, as before)
from drafters.spec import DraftContext
from ngram_assisted.ngram_storage import INgramStorage
from runners.config import RunnerConfig
from sampling.chain_decoding import speculative  # the loop, looked up at each call (tests verify through another runner)
from sampling.common import reference_keywords
from sampling.draft_policy import DraftPolicy
from sampling.entry import generate
from sampling.stats import GenerationStats
from utils.logits_processor import GreedyProcessor, LogitsProcessor


@reference_keywords
@torch.no_grad()
def ngram_assisted_speculative_generate(
    inputs: List[int], ngramstorage: INgramStorage, target: Module, tokenizer=None, gamma: int = 5, filler_top_k: int = 3,
    logits_processor: LogitsProcessor = GreedyProcessor(), max_gen_len: int = 40, eos_tokens_id: int | List[int] = 1,
    pad_token_id: int = 0, use_cache: bool = False, first_target: bool = True, stop_if_unknown: bool = False,
    debug: bool = False, stats: GenerationStats | None = None, policy: DraftPolicy | None = None,
    streamer: Callable[[List[int], int], None] | None = None, compile: bool | None = None, runner: RunnerConfig | None = None,
) -> Tuple[List[int], float]:
    """N-gram assisted speculative decoding (NASD; Leviathan et al. 2023 with an n-gram drafter).

    The storage (seeded with the prompt's k-grams) proposes ``gamma`` tokens by chaining its
    predictions; the target (M_p) verifies them in one forward pass. The drafts are deterministic,
    so acceptance compares tokens: the target draws its own token ``t_i ~ p_i`` (argmax when
    greedy), drafts are accepted while they equal ``t_i``, and the first differing ``t_i`` is
    emitted. Greedy output therefore equals greedy autoregressive output, and sampled output is the
    target's own sample at every position. (The reference draws a second, fresh sample at the
    mismatch, which biases the output toward the draft.)

    ``ngramstorage`` is any ``INgramStorage``: this project's storages are read through their int
    methods; one that implements only the reference's five tensor methods is read through those.
    The other arguments are as in ``speculative_generate``.

    Returns:
        (new token ids, acceptance rate = accepted drafts / drafted tokens).
    """
    spec = NGramSpec(filler_top_k, stop_if_unknown)
    return generate(inputs, target, spec, locals(), DraftContext(storage=ngramstorage), loop=lambda *run: speculative(*run)[0])
