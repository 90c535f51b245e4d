"""transformers' own generation paths, the benchmark's peers: their rows are in ``strategies.PEERS``.
Each runs greedy with a run's values (``RunConfig``) and live objects (``RunContext``) and fills
``GenerationStats`` as ours do."""
from contextlib import contextmanager
from typing import List

import torch
from torch.nn import Module

from configuration import RunConfig, RunContext
from sampling.stats import GenerationStats
from runners import model_device
from runners.cache_kind import cache_keyword


def _hf_generate(prompt: List[int], c: RunConfig, x: RunContext, stats: GenerationStats, **extra) -> List[int]:
    """transformers ``generate`` (greedy), counting only new tokens."""
    if not c.greedy:
        raise ValueError("the transformers peers are run greedy only")
    ids = torch.tensor([prompt], device=model_device(x.target))
    eos = list(c.eos_tokens_id)
    out = x.target.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=c.max_gen_len, do_sample=False,
        eos_token_id=eos or None, pad_token_id=(eos or [0])[0], use_cache=c.use_cache, **extra,
    )
    tokens = out[0, len(prompt):].tolist()
    stats.generated = len(tokens)
    return tokens


def _hf_generate_static(prompt: List[int], c: RunConfig, x: RunContext, stats: GenerationStats) -> List[int]:
    """transformers ``generate`` with its static cache, compiled as transformers does it: by itself,
    with its own settings, on CUDA; on CPU only with ``hf_compile`` (``--compile``), through a
    ``CompileConfig``. The cache's length comes in buckets of 512 positions, so that a compiled
    decoding step is built once per bucket (in the benchmark's excluded warm-up run), not once per
    prompt length (a build inside a timed run would time the compiler)."""
    from transformers import StaticCache

    length = -(-(len(prompt) + c.max_gen_len) // 512) * 512
    extra = {cache_keyword(x.target): StaticCache(config=x.target.config, max_cache_len=length)}
    if model_device(x.target).type == "cuda":
        pass  # transformers compiles the static-cache step by itself, with its defaults
    elif c.hf_compile:
        from transformers import CompileConfig

        config = CompileConfig(fullgraph=False, dynamic=False, mode="default")
        config._compile_all_devices = True
        extra["compile_config"] = config  # on the model's own layers: ``strategies.row_kernels`` gives it those
    else:
        extra["disable_compile"] = True
    return _hf_generate(prompt, c, x, stats, **extra)


# transformers 5.23 reads these from the *assistant's* generation config (AssistedCandidateGenerator.__init__,
# its None fields filled with the library defaults), never from generate's arguments
ASSISTANT_FIELDS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


def transformers_assisted_defaults() -> dict:
    """What transformers' assisted generation runs when the assistant's config leaves ASSISTANT_FIELDS unset."""
    from transformers import GenerationConfig

    defaults = GenerationConfig()._get_default_generation_params()
    return {name: defaults[name] for name in ASSISTANT_FIELDS}


@contextmanager
def _assistant_config(assistant: Module, **values):
    """``values`` on the assistant's generation config for one run, every ASSISTANT_FIELDS value put back
    afterwards (the "heuristic" schedule writes its last draft length back into it)."""
    config = assistant.generation_config
    saved = {name: getattr(config, name) for name in ASSISTANT_FIELDS}
    try:
        for name, value in values.items():
            setattr(config, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


def _settings_in_force(generator) -> dict:
    """The candidate generator's draft settings as it starts (transformers may adapt some as it runs)."""
    if hasattr(generator, "num_output_tokens"):  # PromptLookupCandidateGenerator
        return {"prompt_lookup_num_tokens": generator.num_output_tokens, "max_matching_ngram_size": generator.max_matching_ngram_size}
    settings = {"num_assistant_tokens": int(generator.num_assistant_tokens),
                "num_assistant_tokens_schedule": generator.assistant_generation_config.num_assistant_tokens_schedule,
                "assistant_confidence_threshold": generator.generation_config.assistant_confidence_threshold}
    if hasattr(generator, "assistant_tokenizer"):  # Universal Assisted Generation: drafts re-tokenized through text
        settings["translation"] = "text (UAG)"
    return settings


@contextmanager
def _observed_steps(model: Module, stats: GenerationStats):
    """Each step of transformers' assisted loop into ``stats``: its drafts (``get_candidates``) and how
    many the target accepted (``update_candidate_strategy``'s ``num_matches``, after transformers' own
    crop at EOS and max length), on this model's candidate generator only."""
    own = "_get_candidate_generator" in vars(model)
    make = model._get_candidate_generator

    def observed(*args, **kwargs):
        generator = make(*args, **kwargs)
        get, update, drafted = generator.get_candidates, generator.update_candidate_strategy, [0]

        def get_candidates(input_ids, **more):
            candidates, logits = get(input_ids, **more)
            drafted[0] = candidates.shape[-1] - input_ids.shape[-1]
            return candidates, logits

        def update_candidate_strategy(input_ids, scores, num_matches):
            update(input_ids, scores, num_matches)
            stats.record_step(drafted[0], int(num_matches), int(num_matches) + 1)

        generator.get_candidates, generator.update_candidate_strategy = get_candidates, update_candidate_strategy
        stats.peer_settings = _settings_in_force(generator)
        return generator

    model._get_candidate_generator = observed
    try:
        yield
    finally:
        if own:
            model._get_candidate_generator = make
        else:
            del model._get_candidate_generator


def _assistant(x: RunContext) -> dict:
    """``generate``'s arguments for the drafter: with a tokenizer of its own (``RunContext.drafter_tokenizer``),
    both tokenizers, so that transformers runs Universal Assisted Generation (greedy: its drafts
    re-tokenized through text, ``AssistedCandidateGeneratorDifferentTokenizers``), as our speculative
    row then drafts across tokenizers. Its draft length counts the assistant's tokens, ours the target's."""
    if x.drafter_tokenizer is None:
        return {"assistant_model": x.drafter}
    return {"assistant_model": x.drafter, "tokenizer": x.tokenizer, "assistant_tokenizer": x.drafter_tokenizer}


def _hf_assisted(prompt: List[int], c: RunConfig, x: RunContext, stats: GenerationStats) -> List[int]:
    """transformers assisted generation drafting ``c.gamma`` tokens every step: constant schedule, no
    confidence stop (threshold 0: its ``ConfidenceCriteria`` needs > 0, and None would become 0.4)."""
    with _assistant_config(x.drafter, num_assistant_tokens=c.gamma, num_assistant_tokens_schedule="constant",
                           assistant_confidence_threshold=0.0), _observed_steps(x.target, stats):
        return _hf_generate(prompt, c, x, stats, **_assistant(x))


def _hf_assisted_default(prompt: List[int], c: RunConfig, x: RunContext, stats: GenerationStats) -> List[int]:
    """transformers assisted generation with its own defaults (``transformers_assisted_defaults``),
    whatever the drafter's generation config says."""
    with _assistant_config(x.drafter, **dict.fromkeys(ASSISTANT_FIELDS)), _observed_steps(x.target, stats):
        return _hf_generate(prompt, c, x, stats, **_assistant(x))


def _hf_prompt_lookup(prompt: List[int], c: RunConfig, x: RunContext, stats: GenerationStats) -> List[int]:
    """transformers prompt lookup with our ``pld`` row's settings: ``pld_num_tokens`` drafts, n-grams of
    ``pld_max_ngram`` tokens down to 1 (transformers' floor; ``pld_min_ngram`` is 1 by default)."""
    with _observed_steps(x.target, stats):
        return _hf_generate(prompt, c, x, stats, prompt_lookup_num_tokens=c.param("pld_num_tokens"),
                            max_matching_ngram_size=c.param("pld_max_ngram"))
