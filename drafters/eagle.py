"""A learned EAGLE-3 head drafting for its target (Li et al. 2025, arXiv:2503.01840): it reads the
target's hidden states at three layers (``runners.base.Runner.hidden``) and drafts a chain, one head
pass per draft, over its own KV cache (``eagle.head.HeadCache``), rolled back with the target's.

Head position ``t`` holds the pair (the target's features at ``t``, token ``x_{t+1}``) and scores
``x_{t+2}``. After each target pass the features of the accepted positions are kept (``accept``);
the next ``propose`` feeds the pairs the head has not seen, then drafts: step ``i`` feeds the head's
own output of step ``i - 1`` with the draft it chose. Drafts the target rejected leave entries past
``fed`` in the head's cache, overwritten by the next feed (the cache is written by position).
"""
from typing import Any, List, Tuple

import torch
from torch import Tensor

from drafters.base import Drafter
from eagle.head import Eagle3Head, HeadCache
from runners.hidden import check_layers
from utils.logits_processor import GreedyProcessor, LogitsProcessor


class EagleDrafter(Drafter):
    """Drafts with an ``Eagle3Head`` and the target's logits processor: greedy drafts are the head's
    argmax (deterministic: ``q`` None); sampled drafts come with the head's ``q`` over the target's
    vocabulary (zero outside the draft vocabulary), so the loop's acceptance rule keeps sampling lossless.
    ``p_min``: stop drafting where the head's top probability is below it (never below ``min_draft``)."""

    cheap = False

    def __init__(self, head: Eagle3Head, processor: LogitsProcessor, vocab_size: int | None = None,
                 p_min: float = 0.0, min_draft: int = 0):
        self.head = head
        self.memory_key = ("eagle", id(head))
        self.processor, self.greedy = processor, isinstance(processor, GreedyProcessor)
        self.vocab_size = vocab_size or head.config.target_vocab_size
        self.p_min, self.min_draft = p_min, min_draft
        self.draft_ids = head.target_ids()  # [Vd] target id of each draft token
        self.target = None
        self.features: Tensor | None = None  # [capacity, 3 * Ht] the target's, by position
        self.cache: HeadCache | None = None
        self.known = 0  # positions < known have the target's features
        self.fed = 0  # head positions < fed hold pairs with the target's features

    @classmethod
    def of(cls, head: Eagle3Head, config) -> "EagleDrafter":
        """A drafter for ``head`` under a ``sampling.GenerationConfig``: its processor, the shared
        vocabulary, the policy's confidence cutoff and floor."""
        return cls(head, config.processor, config.vocab_size, config.policy.p_min, config.policy.min_draft)

    def attach(self, target: Any) -> None:
        model = target.model
        if getattr(model.config, "is_encoder_decoder", False):
            raise ValueError("an EAGLE head drafts for decoder-only targets")
        target.hidden_layers = check_layers(model, self.head.config.aux_layers)
        self.target = target

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, Tensor | None]:
        cur = len(tokens)
        if k < max(1, self.min_draft) or self.known < cur - 1 or self.fed >= cur - 1:
            return 0, None  # no target features for the last accepted position yet (no target pass)
        head = self.head
        if self.cache is None:
            self.cache = HeadCache(head, ids.shape[1] + 1, ids.device, head.fc.weight.dtype)
        start = self.fed
        hidden = head.fc(self.features[start : cur - 1].unsqueeze(0))
        out = head.decode(self.cache, head.embed(ids[:, start + 1 : cur]), hidden, start)[:, -1:]
        self.fed = cur - 1
        qs, drawn = [], 0
        for i in range(k):
            logits = head.logits(out[0])  # [1, Vd]
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
                out = head.decode(self.cache, head.embed(ids[:, cur + i : cur + i + 1]), out, cur - 1 + i)
        return drawn, (torch.cat(qs) if qs else None)

    def _distribution(self, logits: Tensor) -> Tensor:
        """``q`` ``[1, V]``: the processor's distribution of draft-vocabulary ``logits`` ``[1, Vd]`` over
        the target's vocabulary (tokens outside the draft vocabulary get probability 0)."""
        full = logits.new_full((1, self.vocab_size), float("-inf"))
        full[0, self.draft_ids] = logits[0]
        return self.processor(full)

    def _confidence(self, logits: Tensor, q: Tensor | None) -> Tensor:
        return (q if q is not None else torch.softmax(logits.float(), dim=-1)).max()

    # ---- after the target's pass: keep its features for the accepted positions -----------------
    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: Any) -> None:
        hidden, first = self.target.hidden, self.target.hidden_start
        self._keep(first, hidden)
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
