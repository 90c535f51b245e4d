"""Plain decoding with one model: autoregressive sampling and beam search."""
import time
from typing import Callable, List

import torch
from torch.nn import Module

from sampling.beam_search import BeamSearch
from sampling.common import check_prompt, generation_end, reference_keywords, stop_token_set
from utils.parsing import check_positive_int
from runners.limits import context_window
from sampling.config import GenerationConfig, Step
from sampling.encoder_decoder import decoder_inputs
from sampling.stats import GenerationStats
from runners import BeamRunner, Runner
from runners.config import RunnerConfig
from utils.logits_processor import GreedyProcessor, LogitsProcessor


@torch.no_grad()
def generate_with(prompt: List[int], model: Runner, config: GenerationConfig) -> List[int]:
    """One token per forward pass until ``config.max_gen_len`` new tokens, a stop token or the
    model's window; returns the new tokens. Observers see each token as a step with no drafts."""
    end = generation_end(len(prompt), config.max_gen_len, context_window(model.model))
    ids = torch.zeros((1, end), dtype=torch.long, device=model.device)
    ids[0, : len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=model.device)
    tokens = list(prompt)
    processor = config.processor
    # logits -> token in one (``LogitsProcessor.choose``: greedy skips the softmax where it can); a
    # processor of another kind (duck-typed: ``__call__`` and ``sample`` only) through its probabilities
    choose = getattr(processor, "choose", None) or (lambda logits: processor.sample(processor(logits)))
    clear = getattr(processor, "clear_tokens", None) or (lambda logits: None)  # greedy's ints from the pass's row tops
    start = time.perf_counter()
    for cur in range(len(prompt), end):
        logits = model(ids[:, :cur], 1)
        clear_ids = clear(logits)
        token = clear_ids[0] if clear_ids else int(choose(logits))  # the step's one host-device synchronisation
        if cur == len(prompt):  # the prompt's pass (``GenerationStats.first_step_seconds``): one clock read more a run
            config.stats.first_step_seconds = time.perf_counter() - start
        ids[0, cur] = token
        tokens.append(token)
        config.stats.record_step(0, 0, 1)
        stopped = token in config.stop_tokens
        if config.observers:  # the step's record is made only for someone to see it
            config.observe(Step(tokens, cur, len(prompt), [], 0, token, stopped, speculative=False))
        if stopped:
            break
    return tokens[len(prompt) :]


@reference_keywords
@torch.no_grad()
def autoregressive_generate(
    inputs: List[int], model: Module, max_gen_len: int = 40, logits_processor: LogitsProcessor = GreedyProcessor(),
    eos_tokens_id: int | List[int] = 1, pad_token_id: int = 0, use_cache: bool = False, debug: bool = False,
    stats: GenerationStats | None = None, streamer: Callable[[List[int], int], None] | None = None,
    compile: bool | None = None, runner: RunnerConfig | None = None,
) -> List[int]:
    """Sample ``max_gen_len`` new tokens at most, one forward pass each (decoder-only models, or
    encoder-decoder models: the encoder reads ``inputs``, the decoder generates after its start token).

    Stops after the first token of ``eos_tokens_id`` (included) and at the context window.
    With ``use_cache`` only the newest token is fed each step. ``streamer`` is called with each
    new token. ``runner``: how the passes run (``RunnerConfig``: cache kind, compiled; None: eager,
    the device's cache); ``compile`` True/False overrides its ``compile``. Returns the new token ids.
    """
    prompt, encoder_ids = decoder_inputs(check_prompt(inputs), model)
    config = GenerationConfig.of(locals())
    return generate_with(prompt, config.make_runner(model, encoder_ids), config)


autoregressive_generate_encoder_decoder = autoregressive_generate  # the reference's name for encoder-decoder models


@reference_keywords
@torch.no_grad()
def beam_search_generate(
    inputs: List[int],
    model: Module,
    max_gen_len: int = 40,
    num_beams: int = 4,
    top_k: int = 3,
    min_length: float = 5.0,
    alpha: float = 1.2,
    eos_tokens_id: int | List[int] = 1,
    pad_token_id: int = 0,
    debug: bool = False,
    tokenizer=None,
) -> List[int]:
    """Beam search with the GNMT length penalty ``((min_length + len) / (min_length + 1)) ** alpha``.

    The first step starts ``num_beams`` beams from the most probable first tokens (as the
    reference does); each later step extends every unfinished beam by its ``top_k`` most probable
    tokens. The extensions and the finished beams compete on ``sum of log-probabilities /
    penalty(length)`` and the best ``num_beams`` are kept (ties keep the reference's order: beam by
    beam, finished beams in their place). A beam finishes on an end token or on ``pad_token_id``,
    also at its first token. Stops when all kept beams are finished or at ``max_gen_len``; returns
    the best beam's new tokens. The cache holds one row per unfinished beam and is reordered,
    never recomputed (``runners.BeamRunner``).
    """
    prompt = check_prompt(inputs)
    observers = GenerationConfig.of(locals()).observers
    check_positive_int("num_beams", num_beams)
    check_positive_int("top_k", top_k)
    end = generation_end(len(prompt), max_gen_len, context_window(model))
    search = BeamSearch(num_beams, top_k, alpha, min_length, stop_token_set(eos_tokens_id) | {pad_token_id})
    return search.run(prompt, BeamRunner(model), end, observers)
