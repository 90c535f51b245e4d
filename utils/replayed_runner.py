"""A ``runners.Runner`` without a model: it answers each position with a fixed output's token (and its
fillers below it), so that the passes a drafting row takes are counted alone, with no clock
(``scripts/nasd_replay.py`` on a recorded pair, ``tests/test_nasd_row_default.py`` on a synthetic copy)."""
from types import SimpleNamespace
from typing import Dict, List, Optional

import torch


class ReplayedRunner:
    """Position ``p`` answered with ``ref[p - len(prompt)]`` at logit 11 and its ``fillers`` (by output
    offset; ranked) at 10, 9, ...; every other id at 0. Logits ``[n_last, vocab]`` float32."""

    cache_kind, hidden_layers, hidden, hidden_start = "dynamic", (), None, 0

    def __init__(self, prompt: List[int], ref: List[int], vocab: int, fillers: Optional[Dict[int, List[int]]] = None):
        self.model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=32768))
        self.device, self.cached, self.forward_passes = torch.device("cpu"), 0, 0
        self.prompt, self.ref, self.vocab, self.fillers = prompt, ref, vocab, fillers or {}

    def __call__(self, ids: torch.Tensor, n_last: int = 1) -> torch.Tensor:
        length = ids.shape[1]
        logits = torch.zeros(n_last, self.vocab)
        for row in range(n_last):
            offset = length - n_last + row + 1 - len(self.prompt)  # the output offset this row predicts
            if 0 <= offset < len(self.ref):
                for rank, token in enumerate(self.fillers.get(offset, [self.ref[offset]])):
                    logits[row, token] = 10.0 - rank
                logits[row, self.ref[offset]] = 11.0
        self.cached, self.forward_passes = length, self.forward_passes + 1
        return logits

    def rollback(self, length: int) -> None:
        self.cached = min(self.cached, length)

    def tree_pass(self, ids, cur, nodes, parents):  # chains only: the Runner protocol's other methods
        raise NotImplementedError

    def keep_branch(self, cur, path):
        raise NotImplementedError
