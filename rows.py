"""Each of our strategies' run function: ``generate(prompt, settings, stats) -> new tokens`` over the
library's public functions, with the settings of ``strategies.Settings`` (its rows are in
``strategies.STRATEGIES``; transformers' paths are in ``peers.py``).

``Settings`` below names ``strategies.Settings``; it is not imported, not even for type checking,
so that ``strategies`` (which reads these functions) and this module form no import cycle."""
from __future__ import annotations

from typing import List

from torch.nn import Module

from drafters.cross_tokenizer import translation
from ngram_assisted import chained_speculative_generate, ngram_assisted_speculative_generate
from sampling import (
    GenerationStats,
    autoregressive_generate,
    ngram_tree_generate,
    prompt_lookup_generate,
    speculative_generate,
    suffix_generate,
    token_recycling_generate,
)


def _speculative(prompt: List[int], s: Settings, stats: GenerationStats) -> List[int]:
    cross = dict(drafter_tokenizer=s.drafter_tokenizer, drafter_inputs=s.drafter_prompt(prompt)) if s.drafter_prompt else {}
    return speculative_generate(prompt, s.drafter, s.target, s.tokenizer, gamma=s.gamma, **_common(s, stats), policy=s.policy,
                                drafter_runner=s.drafter_runner, **cross)[0]


def _common(s: Settings, stats: GenerationStats) -> dict:
    return dict(logits_processor=s.processor, max_gen_len=s.max_gen_len, eos_tokens_id=s.eos_tokens_id, use_cache=s.use_cache,
                debug=s.debug, stats=stats, streamer=s.streamer, runner=s.runner)


def _ngram(prompt: List[int], s: Settings, stats: GenerationStats) -> List[int]:
    return ngram_assisted_speculative_generate(
        prompt, s.lookup_storage(), s.target, s.tokenizer, gamma=s.gamma, filler_top_k=s.top_k_filler, **_common(s, stats),
        first_target=True, stop_if_unknown=s.stop_if_unknown, policy=s.policy)[0]


def _prompt_lookup(prompt: List[int], s: Settings, stats: GenerationStats) -> List[int]:
    return prompt_lookup_generate(
        prompt, s.target, s.tokenizer, num_pred_tokens=s.pld_num_tokens, max_ngram_size=s.pld_max_ngram,
        min_ngram_size=s.pld_min_ngram, **_common(s, stats), policy=s.policy)[0]


def _chained(prompt: List[int], s: Settings, stats: GenerationStats) -> List[int]:
    return chained_speculative_generate(
        prompt, s.lookup_storage(), s.drafter, s.target, s.tokenizer, gamma=s.gamma, filler_top_k=s.top_k_filler,
        **_common(s, stats), policy=s.policy, drafter_runner=s.drafter_runner)[0]


def _suffix(prompt: List[int], s: Settings, stats: GenerationStats) -> List[int]:
    return suffix_generate(prompt, s.target, s.tokenizer, **s.suffix.arguments(), memory=s.suffix_memory, **_common(s, stats),
                           policy=s.policy)[0]


def _tree_suffix(prompt: List[int], s: Settings, stats: GenerationStats) -> List[int]:
    return suffix_generate(prompt, s.target, s.tokenizer, **s.suffix.arguments(), memory=s.suffix_memory, **_common(s, stats),
                           policy=s.policy, trees=True)[0]


def _arctic(prompt: List[int], s: Settings, stats: GenerationStats) -> List[int]:
    from sampling.suffix_arctic import arctic_suffix_generate

    return arctic_suffix_generate(prompt, s.target, s.suffix_memory, s.suffix, tokenizer=s.tokenizer, **_common(s, stats),
                                  policy=s.policy)[0]


def _suffix_memory(s: Settings):
    from runners.limits import output_vocab_size
    from drafters.suffix_memory import SuffixMemory

    return SuffixMemory(s.suffix.max_tree_depth, output_vocab_size(s.target))


def _arctic_memory(s: Settings):
    from sampling.suffix_arctic import arctic_cache

    return arctic_cache(s.suffix.max_tree_depth, global_memory=True)


def _tree_ngram(prompt: List[int], s: Settings, stats: GenerationStats) -> List[int]:
    return ngram_tree_generate(prompt, s.lookup_storage(), s.target, s.tokenizer, tree_size=s.tree_size,
                               filler_top_k=s.top_k_filler, **_common(s, stats), policy=s.policy)[0]


def _recycling(prompt: List[int], s: Settings, stats: GenerationStats) -> List[int]:
    return token_recycling_generate(prompt, s.target, s.tokenizer, tree_size=s.tree_size, **_common(s, stats), policy=s.policy)[0]


def _merged(prompt: List[int], s: Settings, stats: GenerationStats) -> List[int]:
    from sampling.merged import merged_generate

    return merged_generate(prompt, s.target, s.tokenizer, tree_size=s.tree_size, storage=s.lookup_storage(), filler_top_k=s.top_k_filler,
                           suffix=s.suffix, memory=s.suffix_memory, drafter=s.drafter, **_common(s, stats), policy=s.policy,
                           drafter_runner=s.drafter_runner, head=s.head)[0]


def _eagle(prompt: List[int], s: Settings):
    """The EAGLE-3 head's chain drafter: the target's processor, the policy's confidence cutoff and floor."""
    from drafters.eagle import EagleDrafter
    from runners.limits import output_vocab_size

    return EagleDrafter(s.head, s.processor, output_vocab_size(s.target), s.policy.p_min, s.policy.min_draft)



def _autoregressive(model: Module, prompt: List[int], s: Settings, stats: GenerationStats) -> List[int]:
    runner = s.drafter_runner if model is s.drafter and model is not s.target else s.runner
    return autoregressive_generate(prompt, model, **{**_common(s, stats), "runner": runner})


def _drafter_ar(prompt: List[int], s: Settings, stats: GenerationStats) -> List[int]:
    """The drafter alone; one with its own tokenizer reads its own prompt and writes target tokens."""
    if s.drafter_tokenizer is None:
        return _autoregressive(s.drafter, prompt, s, stats)
    spelling = translation(s.tokenizer, s.drafter_tokenizer)
    own = (s.drafter_prompt(prompt) if s.drafter_prompt else None) or spelling.to_drafter(prompt)
    out = autoregressive_generate(own, s.drafter, **{**_common(s, stats), "eos_tokens_id": spelling.stops(s.eos_tokens_id)})
    return spelling.back(prompt, out)


def _target_eager(prompt: List[int], s: Settings, stats: GenerationStats) -> List[int]:
    """Target AR on our eager runner, whatever ``--compile`` says: the compiled runner's own yardstick."""
    return autoregressive_generate(prompt, s.target, **_common(s, stats), compile=False)
