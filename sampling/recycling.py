"""Token Recycling (Luo et al., ACL 2025, arXiv:2408.08696): the target's top-k next tokens for
every token it has seen, kept in an adjacency table and read out into a static draft tree."""
from runners.config import RunnerConfig
from typing import Callable, Dict, List, Tuple

import torch
from torch.nn import Module

from drafters.recycling import MAX_DEPTH, RANK_DECAY, RecyclingDrafter, tree_template  # noqa: F401 (importable from here, as before)
from utils.parsing import check_positive_int
from sampling.draft_policy import DraftPolicy
from sampling.entry import generate
from sampling.stats import GenerationStats
from utils.logits_processor import GreedyProcessor, LogitsProcessor

@torch.no_grad()
def token_recycling_generate(
    inputs: List[int], target: Module, tokenizer=None, tree_size: int = 24, top_k: int = 8,
    logits_processor: LogitsProcessor = GreedyProcessor(), max_gen_len: int = 40, eos_tokens_id: int | List[int] = 1,
    pad_token_id: int = 0, use_cache: bool = False, first_target: bool = True, debug: bool = False,
    stats: GenerationStats | None = None, policy: DraftPolicy | None = None,
    streamer: Callable[[List[int], int], None] | None = None, table: Dict[int, List[int]] | None = None,
    compile: bool | None = None, runner: RunnerConfig | None = None,
) -> Tuple[List[int], float]:
    """Token Recycling (Luo et al. 2025): the target's ``top_k`` next tokens of every token it has
    scored, kept in an adjacency table (``table``: pass a dict to keep it across generations),
    drafted as a static tree of up to ``tree_size`` nodes (``tree_template``) and verified in one
    target pass (``draft_tree_and_verify``: greedy exact, sampling lossless, since the drafts are
    deterministic and the target's own token walks down the tree). With a calibrated ``policy``
    only the first nodes whose expected tokens pay for the pass are verified. The other arguments
    are as in ``prompt_lookup_generate``.

    Returns:
        (new token ids, acceptance rate = accepted drafts / tree levels verified).
    """
    def make(prompt, config):
        drafter = RecyclingDrafter(table, top_k)
        drafter.seed(prompt)
        return drafter

    return generate(inputs, target, make, locals(), trees=True, gamma=check_positive_int("tree_size", tree_size))
