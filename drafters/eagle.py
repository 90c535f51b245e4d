"""A learned EAGLE-3 head drafting for its target (Li et al. 2025, arXiv:2503.01840): it reads the
target's hidden states at three layers (``runners.base.Runner.hidden``) and drafts chains, or
dynamic trees in the manner of EAGLE-2 (Li et al. 2024, arXiv:2406.16858), over its own KV cache
(``eagle.head.HeadCache``), rolled back with the target's.

Head position ``t`` holds the pair (the target's features at ``t``, token ``x_{t+1}``) and scores
``x_{t+2}``. After each target pass the features of the accepted positions are kept (``accept``);
the next proposal feeds the pairs the head has not seen, then drafts: a draft at depth ``d`` sits at
position ``cur - 1 + d`` and reads its parent's output with its own token. Drafts the target rejected
leave cache slots past ``fed``, written over by the next feed.
"""
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch
from torch import Tensor

from drafters.base import Drafter
from drafters.spec import DraftContext, DrafterSpec
from eagle.head import Eagle3Head, HeadCache
from eagle.head_step import HeadStepCache
from kernels.head_step import cache_dtype
from runners.hidden import check_layers
from runners.limits import output_vocab_size
from utils.parsing import check_positive_int
from utils.logits_processor import GreedyProcessor, LogitsProcessor


class EagleDrafter(Drafter):
    """Drafts with an ``Eagle3Head`` and the target's logits processor. Chains: greedy drafts are the
    head's argmax (``q`` None); sampled ones come with the head's ``q`` over the target's vocabulary
    (zero outside the draft vocabulary), so the loop's acceptance rule keeps sampling lossless.
    ``p_min``: stop a chain where the head's top probability is below it (never below ``min_draft``).
    Trees (``propose_tree``): the head's ``top_k`` best children of the ``top_k`` best nodes of each
    depth, up to ``depth`` levels, reranked by the product of the head's probabilities along the
    path (``estimates``); deterministic drafts, so sampling stays lossless by the tree loop's walk."""

    cheap = False
    supports_trees = True

    def __init__(self, head: Eagle3Head, processor: LogitsProcessor, vocab_size: int | None = None,
                 p_min: float = 0.0, min_draft: int = 0, top_k: int = 4, depth: int = 5):
        self.head = head
        self.memory_key = ("eagle", id(head))
        self.step_cost = getattr(head, "step_cost", None)  # measured at load (``eagle.cost``), else the policy's
        self.processor, self.greedy = processor, isinstance(processor, GreedyProcessor)
        self.vocab_size = vocab_size or head.config.target_vocab_size
        self.p_min, self.min_draft = p_min, min_draft
        self.top_k, self.depth = min(top_k, head.config.draft_vocab_size), depth
        self.draft_ids = head.target_ids()  # [Vd] target id of each draft token
        self.target = None
        self.features: Tensor | None = None  # [capacity, 3 * Ht] the target's, by position
        self.cache: HeadCache | None = None
        self.known = 0  # positions < known have the target's features
        self.fed = 0  # head slots < fed hold pairs with the target's features (positions 0..fed-1)
        self._estimates: List[float] = []
        self._passes = 0  # the head's passes in the last ``propose_tree`` (``tree_drafts``)

    @classmethod
    def of(cls, head: Eagle3Head, config, **shape) -> "EagleDrafter":
        """A drafter for ``head`` under a ``sampling.GenerationConfig``: its processor, the shared
        vocabulary, the policy's confidence cutoff and floor; ``shape``: ``top_k``, ``depth``."""
        return cls(head, config.processor, config.vocab_size, config.policy.p_min, config.policy.min_draft, **shape)

    def attach(self, target: Any) -> None:
        model = target.model
        if getattr(model.config, "is_encoder_decoder", False):
            raise ValueError("an EAGLE head drafts for decoder-only targets")
        target.hidden_layers = check_layers(model, self.head.config.aux_layers)
        self.target = target
        self.compiled = bool(getattr(target, "compiled_step", False))  # the target on the compiled step: the head's too

    # ---- the head catches up on the accepted positions ----------------------------------------
    def _ready(self, cur: int) -> bool:
        """Whether the target's features reach position ``cur - 2`` (a target pass came first)."""
        return self.known >= cur - 1 > self.fed

    def _feed(self, following: Tensor, cur: int) -> Tuple[Tensor, Tensor]:
        """Feed the pairs the head lacks (positions ``fed..cur-2``: the target's features, with the
        token after each, ``following`` ``[cur - 1 - fed]``); returns its output at ``cur - 2`` ``[1, H]``
        and its draft logits ``[1, Vd]``."""
        head = self.head
        if self.cache is None:
            self.cache = HeadStepCache(head, 2 * cur) if self.compiled else \
                HeadCache(head, max(256, 2 * cur), following.device, cache_dtype(head))  # float32 for the C head step
        start = self.fed
        out, logits = self._draft_step(following, start, features=self.features[start : cur - 1])
        self.fed = cur - 1
        return out[-1:], logits

    def _draft_step(self, ids: Tensor, start: int, **rows) -> Tuple[Tensor, Tensor]:
        """``Eagle3Head.draft_step`` over this generation's cache (its outputs ``[m, H]`` and draft logits):
        the C head step or torch's, or, where the target runs the compiled step, the head's own
        (``eagle.head_step``)."""
        if isinstance(self.cache, HeadStepCache):
            if self.head.hooked():  # a graph runs no hook: the torch step over the same cache (``runners.hooks``)
                return self.head.draft_step(self.cache.cache, ids, start, **rows)
            return self.cache.draft_step(ids, start, **rows)
        return self.head.draft_step(self.cache, ids, start, **rows)

    # ---- chains -------------------------------------------------------------------------------
    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, Tensor | None]:
        cur = len(tokens)
        if k < max(1, self.min_draft) or not self._ready(cur):
            return 0, None
        head = self.head
        out, logits = self._feed(ids[0, self.fed + 1 : cur], cur)  # [1, H], [1, Vd]
        qs, drawn = [], 0
        for i in range(k):
            q = None if self.greedy else self._distribution(logits)
            # not confident: stop here, decided before this draft is drawn (never below min_draft)
            if self.p_min > 0 and i >= self.min_draft and float(self._confidence(logits, q)) < self.p_min:
                break
            if q is None:
                ids[0, cur + i] = self.draft_ids[logits.argmax(-1)][0]
            else:
                ids[0, cur + i] = self.processor.sample(q)[0, 0]
                qs.append(q)
            drawn += 1
            if i + 1 < k:
                out, logits = self._draft_step(ids[0, cur + i : cur + i + 1], cur - 1 + i, hidden=out)
        return drawn, (torch.cat(qs) if qs else None)

    def _distribution(self, logits: Tensor) -> Tensor:
        """``q`` ``[1, V]``: the processor's distribution of draft-vocabulary ``logits`` ``[1, Vd]`` over
        the target's vocabulary (tokens outside the draft vocabulary get probability 0)."""
        full = logits.new_full((1, self.vocab_size), float("-inf"))
        full[0, self.draft_ids] = logits[0]
        return self.processor(full)

    def _confidence(self, logits: Tensor, q: Tensor | None) -> Tensor:
        return (q if q is not None else torch.softmax(logits.float(), dim=-1)).max()

    # ---- trees --------------------------------------------------------------------------------
    def propose_tree(self, tokens: List[int], budget: int) -> Tuple[List[int], List[int]]:
        self._estimates, self._passes = [], 0
        cur = len(tokens)
        if budget < 1 or not self._ready(cur):
            return [], []
        head, k = self.head, self.top_k
        device = self.draft_ids.device
        out, logits = self._feed(torch.tensor(tokens[self.fed + 1 : cur], device=device), cur)  # [1, H], [1, Vd]
        self._passes = 1
        scores, drafted, parents, slots = [], [], [], []  # per candidate node; slot -1: not fed
        frontier, base, slot = [-1], torch.zeros(1, device=device), self.fed
        for depth in range(self.depth):
            logp = torch.log_softmax(logits.float(), dim=-1)  # [frontier, Vd]
            top, index = logp.topk(k, dim=-1)
            total = (base.unsqueeze(1) + top).flatten()
            values = torch.cat([total, self.draft_ids[index.flatten()].to(total.dtype)]).tolist()  # one sync a depth
            n = len(frontier) * k
            first = len(scores)
            for j in range(n):
                scores.append(values[j])
                drafted.append(int(values[n + j]))
                parents.append(frontier[j // k])
                slots.append(-1)
            if depth + 1 == self.depth or len(scores) >= budget and max(values[:n]) < sorted(scores, reverse=True)[budget - 1]:
                break
            chosen = sorted(range(first, first + n), key=lambda i: -scores[i])[:k]
            out, logits = self._expand(chosen, out, first, drafted, parents, slots, slot, cur - 1 + depth)
            self._passes += 1
            for r, i in enumerate(chosen):
                slots[i] = slot + r
            slot += len(chosen)
            frontier, base = chosen, torch.tensor([scores[i] for i in chosen], device=device)
        return self._best(scores, drafted, parents, budget)

    def tree_drafts(self, parents: List[int]) -> int:
        """The head's passes in the last ``propose_tree`` (its catch-up, then one a level expanded), each a draft."""
        return self._passes

    def _expand(self, chosen: List[int], out: Tensor, first: int, drafted: List[int], parents: List[int],
                slots: List[int], slot: int, position: int) -> Tuple[Tensor, Tensor]:
        """Feed the ``chosen`` nodes (one depth, at ``position``) into slots ``slot..``, each reading
        its parent's output (row ``(i - first) // top_k`` of ``out`` ``[frontier, H]``) and attending
        to the accepted positions, its ancestors' slots and its own; returns their outputs ``[m, H]`` and
        draft logits ``[m, Vd]``."""
        head, m = self.head, len(chosen)
        device = out.device
        mask = torch.zeros((m, slot + m), dtype=torch.bool, device=device)
        mask[:, : self.fed] = True
        for r, i in enumerate(chosen):
            mask[r, slot + r] = True
            parent = parents[i]
            while parent >= 0:
                mask[r, slots[parent]] = True
                parent = parents[parent]
        rows = torch.tensor([(i - first) // self.top_k for i in chosen], device=device)
        tokens = torch.tensor([drafted[i] for i in chosen], device=device)
        positions = torch.full((m,), position, device=device)
        return self._draft_step(tokens, slot, hidden=out[rows], mask=mask, positions=positions, n_last=m)

    def _best(self, scores: List[float], drafted: List[int], parents: List[int], budget: int) -> Tuple[List[int], List[int]]:
        """The ``budget`` candidates of highest path probability, parents first (a child's never
        exceeds its parent's, so the choice holds every ancestor), reindexed."""
        depth = [0] * len(scores)
        for i, parent in enumerate(parents):
            depth[i] = 0 if parent < 0 else depth[parent] + 1
        chosen = sorted(range(len(scores)), key=lambda i: (-scores[i], depth[i], i))[:budget]
        index = {-1: -1}
        for new, old in enumerate(chosen):
            index[old] = new
        chosen = [i for i in chosen if parents[i] in index]  # float ties: never an orphan
        self._estimates = [float(torch.tensor(scores[i]).exp()) for i in chosen]
        return [drafted[i] for i in chosen], [index[parents[i]] for i in chosen]

    def estimates(self) -> List[float] | None:
        return self._estimates

    # ---- after the target's pass: keep its features for the accepted positions -----------------
    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: Any) -> None:
        self._keep(self.target.hidden_start, self.target.hidden)
        self.known = start + n_accepted

    def accept_tree(self, tokens: List[int], start: int, nodes: List[int], parents: List[int], path: List[int],
                    fetched: Any) -> None:
        hidden, first = self.target.hidden, self.target.hidden_start
        prefix = start - first  # rows of the uncached accepted positions, then one row per node
        self._keep(first, hidden[:prefix])
        if path:
            self._keep(start, hidden[prefix + torch.tensor(path, device=hidden.device)])
        self.known = start + len(path)

    def _keep(self, first: int, rows: Tensor) -> None:
        """Write ``rows`` ``[m, 3 * Ht]`` at positions ``first..`` of the feature buffer (grown by doubling)."""
        end = first + rows.shape[0]
        if self.features is None or self.features.shape[0] < end:
            grown = rows.new_zeros((max(256, 1 << (end - 1).bit_length()), rows.shape[1]))
            if self.features is not None:
                grown[: self.known] = self.features[: self.known]
            self.features = grown
        self.features[first:end] = rows


@dataclass(frozen=True)
class EagleSpec(DrafterSpec):
    """The learned EAGLE-3 head ``DraftContext.head`` drafting for its target: chains of at most the
    generation's ``gamma`` tokens (the policy's ``p_min`` cutoff and ``min_draft`` floor), or with
    ``trees`` dynamic trees of up to ``tree_size`` nodes (the ``top_k`` best children of the ``top_k``
    best nodes, ``depth`` levels), verified in one target pass. Greedy exact, sampling lossless."""

    trees: bool = False
    tree_size: int = 16
    top_k: int = 4
    depth: int = 5

    def __post_init__(self):
        for name in ("tree_size", "top_k", "depth"):
            check_positive_int(name, getattr(self, name))

    def budget(self) -> Optional[int]:
        return self.tree_size if self.trees else None

    def make(self, prompt: List[int], target, config, context: DraftContext) -> EagleDrafter:
        head, policy = context.need("head", "EAGLE drafting"), config.policy
        return EagleDrafter(head, config.processor, config.vocab_size or output_vocab_size(target), policy.p_min, policy.min_draft,
                            self.top_k, self.depth)
