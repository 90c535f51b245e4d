"""``BeamRunner``: a model over a batch of beams that share one prompt, for beam search.

Not a ``runners.Runner``: those hold one sequence (batch size 1) and roll back, while beams are a
batch whose cache rows are reordered (a row per unfinished beam) and never rolled back. It keeps
the family's attributes (``model``, ``device``, ``cached``, ``forward_passes``, ``cache_kind``).
"""
from typing import List

import torch
from torch import Tensor
from torch.nn import Module

from runners.cache_kind import cache_keyword, returned_cache
from runners.device import model_device


class BeamRunner:
    """The model's own dynamic cache, one row per beam: ``start(prompt)`` then ``extend(parents, tokens)``."""

    cache_kind = "dynamic"

    def __init__(self, model: Module):
        self.model = model
        self.device = model_device(model)
        self.cache = None
        self.cached = 0  # positions each row of the cache holds
        self.forward_passes = 0

    def start(self, prompt: List[int]) -> Tensor:
        """Logits ``[1, V]`` after ``prompt`` (one pass; the cache then holds one row)."""
        out = self.model(input_ids=torch.tensor([prompt], device=self.device), use_cache=True)
        self.forward_passes += 1
        self.cache, self.cached = returned_cache(out), len(prompt)
        return out.logits[:, -1]

    def extend(self, parents: List[int], tokens: List[int]) -> Tensor:
        """Logits ``[B, V]`` for ``B = len(tokens)`` beams: row ``j`` of the cache becomes a copy of row
        ``parents[j]`` (``Cache.reorder_cache``), then row ``j`` is fed ``tokens[j]``."""
        self.cache.reorder_cache(torch.tensor(parents, device=self.device))
        last = torch.tensor([[token] for token in tokens], device=self.device)
        out = self.model(input_ids=last, **{cache_keyword(self.model): self.cache}, use_cache=True)
        self.forward_passes += 1
        self.cache, self.cached = returned_cache(out), self.cached + 1
        return out.logits[:, -1]
