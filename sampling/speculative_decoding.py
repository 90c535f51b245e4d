"""Speculative decoding (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023, arXiv:2302.01318)."""
import time
from typing import Callable, List, Protocol, Tuple

import torch
from torch import Tensor
from torch.nn import Module

import utils.printing as printing
from sampling.common import (  # max_fn: the reference's public helper, importable from here
    check_positive_int,
    check_prompt,
    common_vocab_size,
    context_window,
    generation_end,
    max_fn,
    reference_keywords,
    stop_token_set,
)
from sampling.draft_policy import DraftPolicy
from sampling.stats import GenerationStats
from utils.caching import KVCacheModel
from utils.logits_processor import GreedyProcessor, LogitsProcessor


class Drafter(Protocol):
    """What the verification loop needs from a source of drafts.

    A drafter whose ``cheap`` attribute is true (n-gram storage, prompt lookup) is asked for as many
    drafts as the step's verification pass has room for after padding (``DraftPolicy.rows``), and
    with measured costs its draft length may grow past ``gamma`` to the longest measured pass when
    its recent acceptance makes that pay.
    """

    def max_drafts(self, position: int) -> int:
        """How many drafts it can propose for a sequence of ``position`` tokens."""

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, Tensor | None]:
        """Write up to ``k`` drafts into ``ids[0, len(tokens):]``; return how many, and their
        probabilities ``q`` ``[count, V]`` under the drafter (None for a deterministic drafter)."""

    def fetch(self, target_probs: Tensor) -> Tensor | None:
        """What the drafter needs on the host from the target's distributions ``[k + 1, V]``
        (an int tensor, fetched in the step's single device sync), or None."""

    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: List[int]) -> None:
        """Told after each step: ``tokens[start:]`` were emitted, the first ``n_accepted`` of them
        accepted drafts; ``fetched`` is what ``fetch`` asked for, flattened."""


def _residual(p: Tensor, q: Tensor) -> Tensor:
    """norm(max(0, p - q)) row-wise; falls back to p where p <= q everywhere (rounding only)."""
    r = torch.clamp(p - q, min=0)
    mass = r.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp(min=torch.finfo(r.dtype).tiny), p)


@torch.no_grad()
def draft_and_verify(
    prompt: List[int],
    target: KVCacheModel,
    drafter: Drafter,
    logits_processor: LogitsProcessor,
    gamma: int,
    end: int,
    stop_tokens: frozenset,
    vocab_size: int | None = None,
    first_target: bool = True,
    skip_sample_adjustment: bool = False,
    stats: GenerationStats | None = None,
    debug: bool = False,
    tokenizer=None,
    policy: DraftPolicy | None = None,
    streamer: Callable[[List[int], int], None] | None = None,
) -> List[int]:
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
    first ``len + n`` positions. ``end`` is the sequence length at which generation stops.
    ``policy`` sets each step's draft length (fixed ``gamma`` by default); ``streamer(tokens,
    n_drafted)`` is called with each step's emitted tokens, the first ``n_drafted`` being drafts.
    """
    device = target.device
    ids = torch.zeros((1, end), dtype=torch.long, device=device)
    ids[0, : len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=device)
    tokens = list(prompt)
    greedy = isinstance(logits_processor, GreedyProcessor)
    drafting = not first_target
    policy = policy if policy is not None else DraftPolicy()
    cheap = getattr(drafter, "cheap", False)
    policy.start(gamma, cheap, getattr(drafter, "memory_key", None))
    stats = stats if stats is not None else GenerationStats()
    while len(tokens) < end:
        cur = len(tokens)
        k = max(0, min(policy.length(policy.bound()), end - cur - 1, drafter.max_drafts(cur))) if drafting else 0
        drafting = True
        q = None
        clock = time.perf_counter()
        if k > 0 and cheap and policy.auto:  # drafting is free next to verifying: fill the padded pass
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
        if vocab_size is not None:
            logits = logits[:, :vocab_size]
        p = logits_processor(logits)  # [k + 1, V]
        drafts = ids[0, cur : cur + k]
        if q is not None and k > 0 and not greedy:
            q = q.to(p.device)
            at = torch.arange(k, device=p.device)
            r = torch.rand(k, device=p.device, dtype=p.dtype)
            matches = r * q[at, drafts] < p[at, drafts]
            corrections = p[:k] if skip_sample_adjustment else _residual(p[:k], q)
            own = torch.cat([logits_processor.sample(corrections), logits_processor.sample(p[k:])])[:, 0]
        else:
            own = logits_processor.sample(p)[:, 0]
            matches = own[:k] == drafts
        wanted = drafter.fetch(p)
        parts = [drafts, matches.long(), own] + ([wanted.reshape(-1).to(own.device)] if wanted is not None else [])
        # the only host-device synchronisation of the step
        fetched = torch.cat(parts).tolist()
        draft_list, match_list, own_list = fetched[:k], fetched[k : 2 * k], fetched[2 * k : 3 * k + 1]
        n = match_list.index(0) if 0 in match_list else k
        emitted = draft_list[:n] + [own_list[n]]
        if debug:
            printing.show_step(tokenizer, tokens[len(prompt) :], draft_list[:n], draft_list[n:], own_list[n])
        stop_at = next((i for i, t in enumerate(emitted) if t in stop_tokens), None)
        if stop_at is not None:
            emitted = emitted[: stop_at + 1]
            if debug:
                printing.end_token_found(cur + stop_at - len(prompt))
        ids[0, cur + n] = own[n]
        tokens.extend(emitted)
        target.rollback(cur + n)
        policy.update(k, n, rows)
        stats.record_step(k, min(n, len(emitted)), len(emitted))
        stats.draft_seconds += drafted_at - clock
        stats.verify_seconds += time.perf_counter() - drafted_at
        if streamer is not None:
            streamer(emitted, min(n, len(emitted)))
        if stop_at is not None:
            break
        drafter.accept(tokens, cur, n, fetched[3 * k + 1 :])
    stats.paused_steps += policy.paused_steps
    policy.finish()
    return tokens[len(prompt) :]


class ModelDrafter:
    """A small language model ``M_q`` drafting with the same logits processor as the target."""

    def __init__(
        self, model: KVCacheModel, logits_processor: LogitsProcessor, vocab_size: int, window: int | None,
        p_min: float = 0.0, min_draft: int = 0,
    ):
        self.model = model
        self.memory_key = ("model", id(model.model))  # what a DraftPolicy remembers it by
        self.p_min, self.min_draft = p_min, min_draft
        self.logits_processor = logits_processor
        self.vocab_size = vocab_size
        self.window = window

    @classmethod
    def of(
        cls, model: Module, use_cache: bool, logits_processor: LogitsProcessor, vocab_size: int, policy: DraftPolicy | None,
        encoder_input_ids: List[int] | None = None,
    ):
        """A drafter for ``model`` with the policy's confidence cutoff and its floor."""
        p_min, min_draft = (policy.p_min, policy.min_draft) if policy is not None else (0.0, 0)
        runner = KVCacheModel(model, use_cache, encoder_input_ids=encoder_input_ids)
        return cls(runner, logits_processor, vocab_size, context_window(model), p_min, min_draft)

    def max_drafts(self, position: int) -> int:
        return self.window - position + 1 if self.window is not None else 1 << 30

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, Tensor]:
        cur = len(tokens)
        k = min(k, self.max_drafts(cur))
        if k < self.min_draft:  # known before any draft is drawn: nothing is dropped after sampling
            return 0, None
        qs = []
        for i in range(k):
            q = self.logits_processor(self.model(ids[:, : cur + i], 1)[:, : self.vocab_size])
            # not confident: stop here, decided before this draft is drawn (never below min_draft)
            if self.p_min > 0 and i >= self.min_draft and float(q.max()) < self.p_min:
                break
            ids[0, cur + i] = self.logits_processor.sample(q)[0, 0]
            qs.append(q)
        return len(qs), torch.cat(qs) if qs else None

    def fetch(self, target_probs: Tensor) -> None:
        return None

    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: List[int]) -> None:
        self.model.rollback(start + n_accepted)


def check_gamma(gamma: int) -> int:
    return check_positive_int("gamma", gamma)


@reference_keywords
@torch.no_grad()
def speculative_generate(
    inputs: List[int],
    drafter: Module,
    target: Module,
    tokenizer=None,
    gamma: int = 5,
    logits_processor: LogitsProcessor = GreedyProcessor(),
    max_gen_len: int = 40,
    eos_tokens_id: int | List[int] = 1,
    pad_token_id: int = 0,
    use_cache: bool = False,
    skip_sample_adjustment: bool = False,
    first_target: bool = True,
    debug: bool = False,
    stats: GenerationStats | None = None,
    policy: DraftPolicy | None = None,
    streamer: Callable[[List[int], int], None] | None = None,
) -> Tuple[List[int], float]:
    """Speculative decoding with a drafter model (Leviathan et al. 2023; Chen et al. 2023).

    ``drafter`` (M_q) proposes ``gamma`` tokens autoregressively; ``target`` (M_p) verifies them in
    one forward pass. Acceptance rule (see ``draft_and_verify``): greedy compares tokens, so the
    output equals greedy ``autoregressive_generate`` on the target exactly; sampling accepts
    ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))`` and resamples a rejection from
    ``norm(max(0, p_i - q_i))``, so the output follows the target's distribution.
    ``skip_sample_adjustment=True`` resamples from ``p_i`` instead: faster to reason about, lossy.

    Args:
        inputs: prompt token ids (batch size 1). tokenizer: for the debug view, and to allow
            vocabularies that differ only by padding rows. gamma: drafts per step (>= 1).
        max_gen_len: most new tokens. eos_tokens_id: one id or a list; generation stops after the
            first. pad_token_id: kept for compatibility (nothing is padded). use_cache: KV caches on,
            fed only new tokens and rolled back after a rejection. first_target: start with one
            plain target step. stats: a ``GenerationStats`` to fill. policy: a ``DraftPolicy``
            (adaptive length, minimum draft, pauses, ``p_min`` confidence cutoff).
            streamer: called with each step's emitted tokens.

    Returns:
        (new token ids, acceptance rate = accepted drafts / drafted tokens).
    """
    prompt = check_prompt(inputs)
    check_gamma(gamma)
    vocab_size = common_vocab_size(drafter, target, tokenizer)
    window = context_window(target)
    end = generation_end(len(prompt), max_gen_len, window)
    stats = stats if stats is not None else GenerationStats()
    drafting = ModelDrafter.of(drafter, use_cache, logits_processor, vocab_size, policy)
    out = draft_and_verify(
        prompt, KVCacheModel(target, use_cache), drafting, logits_processor, gamma, end,
        stop_token_set(eos_tokens_id), vocab_size, first_target, skip_sample_adjustment, stats, debug, tokenizer, policy, streamer,
    )
    return out, stats.acceptance_rate
