"""Each of our strategies' run function: ``generate(prompt, settings, stats) -> new tokens`` over the
library's public functions, with the settings of ``strategies.Settings`` (its rows are in
``strategies.STRATEGIES``; transformers' paths are in ``peers.py``).

``Settings`` below names ``strategies.Settings``; it is not imported, not even for type checking,
so that ``strategies`` (which reads these functions) and this module form no import cycle."""
from __future__ import annotations

from typing import Callable, List

from torch.nn import Module

from drafters import ChainedSpec, DraftContext, DrafterSpec, NGramTreeSpec, PromptLookupSpec, RecyclingSpec, SuffixSpec
from drafters.cross_tokenizer import translation
from ngram_assisted import ngram_assisted_speculative_generate
from sampling import GenerationStats, autoregressive_generate, generate, speculative_generate


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


def spec_row(spec: Callable[[Settings], DrafterSpec]) -> Callable[[List[int], Settings, GenerationStats], List[int]]:
    """A row's run function from ``spec(settings)``: the one entry, ``sampling.generate``, with the
    drafter that spec describes and the settings' live objects."""
    def run(prompt: List[int], s: Settings, stats: GenerationStats) -> List[int]:
        arguments = dict(tokenizer=s.tokenizer, gamma=s.gamma, **_common(s, stats), policy=s.policy, drafter_runner=s.drafter_runner)
        return generate(prompt, s.target, spec(s), arguments, drafting(s))[0]

    return run


def drafting(s: Settings) -> DraftContext:
    """The live objects the settings give a drafter spec."""
    return DraftContext(tokenizer=s.tokenizer, drafter=s.drafter, drafter_tokenizer=s.drafter_tokenizer, drafter_prompt=s.drafter_prompt,
                        storage=s.lookup_storage(), memory=s.suffix_memory, head=s.head)


def _prompt_lookup(s: Settings) -> PromptLookupSpec:
    return PromptLookupSpec(s.pld_num_tokens, s.pld_max_ngram, s.pld_min_ngram)


def _chained(s: Settings) -> ChainedSpec:
    return ChainedSpec(s.top_k_filler)


def _suffix(s: Settings) -> SuffixSpec:
    return SuffixSpec(**s.suffix.arguments())


def _tree_suffix(s: Settings) -> SuffixSpec:
    return SuffixSpec(**s.suffix.arguments(), trees=True)


def _arctic(s: Settings):
    from drafters.arctic import ArcticSpec

    return ArcticSpec(**s.suffix.arguments())


def _suffix_memory(s: Settings):
    from runners.limits import output_vocab_size
    from drafters.suffix_memory import SuffixMemory

    return SuffixMemory(s.suffix.max_tree_depth, output_vocab_size(s.target))


def _arctic_memory(s: Settings):
    from drafters.arctic import arctic_cache

    return arctic_cache(s.suffix.max_tree_depth, global_memory=True)


def _tree_ngram(s: Settings) -> NGramTreeSpec:
    return NGramTreeSpec(s.tree_size, s.top_k_filler)


def _recycling(s: Settings) -> RecyclingSpec:
    return RecyclingSpec(s.tree_size)


def _merged(s: Settings):
    from drafters.merged import MergedSpec

    return MergedSpec(s.tree_size, s.top_k_filler, suffix=s.suffix)


def _eagle(s: Settings):
    from drafters.eagle import EagleSpec

    return EagleSpec()


def _eagle_tree(s: Settings):
    from drafters.eagle import EagleSpec

    return EagleSpec(trees=True, tree_size=s.tree_size)


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
