"""``merged_generate``: one draft tree merged from every drafter, verified in one target pass (the
drafter: ``drafters/merged.py``)."""
from typing import Callable, List, Tuple

import torch
from torch.nn import Module

from drafters.eagle import EagleDrafter
from drafters.merged import MergedDrafter
from drafters.merged_sources import HeadSource, ModelSource
from drafters.ngram import ngram_tree_drafter
from drafters.recycling import RecyclingDrafter
from drafters.suffix import SuffixDrafter
from runners.config import RunnerConfig
from utils.parsing import check_positive_int
from runners.limits import common_vocab_size
from sampling.draft_policy import DraftPolicy
from sampling.entry import generate
from sampling.stats import GenerationStats
from sampling.suffix import SuffixSettings
from drafters.suffix_memory import SuffixMemory
from utils.logits_processor import GreedyProcessor, LogitsProcessor


@torch.no_grad()
def merged_generate(
    inputs: List[int], target: Module, tokenizer=None, tree_size: int = 16, storage=None, filler_top_k: int = 3,
    recycling_top_k: int = 8, suffix: SuffixSettings | None = None, memory: SuffixMemory | None = None,
    drafter: Module | None = None, model_top_k: int = 3, model_depth: int = 4, head=None,
    logits_processor: LogitsProcessor = GreedyProcessor(), max_gen_len: int = 40, eos_tokens_id: int | List[int] = 1,
    pad_token_id: int = 0, use_cache: bool = False, first_target: bool = True, debug: bool = False,
    stats: GenerationStats | None = None, policy: DraftPolicy | None = None,
    streamer: Callable[[List[int], int], None] | None = None, compile: bool | None = None,
    runner: RunnerConfig | None = None, drafter_runner: RunnerConfig | None = None,
) -> Tuple[List[int], float]:
    """Speculative decoding with one draft tree merged from the suffix trie (``suffix`` settings,
    ``memory``: its global tree), the n-gram ``storage`` (None: no n-gram source), token recycling
    (``recycling_top_k``; 0: none) and, when ``drafter`` is given, that model's ``model_top_k``
    tokens at each of ``model_depth`` depths, and when ``head`` (an ``eagle.head.Eagle3Head``) is given,
    its dynamic tree (``drafters.eagle``): up to ``tree_size`` nodes, best first by estimated
    acceptance, verified in one target pass (``draft_tree_and_verify``; with a calibrated ``policy``
    each step verifies the best tree prefix or its best chain, whichever pays more). Deterministic
    drafts: greedy exact, sampling lossless. ``stats.accepted_by`` counts accepted drafts by
    source. Returns (new tokens, acceptance rate: accepted drafts / tree levels verified)."""
    tree_size = check_positive_int("tree_size", tree_size)
    settings = suffix or SuffixSettings()
    if memory is not None and memory.max_depth != settings.max_tree_depth:
        raise ValueError(f"the memory's depth is {memory.max_depth}, not max_tree_depth {settings.max_tree_depth}")

    def make(prompt, config):
        recycling = None
        if recycling_top_k:
            recycling = RecyclingDrafter(None, check_positive_int("recycling_top_k", recycling_top_k))
            recycling.seed(prompt)
        model = None
        if drafter is not None:
            model = ModelSource(config.make_runner(drafter, drafter=True), common_vocab_size(drafter, target, tokenizer),
                                check_positive_int("model_top_k", model_top_k), check_positive_int("model_depth", model_depth))
        learned = None if head is None else HeadSource(EagleDrafter.of(head, config))
        return MergedDrafter(
            SuffixDrafter(prompt, **settings.arguments(), memory=memory),
            None if storage is None else ngram_tree_drafter(storage, prompt, check_positive_int("filler_top_k", filler_top_k)),
            recycling, model, learned)

    return generate(inputs, target, make, locals(), trees=True, gamma=tree_size)
