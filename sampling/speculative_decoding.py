"""Speculative decoding (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023, arXiv:2302.01318):
the one verification loop every drafter runs in, and the drafter-model entry point."""
import time
from typing import Any, Callable, Iterator, List, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from drafters.base import Drafter, as_drafter
from drafters.cross_tokenizer import cross_drafter, same_vocabulary
from drafters.model import ModelDrafter
from runners.limits import common_vocab_size, context_window
from sampling.common import (  # max_fn: the reference's public helper, importable from here
    check_prompt,
    generation_end,
    max_fn,
    reference_keywords,
)
from sampling.config import GenerationConfig, Step
from sampling.draft_policy import DraftPolicy
from sampling.encoder_decoder import decoder_inputs
from sampling.stats import GenerationStats
from runners import Runner
from runners.config import RunnerConfig
from utils.logits_processor import GreedyProcessor, LogitsProcessor


def _residual(p: Tensor, q: Tensor) -> Tensor:
    """norm(max(0, p - q)) row-wise; falls back to p where p <= q everywhere (rounding only)."""
    r = torch.clamp(p - q, min=0)
    mass = r.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp(min=torch.finfo(r.dtype).tiny), p)


def _tensors(tree: Any) -> List[Tensor]:
    """The tensors of ``tree`` (a tensor, None, or a list of these), in order."""
    if isinstance(tree, Tensor):
        return [tree]
    return [t for branch in tree for t in _tensors(branch)] if isinstance(tree, (list, tuple)) else []


def _on_host(tree: Any, values: Iterator[int]) -> Any:
    """``tree`` with each tensor replaced by its next values from ``values``, nested as its shape."""
    if isinstance(tree, Tensor):
        flat = [next(values) for _ in range(tree.numel())]
        for size in reversed(tree.shape[1:]):
            flat = [flat[i : i + size] for i in range(0, len(flat), size)]
        return flat
    return [_on_host(branch, values) for branch in tree] if isinstance(tree, (list, tuple)) else None


@torch.no_grad()
def draft_and_verify(prompt: List[int], target: Runner, drafter: Drafter, config: GenerationConfig) -> List[int]:
    """The speculative loop shared by every drafter; returns the new tokens (prompt excluded).

    Each step the drafter proposes ``k <= gamma`` tokens ``d_1..d_k`` and the target ``M_p`` scores
    the sequence plus all drafts in one forward pass, giving ``p_1..p_{k+1}``. Acceptance:

    * greedy processor, or a drafter with no probabilities (n-gram, lookup): the target draws its
      own token ``t_i ~ p_i`` (argmax when greedy); drafts are accepted while ``d_i == t_i``, and
      the first ``t_i`` that differs is emitted. Exact for greedy; lossless when sampling, since
      every emitted token is the target's own sample.
    * a drafter model ``M_q`` with probabilities ``q_i``, sampling: accept ``d_i`` when
      ``r_i < p_i(d_i) / q_i(d_i)``, ``r_i ~ U(0, 1)``; at the first rejection emit a token from
      ``norm(max(0, p_i - q_i))`` (from ``p_i`` if ``skip_sample_adjustment``, which is lossy).

    After ``n`` accepted drafts the bonus ``t_{n+1} ~ p_{n+1}`` is emitted too; caches keep the
    first ``len + n`` positions. Generation stops after ``config.max_gen_len`` new tokens, a stop
    token, or at the target's window. ``config.policy`` sets each step's draft length; observers
    see each step.
    """
    drafter = as_drafter(drafter)
    end = generation_end(len(prompt), config.max_gen_len, context_window(target.model))
    ids = torch.zeros((1, end), dtype=torch.long, device=target.device)
    ids[0, : len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=target.device)
    tokens = list(prompt)
    processor, policy, stats = config.processor, config.policy, config.stats
    greedy = isinstance(processor, GreedyProcessor)
    drafting = not config.first_target
    policy.start(config.gamma, drafter.cheap, drafter.memory_key, drafter.step_cost)
    drafter.attach(target)
    while len(tokens) < end:
        cur = len(tokens)
        k = max(0, min(policy.length(policy.bound()), end - cur - 1, drafter.max_drafts(cur))) if drafting else 0
        drafting = True
        q = None
        clock = time.perf_counter()
        if k > 0 and drafter.cheap and policy.auto:  # drafting is free next to verifying: fill the padded pass
            k = min(policy.rows(k, end - cur) - 1, drafter.max_drafts(cur))
        if k < policy.min_draft:  # decided before drawing any draft, so no sample is discarded
            k = 0
        if k > 0:
            proposed, q = drafter.propose(ids, tokens, k)
            if q is not None and proposed < min(k, policy.min_draft):
                raise RuntimeError("a drafter with probabilities stopped before min_draft drafts: dropping them would bias sampling")
            k = policy.keep(proposed)
            q = q[:k] if q is not None else None
        drafted_at = time.perf_counter()
        rows = policy.rows(k, end - cur)  # positions past cur + k are padding, discarded below
        logits = target(ids[:, : cur + rows - 1], rows)[: k + 1]
        if config.vocab_size is not None:
            logits = logits[:, : config.vocab_size]
        p = processor(logits)  # [k + 1, V]
        drafts = ids[0, cur : cur + k]
        if q is not None and k > 0 and not greedy:
            q = q.to(p.device)
            at = torch.arange(k, device=p.device)
            r = torch.rand(k, device=p.device, dtype=p.dtype)
            matches = r * q[at, drafts] < p[at, drafts]
            corrections = p[:k] if config.skip_sample_adjustment else _residual(p[:k], q)
            own = torch.cat([processor.sample(corrections), processor.sample(p[k:])])[:, 0]
        else:
            own = processor.sample(p)[:, 0]
            matches = own[:k] == drafts
        wanted = drafter.fetch(p)
        parts = [drafts, matches.long(), own] + [t.reshape(-1).to(own.device) for t in _tensors(wanted)]
        # the only host-device synchronisation of the step
        fetched = torch.cat(parts).tolist()
        draft_list, match_list, own_list = fetched[:k], fetched[k : 2 * k], fetched[2 * k : 3 * k + 1]
        n = match_list.index(0) if 0 in match_list else k
        emitted = draft_list[:n] + [own_list[n]]
        stop_at = next((i for i, t in enumerate(emitted) if t in config.stop_tokens), None)
        if stop_at is not None:
            emitted = emitted[: stop_at + 1]
        ids[0, cur + n] = own[n]
        tokens.extend(emitted)
        target.rollback(cur + n)
        policy.update(k, n, rows)
        stats.record_step(k, min(n, len(emitted)), len(emitted))
        stats.draft_seconds += drafted_at - clock
        stats.verify_seconds += time.perf_counter() - drafted_at
        config.observe(Step(tokens, cur, len(prompt), draft_list, n, own_list[n], stop_at is not None, rows=rows))
        if stop_at is not None:
            break
        drafter.accept(tokens, cur, n, _on_host(wanted, iter(fetched[3 * k + 1 :])))
    stats.paused_steps += policy.paused_steps
    policy.finish()
    return tokens[len(prompt) :]


def speculative(prompt: List[int], target: Runner, drafter: Drafter, config: GenerationConfig) -> Tuple[List[int], float]:
    """``draft_and_verify``, returned as the reference's public functions return: (new token ids, acceptance rate)."""
    return draft_and_verify(prompt, target, drafter, config), config.stats.acceptance_rate


@reference_keywords
@torch.no_grad()
def speculative_generate(
    inputs: List[int], drafter: Module, target: Module, tokenizer=None, gamma: int = 5,
    logits_processor: LogitsProcessor = GreedyProcessor(), max_gen_len: int = 40, eos_tokens_id: int | List[int] = 1,
    pad_token_id: int = 0, use_cache: bool = False, skip_sample_adjustment: bool = False, first_target: bool = True,
    debug: bool = False, stats: GenerationStats | None = None, policy: DraftPolicy | None = None,
    streamer: Callable[[List[int], int], None] | None = None, compile: bool | None = None,
    runner: RunnerConfig | None = None, drafter_runner: RunnerConfig | None = None,
    drafter_tokenizer=None, drafter_inputs: List[int] | None = None,
) -> Tuple[List[int], float]:
    """Speculative decoding with a drafter model (Leviathan et al. 2023; Chen et al. 2023), for
    decoder-only models and for encoder-decoder models sharing one decoder vocabulary (both
    encoders read ``inputs`` once; the decoders generate, without the decoder start token).

    ``drafter`` (M_q) proposes ``gamma`` tokens autoregressively; ``target`` (M_p) verifies them in
    one forward pass. Acceptance rule (see ``draft_and_verify``): greedy compares tokens, so the
    output equals greedy ``autoregressive_generate`` on the target exactly; sampling accepts
    ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))`` and resamples a rejection from
    ``norm(max(0, p_i - q_i))``, so the output follows the target's distribution.
    ``skip_sample_adjustment=True`` resamples from ``p_i`` instead: faster to reason about, lossy.

    Args:
        inputs: prompt token ids (batch size 1). tokenizer: for the debug view, and to allow
            vocabularies that differ only by padding rows. gamma: most drafts per step (>= 1).
        max_gen_len: most new tokens. eos_tokens_id: one id or a list; generation stops after the
            first. pad_token_id: kept for compatibility (nothing is padded). use_cache: KV caches on,
            fed only new tokens and rolled back after a rejection. first_target: start with one
            plain target step. debug: show each step (accepted drafts green, rejected red, the
            target's token blue). stats: a ``GenerationStats`` to fill. policy: a ``DraftPolicy``
            (adaptive length, minimum draft, pauses, ``p_min`` confidence cutoff).
            streamer: called with each step's emitted tokens and how many were drafts.
            runner, drafter_runner: how the target's and the drafter's passes run (``RunnerConfig``:
            cache kind, compiled; the drafter's defaults to the target's; None: eager, the device's
            cache). compile: True/False overrides both configurations' ``compile``; needs ``use_cache``.
            drafter_tokenizer: the drafter's own tokenizer; when its vocabulary is not ``tokenizer``'s
            (which must then be given), the drafter drafts across tokenizers
            (``drafters.cross_tokenizer``: text translation when greedy, the shared tokens when
            sampling; decoder-only). drafter_inputs: the prompt as the drafter reads it (its own
            chat template's rendering; None: the prompt's text in the drafter's tokens).

    Returns:
        (new token ids, acceptance rate = accepted drafts / drafted tokens).
    """
    prompt, encoder_ids = decoder_inputs(check_prompt(inputs), target, drafter)
    if drafter_tokenizer is not None and not same_vocabulary(tokenizer, drafter_tokenizer):
        if encoder_ids is not None:
            raise ValueError("a drafter with its own tokenizer drafts for decoder-only models only")
        config = GenerationConfig.of(locals())
        drafting = cross_drafter(drafter, config, prompt, target, tokenizer, drafter_tokenizer, drafter_inputs)
        return speculative(prompt, config.make_runner(target), drafting, config)
    config = GenerationConfig.of(locals(), vocab_size=common_vocab_size(drafter, target, tokenizer))
    drafting = ModelDrafter.of(drafter, config, encoder_input_ids=encoder_ids)
    return speculative(prompt, config.make_runner(target, encoder_ids), drafting, config)


speculative_generate_encoder_decoder = speculative_generate  # the reference's name for encoder-decoder models
