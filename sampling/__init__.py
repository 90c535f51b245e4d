from sampling.base_decoding import autoregressive_generate, autoregressive_generate_encoder_decoder, beam_search_generate
from sampling.calibration import calibrated_policy, measure_draft_cost, measure_row_costs, plausible_row_costs
from sampling.config import GenerationConfig, Observer, Step
from sampling.draft_policy import DraftPolicy
from sampling.prompt_lookup import prompt_lookup_generate
from sampling.recycling import token_recycling_generate
from sampling.speculative_decoding import speculative_generate, speculative_generate_encoder_decoder
from sampling.stats import GenerationStats
from sampling.suffix import SuffixDrafter, suffix_generate
from sampling.suffix_memory import SuffixMemory
from sampling.tree_decoding import draft_tree_and_verify, ngram_tree_generate

__all__ = [
    "autoregressive_generate",
    "beam_search_generate",
    "speculative_generate",
    "autoregressive_generate_encoder_decoder",
    "speculative_generate_encoder_decoder",
    "prompt_lookup_generate",
    "suffix_generate",
    "SuffixDrafter",
    "SuffixMemory",
    "ngram_tree_generate",
    "token_recycling_generate",
    "draft_tree_and_verify",
    "DraftPolicy",
    "measure_row_costs",
    "measure_draft_cost",
    "plausible_row_costs",
    "calibrated_policy",
    "GenerationStats",
    "GenerationConfig",
    "Observer",
    "Step",
]
