"""Speculative decoding's chain loop (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023,
arXiv:2302.01318): the one verification loop every chain drafter runs in (trees: ``tree_decoding``)."""
import time
from typing import Any, Iterator, List, Tuple

import torch
from torch import Tensor

from drafters.base import UNREAD, Drafter, as_drafter
from runners import Runner
from runners.limits import context_window
from sampling.common import generation_end
from sampling.config import GenerationConfig, Step
from utils.logits_processor import GreedyProcessor, first_rows


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


def _loop_start(prompt: List[int], target: Runner, drafter, config: GenerationConfig) -> Tuple[Drafter, int, Tensor, List[int]]:
    """What both loops start from: the drafter as a ``Drafter``, attached to ``target``; ``end``, the
    last position the generation may reach; ``ids`` (1, end), the prompt written in; the tokens so far.
    The policy is started for the drafter (a drafter's evidence, a tree drafter's with ``tree_evidence``, may gate its drafts)."""
    drafter = as_drafter(drafter)
    end = generation_end(len(prompt), config.max_gen_len, context_window(target.model))
    ids = torch.zeros((1, end), dtype=torch.long, device=target.device)
    ids[0, : len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=target.device)
    config.policy.start(config.gamma, drafter.cheap, drafter.memory_key, drafter.step_cost,
                        evidence=drafter.tree_evidence if config.trees else drafter.reports_evidence)
    drafter.attach(target)
    return drafter, end, ids, list(prompt)


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
    drafter, end, ids, tokens = _loop_start(prompt, target, drafter, config)
    processor, policy, stats = config.processor, config.policy, config.stats
    greedy = isinstance(processor, GreedyProcessor)
    drafting = not config.first_target
    host = ids.numpy() if ids.device.type == "cpu" else None  # a view of ids' memory
    while len(tokens) < end:
        cur = len(tokens)
        k = max(0, min(policy.length(policy.bound(), end - cur), end - cur - 1, drafter.max_drafts(cur))) if drafting else 0
        drafting = True
        q, asked, made = None, False, 0
        cut = None  # (the first draft, its evidence) where the gate cut a step's drafts to none
        clock = time.perf_counter()
        if k > 0 and drafter.cheap and policy.auto:  # drafting is free next to verifying: fill the padded pass
            k = min(policy.rows(k, end - cur) - 1, drafter.max_drafts(cur))
        if k < policy.min_draft:  # decided before drawing any draft, so no sample is discarded
            k = 0
        if k > 0:
            # a cheap drafter that reports its evidence drafts to the bound, cut below by that evidence
            asked = min(policy.ask(k), end - cur - 1, drafter.max_drafts(cur)) if drafter.cheap and drafter.reports_evidence else k
            proposed, q = drafter.propose(ids, tokens, asked)
            asked, made = True, proposed
            if q is not None and proposed < min(k, policy.min_draft):
                raise RuntimeError("a drafter with probabilities stopped before min_draft drafts: dropping them would bias sampling")
            if q is None and drafter.reports_evidence:  # deterministic drafts: cutting them changes nothing accepted
                evidence = drafter.evidence()
                kept = policy.trim(proposed, evidence, k, end - cur)
                # the gate cut them all: the first is checked after (on the host's ids: off it, a second sync a step)
                if host is not None and kept == 0 < proposed and evidence and evidence[0] > 0:
                    cut = (int(host[0, cur]), evidence[0])
                proposed = kept
            k = policy.keep(proposed)
            q = q[:k] if q is not None else None
        drafted_at = time.perf_counter()
        rows = policy.rows(k, end - cur)  # positions past cur + k are padding, discarded below
        logits = first_rows(target(ids[:, : cur + rows - 1], rows), k + 1)  # with the rows' tops where the pass read them
        if config.vocab_size is not None:
            logits = logits[:, : config.vocab_size]
        read = _greedy_read(ids, cur, k, logits, drafter, processor) if greedy else None
        draft_list, match_list, own_list, wanted, rest = read or _verified(ids[0, cur : cur + k], logits, q, drafter, config)
        n = match_list.index(0) if 0 in match_list else k
        emitted = draft_list[:n] + [own_list[n]]
        stop_at = next((i for i, t in enumerate(emitted) if t in config.stop_tokens), None)
        if stop_at is not None:
            emitted = emitted[: stop_at + 1]
        if host is not None:  # the token written into memory, no tensor indexed (target AR's own write, its host cost halved)
            host[0, cur + n] = own_list[n]
        else:
            ids[0, cur + n] = own_list[n]
        tokens.extend(emitted)
        target.rollback(cur + n)
        policy.update(k, n, rows)
        if cut is not None:  # what the plain step's token says of the draft the gate cut (decided before: lossless)
            policy.unverified(cut[0] == own_list[0], cut[1])
        stats.record_step(k, min(n, len(emitted)), len(emitted))
        verified_at = time.perf_counter()
        stats.draft_seconds += drafted_at - clock
        stats.verify_seconds += verified_at - drafted_at
        if cur == len(prompt):
            stats.first_step_seconds = verified_at - clock
        else:  # the first pass also runs the prompt: not what a step of its width costs
            policy.measured(rows, verified_at - drafted_at, drafted_at - clock, asked, made)  # what this step paid, for the next ones
        if config.observers:  # the step's record is made only for someone to see it (as target AR's loop)
            config.observe(Step(tokens, cur, len(prompt), draft_list, n, own_list[n], stop_at is not None, rows=rows))
        if stop_at is not None:
            break
        drafter.accept(tokens, cur, n, _on_host(wanted, iter(rest)))
    stats.paused_steps += policy.paused_steps
    stats.policy = policy.chosen()
    policy.finish()
    return tokens[len(prompt) :]


def _greedy_read(ids: Tensor, cur: int, k: int, logits: Tensor, drafter: Drafter, processor: GreedyProcessor) -> tuple | None:
    """Greedy verification as target AR reads its token: the target's tokens as ints from the row tops the pass kept on
    ``logits`` ``[k + 1, V]`` (``clear_tokens``), and what the drafter fetches read from the logits (``fetch_logits``):
    no softmax, no tensor made, only the drafts ``ids[0, cur : cur + k]`` (none in a plain step) read back.
    ``_verified``'s tuple, the same values; None where the tops are missing or unclear, or the drafter's fetch needs the
    distributions."""
    own = processor.clear_tokens(logits)
    if own is None:
        return None
    wanted = drafter.fetch_logits(logits, processor.temperature) if drafter.fetches else None
    if wanted is UNREAD:
        return None
    tensors = _tensors(wanted)
    draft_list = ids[0, cur : cur + k].tolist() if k else []
    if len(tensors) == 1:  # NASD's one tensor of fillers: read back as it is, nothing concatenated
        rest = tensors[0].reshape(-1).tolist()
    else:
        rest = torch.cat([t.reshape(-1) for t in tensors]).tolist() if tensors else []
    return draft_list, [int(d == t) for d, t in zip(draft_list, own)], own, wanted, rest


def _verified(drafts: Tensor, logits: Tensor, q: Tensor | None, drafter: Drafter, config: GenerationConfig) -> tuple:
    """The tensor path of a step's verification: ``drafts`` ``[k]`` against the pass's ``logits`` ``[k + 1, V]`` (and a
    drafter model's ``q`` when sampling); returns (drafts, matches as 0/1, the target's own tokens ``[k + 1]``, what the
    drafter fetched, the fetched values) on the host, read back in the step's one host-device synchronisation."""
    processor, k = config.processor, drafts.shape[0]
    greedy = isinstance(processor, GreedyProcessor)
    # greedy on the host, a drafter that reads the distributions (NASD's fillers): read from the logits where that is
    # the same (``fetch_logits``; rows whose pass kept no tops come here: a softmax over [k + 1, 151,936] was 5-18 ms a
    # step of the pair's NASD beside other work, against prompt lookup's 0.5); off the host it would add a sync
    early = drafter.fetch_logits(logits, processor.temperature) if greedy and drafter.fetches and logits.device.type == "cpu" else UNREAD
    # [k + 1, V]; greedy with a drafter that reads none, or read already: no softmax, the tokens from the logits (the same tokens)
    p = processor(logits) if not greedy or drafter.fetches and early is UNREAD else None
    if q is not None and k > 0 and not greedy:
        q = q.to(p.device)
        at = torch.arange(k, device=p.device)
        r = torch.rand(k, device=p.device, dtype=p.dtype)
        matches = r * q[at, drafts] < p[at, drafts]
        corrections = p[:k] if config.skip_sample_adjustment else _residual(p[:k], q)
        own = torch.cat([processor.sample(corrections), processor.sample(p[k:])])[:, 0]
    else:
        own = (processor.sample(p) if p is not None else processor.choose(logits))[:, 0]
        matches = own[:k] == drafts
    wanted = early if early is not UNREAD else drafter.fetch(p) if p is not None else None
    parts = [drafts, matches.long(), own] + [t.reshape(-1).to(own.device) for t in _tensors(wanted)]
    fetched = torch.cat(parts).tolist()  # the only host-device synchronisation of the step
    return fetched[:k], fetched[k : 2 * k], fetched[2 * k : 3 * k + 1], wanted, fetched[3 * k + 1 :]


def speculative(prompt: List[int], target: Runner, drafter: Drafter, config: GenerationConfig) -> Tuple[List[int], float]:
    """``draft_and_verify``, returned as the reference's public functions return: (new token ids, acceptance rate)."""
    return draft_and_verify(prompt, target, drafter, config), config.stats.acceptance_rate
