"""Plain decoding with one model: autoregressive sampling and beam search."""
from typing import Callable, List

import torch
from torch.nn import Module

from sampling.common import check_positive_int, check_prompt, context_window, generation_end, reference_keywords, stop_token_set
from sampling.config import GenerationConfig, Step
from sampling.encoder_decoder import decoder_inputs
from sampling.stats import GenerationStats
from runners import BeamRunner, Runner
from utils.logits_processor import GreedyProcessor, LogitsProcessor


@torch.no_grad()
def generate_with(prompt: List[int], model: Runner, config: GenerationConfig) -> List[int]:
    """One token per forward pass until ``config.max_gen_len`` new tokens, a stop token or the
    model's window; returns the new tokens. Observers see each token as a step with no drafts."""
    end = generation_end(len(prompt), config.max_gen_len, context_window(model.model))
    ids = torch.zeros((1, end), dtype=torch.long, device=model.device)
    ids[0, : len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=model.device)
    tokens = list(prompt)
    for cur in range(len(prompt), end):
        token = config.processor.sample(config.processor(model(ids[:, :cur], 1)))
        ids[0, cur] = token[0, 0]
        tokens.append(int(token))
        config.stats.record_step(0, 0, 1)
        stopped = tokens[-1] in config.stop_tokens
        config.observe(Step(tokens, cur, len(prompt), [], 0, tokens[-1], stopped, speculative=False))
        if stopped:
            break
    return tokens[len(prompt) :]


@reference_keywords
@torch.no_grad()
def autoregressive_generate(
    inputs: List[int], model: Module, max_gen_len: int = 40, logits_processor: LogitsProcessor = GreedyProcessor(),
    eos_tokens_id: int | List[int] = 1, pad_token_id: int = 0, use_cache: bool = False, debug: bool = False,
    stats: GenerationStats | None = None, streamer: Callable[[List[int], int], None] | None = None,
    compile: bool | None = None,
) -> List[int]:
    """Sample ``max_gen_len`` new tokens at most, one forward pass each (decoder-only models, or
    encoder-decoder models: the encoder reads ``inputs``, the decoder generates after its start token).

    Stops after the first token of ``eos_tokens_id`` (included) and at the context window.
    With ``use_cache`` only the newest token is fed each step. ``streamer`` is called with each
    new token. ``compile``: compiled passes over a static cache (``runners.compiled``; None: the
    model's ``set_compile``). Returns the new token ids.
    """
    prompt, encoder_ids = decoder_inputs(check_prompt(inputs), model)
    config = GenerationConfig.of(locals())
    return generate_with(prompt, config.runner(model, encoder_ids), config)


autoregressive_generate_encoder_decoder = autoregressive_generate  # the reference's name for encoder-decoder models


def _length_penalty(length: int, alpha: float, min_length: float) -> float:
    return ((min_length + length) / (min_length + 1)) ** alpha


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
    stop_tokens = stop_token_set(eos_tokens_id) | {pad_token_id}

    # beams: (penalised score, sum of log-probs, tokens, finished)
    runner = BeamRunner(model)
    logits = runner.start(prompt)
    beams: List[tuple] = [(0.0, 0.0, [], False)]
    for step in range(1, end - len(prompt) + 1):
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        width = num_beams if step == 1 else top_k
        values, indices = torch.topk(logprobs, min(width, logprobs.size(-1)), dim=-1)
        values, indices = values.tolist(), indices.tolist()
        penalty = _length_penalty(step, alpha, min_length)
        candidates, row = [], 0
        for beam in beams:
            if beam[3]:  # finished beams stay in the running with their score
                candidates.append((beam, None))
                continue
            _, total, tokens, _ = beam
            for logprob, token in zip(values[row], indices[row]):
                new_total = total + logprob
                candidates.append(((new_total / penalty, new_total, tokens + [token], token in stop_tokens), row))
            row += 1
        candidates.sort(key=lambda c: c[0][0], reverse=True)
        beams, parents = [], []
        for beam, parent in candidates[:num_beams]:
            beams.append(beam)
            if not beam[3]:
                parents.append(parent)
        for observer in observers:
            observer.on_beams([(b[0], prompt + b[2]) for b in beams], len(prompt) + step)
        alive = [b for b in beams if not b[3]]
        if not alive or step == end - len(prompt):
            break
        logits = runner.extend(parents, [b[2][-1] for b in alive])
    return beams[0][2]
