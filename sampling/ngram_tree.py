"""NASD with draft trees: the public entry (the drafter is ``drafters.ngram.NGramDrafter``)."""
from runners.config import RunnerConfig
from typing import List, Tuple

import torch

from drafters.ngram import ngram_tree_drafter
from utils.parsing import check_positive_int
from sampling.draft_policy import DraftPolicy
from sampling.entry import generate
from utils.logits_processor import GreedyProcessor, LogitsProcessor


@torch.no_grad()
def ngram_tree_generate(
    inputs: List[int], ngramstorage, target, tokenizer=None, tree_size: int = 16, filler_top_k: int = 3,
    logits_processor: LogitsProcessor = GreedyProcessor(), max_gen_len: int = 40, eos_tokens_id: int | List[int] = 1,
    pad_token_id: int = 0, use_cache: bool = False, first_target: bool = True, debug: bool = False, stats=None,
    policy: DraftPolicy | None = None, streamer=None, compile: bool | None = None, runner: RunnerConfig | None = None,
) -> Tuple[List[int], float]:
    """NASD with draft trees: the n-gram storage proposes its most probable branches by count (up
    to ``tree_size`` nodes, best first, ``NGramDrafter.propose_tree``), the target verifies them in
    one pass and the longest branch its own tokens walk down is accepted (``draft_tree_and_verify``:
    greedy exact, sampling lossless). With a calibrated ``policy`` only the first nodes whose
    expected tokens pay for the pass are verified. The storage learns as in
    ``ngram_assisted_speculative_generate`` (emitted tokens, and the target's ``filler_top_k``
    most probable tokens along the accepted branch). Needs a storage with this project's int
    methods, and a decoder-only target with full attention. Returns (new tokens, acceptance rate:
    accepted drafts / tree levels verified).
    """
    filler = check_positive_int("filler_top_k", filler_top_k)
    return generate(inputs, target, lambda prompt, config: ngram_tree_drafter(ngramstorage, prompt, filler), locals(), trees=True,
                    gamma=check_positive_int("tree_size", tree_size))
