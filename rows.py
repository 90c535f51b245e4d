"""Our strategies' rows: each row's drafter spec, built from the run's values (``RunConfig``), which
``spec_row`` runs through the one entry, ``sampling.generate``, with the run's live objects
(``RunContext``); and the run functions of the rows over the reference's public functions
(``speculative_generate``, ``ngram_assisted_speculative_generate``) and plain decoding. A run
function is ``generate(prompt, config, context, stats) -> new tokens`` (the rows are in
``strategies.STRATEGIES``; transformers' paths are in ``peers.py``)."""
from typing import Callable, List

from torch.nn import Module

from configuration import RunConfig, RunContext
from drafters import ChainedSpec, CopyTreeSpec, DrafterSpec, NGramTreeSpec, PromptLookupSpec, RecyclingSpec, SuffixSpec
from drafters.arctic import ArcticSpec
from drafters.cross_tokenizer import translation
from drafters.eagle import EagleSpec
from drafters.merged import MergedSpec
from ngram_assisted import ngram_assisted_speculative_generate
from sampling import GenerationStats, autoregressive_generate, generate, speculative_generate


def arguments(config: RunConfig, context: RunContext, stats: GenerationStats) -> dict:
    """One generation's arguments by the reference's names: ``config``'s values, ``context``'s stream,
    ``stats`` to fill, and a policy of the config's values with the run's memory."""
    return dict(logits_processor=config.logits_processor(), max_gen_len=config.max_gen_len, eos_tokens_id=list(config.eos_tokens_id),
                use_cache=config.use_cache, debug=config.debug, tokenizer=context.tokenizer, stats=stats, streamer=context.streamer,
                runner=config.runner, drafter_runner=config.drafting_runner, policy=context.policy(config))


def spec_row(spec: Callable[[RunConfig], DrafterSpec]) -> Callable[[List[int], RunConfig, RunContext, GenerationStats], List[int]]:
    """A row's run function from ``spec(config)``: the one entry, ``sampling.generate``, with the
    drafter that spec describes, at most the config's ``gamma`` drafts a step unless the spec sets
    its own budget, and the context's live objects."""
    def run(prompt: List[int], config: RunConfig, context: RunContext, stats: GenerationStats) -> List[int]:
        values = dict(arguments(config, context, stats), gamma=config.gamma)
        return generate(prompt, context.target, spec(config), values, context.drafting())[0]

    return run


def _speculative(prompt: List[int], c: RunConfig, x: RunContext, stats: GenerationStats) -> List[int]:
    cross = dict(drafter_tokenizer=x.drafter_tokenizer, drafter_inputs=x.drafter_prompt(prompt)) if x.drafter_prompt else {}
    return speculative_generate(prompt, x.drafter, x.target, gamma=c.gamma, **arguments(c, x, stats), **cross)[0]


def _ngram(prompt: List[int], c: RunConfig, x: RunContext, stats: GenerationStats) -> List[int]:
    values = {k: v for k, v in arguments(c, x, stats).items() if k != "drafter_runner"}
    return ngram_assisted_speculative_generate(prompt, x.lookup_storage(), x.target, gamma=c.gamma, filler_top_k=c.param("top_k_filler"),
                                               first_target=True, stop_if_unknown=c.stop_if_unknown, **values)[0]


def _prompt_lookup(c: RunConfig) -> PromptLookupSpec:
    return PromptLookupSpec(c.param("pld_num_tokens"), c.param("pld_max_ngram"), c.param("pld_min_ngram"))


def _chained(c: RunConfig) -> ChainedSpec:
    return ChainedSpec(c.param("top_k_filler"))


def _suffix(c: RunConfig) -> SuffixSpec:
    return SuffixSpec(**c.suffix.arguments())


def _tree_suffix(c: RunConfig) -> SuffixSpec:
    return SuffixSpec(**c.suffix.arguments(), trees=True)


def _tree_copy(c: RunConfig) -> CopyTreeSpec:
    return CopyTreeSpec(c.param("tree_size"))


def _arctic(c: RunConfig) -> ArcticSpec:
    return ArcticSpec(**c.suffix.arguments())


def _suffix_memory(c: RunConfig, x: RunContext):
    from runners.limits import output_vocab_size
    from drafters.suffix_memory import SuffixMemory

    return SuffixMemory(c.param("max_tree_depth"), output_vocab_size(x.target))


def _arctic_memory(c: RunConfig, x: RunContext):
    from drafters.arctic import arctic_cache

    return arctic_cache(c.param("max_tree_depth"), global_memory=True)


def _tree_ngram(c: RunConfig) -> NGramTreeSpec:
    return NGramTreeSpec(c.param("tree_size"), c.param("top_k_filler"))


def _recycling(c: RunConfig) -> RecyclingSpec:
    return RecyclingSpec(c.param("tree_size"))


def _merged(c: RunConfig) -> MergedSpec:
    return MergedSpec(c.param("tree_size"), c.param("top_k_filler"), suffix=c.suffix)


def _eagle(c: RunConfig) -> EagleSpec:
    return EagleSpec()


def _eagle_tree(c: RunConfig) -> EagleSpec:
    return EagleSpec(trees=True, tree_size=c.param("tree_size"))


def _autoregressive(model: Module, prompt: List[int], c: RunConfig, x: RunContext, stats: GenerationStats) -> List[int]:
    runner = c.drafter_runner if model is x.drafter and model is not x.target else c.runner
    return autoregressive_generate(prompt, model, **_plain(c, x, stats), runner=runner)


def _plain(c: RunConfig, x: RunContext, stats: GenerationStats) -> dict:
    """``arguments`` for plain decoding: no policy, no drafter, no tokenizer."""
    return dict(logits_processor=c.logits_processor(), max_gen_len=c.max_gen_len, eos_tokens_id=list(c.eos_tokens_id),
                use_cache=c.use_cache, debug=c.debug, stats=stats, streamer=x.streamer)


def _drafter_ar(prompt: List[int], c: RunConfig, x: RunContext, stats: GenerationStats) -> List[int]:
    """The drafter alone; one with its own tokenizer reads its own prompt and writes target tokens."""
    if x.drafter_tokenizer is None:
        return _autoregressive(x.drafter, prompt, c, x, stats)
    spelling = translation(x.tokenizer, x.drafter_tokenizer)
    own = (x.drafter_prompt(prompt) if x.drafter_prompt else None) or spelling.to_drafter(prompt)
    out = autoregressive_generate(own, x.drafter, **{**_plain(c, x, stats), "eos_tokens_id": spelling.stops(list(c.eos_tokens_id))},
                                  runner=c.drafter_runner)
    return spelling.back(prompt, out)


def _target_eager(prompt: List[int], c: RunConfig, x: RunContext, stats: GenerationStats) -> List[int]:
    """Target AR on our eager runner, whatever ``--compile`` says: the compiled runner's own yardstick."""
    return autoregressive_generate(prompt, x.target, **_plain(c, x, stats), runner=c.runner, compile=False)
