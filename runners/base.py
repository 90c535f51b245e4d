"""What every runner is: the interface the decoding loops call (``Runner``).

A runner owns one model and one KV cache for one sequence (batch size 1). The loops keep the
sequence themselves (``ids``, ``[1, L]``); the runner feeds the model only the positions its cache
does not hold yet, and forgets positions on request. Shapes: ``V`` is the vocabulary size, ``N``
the number of nodes of a draft tree.
"""
from typing import List, Optional, Protocol, Tuple, runtime_checkable

import torch
from torch import Tensor
from torch.nn import Module


@runtime_checkable
class Runner(Protocol):
    """A model with its KV cache, as the loops see it (``KVCacheModel``, ``CompiledRunner``)."""

    model: Module  # the model it runs (its modules as they are: prepacked, quantized...)
    device: torch.device  # where its inputs go
    cached: int  # positions the cache holds: ids[:, :cached] need not be fed again
    forward_passes: int  # forward passes run so far (the statistics count them)
    cache_kind: str  # "static" or "dynamic"
    # hidden states: set ``hidden_layers`` (``runners.hidden.check_layers``) and every pass after it
    # also leaves ``hidden`` ``[m, len(hidden_layers) * H]``, the residual stream entering those layers
    # at the ``m`` positions it fed, the first of them at position ``hidden_start`` (a tree pass: the
    # uncached accepted positions, then its nodes in node order); () keeps none
    hidden_layers: Tuple[int, ...]
    hidden: Optional[Tensor]
    hidden_start: int

    def __call__(self, ids: Tensor, n_last: int = 1) -> Tensor:
        """Logits ``[n_last, V]`` of the last ``n_last`` positions of ``ids`` ``[1, L]`` (any device):
        one forward pass over ``ids[:, cached:]``; the cache then holds ``L`` positions.
        Raises ``RuntimeError`` when fewer than ``n_last`` positions are new."""
        ...

    def rollback(self, length: int) -> None:
        """Forget the cached positions ``length`` and after (rejected drafts); a no-op when the
        cache holds no more than ``length``. Never allocates."""
        ...

    def tree_pass(self, ids: Tensor, cur: int, nodes: List[int], parents: List[int]) -> Tensor:
        """Score a draft tree in one pass: ``ids[:, :cur]`` is accepted, ``nodes`` are ``N`` token ids
        and ``parents[i]`` is node ``i``'s parent (-1: the root, else an earlier node). Returns
        logits ``[1 + N, V]``: row 0 after ``ids[0, cur - 1]``, row ``1 + i`` after node ``i``.
        Node ``i``'s keys and values sit at slot ``cur + i`` until ``keep_branch``."""
        ...

    def keep_branch(self, cur: int, path: List[int]) -> None:
        """After ``tree_pass`` at ``cur``: keep positions ``< cur`` and the nodes ``path`` (root to
        leaf), moved to positions ``cur, cur + 1, ...``; the cache then holds ``cur + len(path)``."""
        ...
