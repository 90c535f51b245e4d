"""``suffix_generate``: suffix-tree drafting (SuffixDecoding) through the one entry,
``sampling.entry.generate``; the drafter, its defaults and their sources: ``drafters/suffix.py``."""
from runners.config import RunnerConfig
from typing import Callable, List, Tuple

import torch
from torch.nn import Module

from drafters.suffix import SuffixDrafter, SuffixSettings, check_settings  # noqa: F401 (importable from here, as before)
from utils.parsing import check_positive_int
from sampling.draft_policy import DraftPolicy
from sampling.entry import generate
from sampling.stats import GenerationStats
from drafters.suffix_memory import SuffixMemory
from utils.logits_processor import GreedyProcessor, LogitsProcessor


@torch.no_grad()
def suffix_generate(
    inputs: List[int], target: Module, tokenizer=None, max_spec_tokens: int = 24, max_tree_depth: int = 24,
    max_spec_factor: float = 1.0, max_spec_offset: float = 0.0, min_token_prob: float = 0.1, memory: SuffixMemory | None = None,
    logits_processor: LogitsProcessor = GreedyProcessor(), max_gen_len: int = 40, eos_tokens_id: int | List[int] = 1,
    pad_token_id: int = 0, use_cache: bool = False, first_target: bool = True, debug: bool = False,
    stats: GenerationStats | None = None, policy: DraftPolicy | None = None, streamer: Callable[[List[int], int], None] | None = None,
    compile: bool | None = None, runner: RunnerConfig | None = None, trees: bool = False,
) -> Tuple[List[int], float]:
    """Suffix decoding: speculative decoding whose drafts come from a suffix trie (``SuffixDrafter``).

    The trie holds the prompt and the generation (and, with ``memory``, a ``SuffixMemory`` holds
    earlier outputs: this generation's output is added to it at the end). Each step drafts at most
    ``max_spec_tokens`` tokens (``min(max_spec_tokens, match_len * max_spec_factor +
    max_spec_offset)`` for a match of ``match_len`` tokens, none below the estimated probability
    ``min_token_prob``), verified by the target (M_p) in one pass. Drafts are deterministic, so
    acceptance compares them with the target's own token (argmax when greedy, a sample
    otherwise): greedy is exact and sampling lossless. ``trees``: each step proposes a tree of up to
    ``max_spec_tokens`` nodes (the best match's most frequent branches, ``SuffixDrafter.propose_tree``)
    verified in one target pass (``sampling.tree_decoding``; needs full attention). The other
    arguments are as in ``speculative_generate``.

    Returns:
        (new token ids, acceptance rate = accepted drafts / drafted tokens).
    """
    if memory is not None and memory.max_depth != max_tree_depth:
        raise ValueError(f"the memory's depth is {memory.max_depth}, not max_tree_depth {max_tree_depth}")
    settings = (max_tree_depth, max_spec_tokens, max_spec_factor, max_spec_offset, min_token_prob)
    return generate(inputs, target, lambda prompt, config: SuffixDrafter(prompt, *settings, memory), locals(), trees=trees,
                    gamma=check_positive_int("max_spec_tokens", max_spec_tokens))
