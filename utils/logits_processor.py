"""Logits -> probabilities (``__call__``) and probabilities -> token (``sample``).

The two halves are kept apart so that verification can compare the target's and the
drafter's *probabilities* and still draw tokens with the same rule. No processor
modifies the caller's logits tensor.
"""
import abc

import torch
from torch import Tensor
from torch.nn import functional as F


def _check_temperature(temperature: float) -> float:
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    return float(temperature)


def _check_top_k(top_k: int) -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}")
    return top_k


def _check_top_p(top_p: float) -> float:
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    return float(top_p)


def _mask_top_k(logits: Tensor, top_k: int) -> Tensor:
    """Keep the ``top_k`` largest logits of the last dimension (ties at the boundary are kept)."""
    top_k = min(top_k, logits.size(-1))
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def _mask_top_p(logits: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most probable tokens whose probability reaches ``top_p``."""
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cumulative = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    remove_sorted = cumulative > top_p
    remove_sorted[..., 1:] = remove_sorted[..., :-1].clone()  # keep the token that crosses top_p
    remove_sorted[..., 0] = False
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


class LogitsProcessor(abc.ABC):
    """Turns logits ``[..., V]`` into probabilities ``[..., V]`` and draws tokens ``[..., 1]`` from them."""

    def __init__(self, temperature: float):
        self.temperature = _check_temperature(temperature)

    def __call__(self, logits: Tensor) -> Tensor:
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()
        return F.softmax(self._process(logits / self.temperature), dim=-1)

    def _process(self, logits: Tensor) -> Tensor:
        """Filter tempered logits (out of place); identity by default."""
        return logits

    @abc.abstractmethod
    def sample(self, probs: Tensor) -> Tensor:
        """Draw one token per row: ``[..., V] -> [..., 1]`` (int64)."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class GreedyProcessor(LogitsProcessor):
    """Greedy: the most probable token. Temperature does not change the choice."""

    def __init__(self, temperature: float = 1):
        super().__init__(temperature)

    def sample(self, probs: Tensor) -> Tensor:
        return torch.argmax(probs, dim=-1, keepdim=True)


class MultinomialProcessor(LogitsProcessor):
    """Random sampling from the tempered distribution."""

    def __init__(self, temperature: float):
        super().__init__(temperature)

    def sample(self, probs: Tensor) -> Tensor:
        flat = probs.reshape(-1, probs.size(-1))
        return torch.multinomial(flat, num_samples=1).reshape(*probs.shape[:-1], 1)


class TopKProcessor(MultinomialProcessor):
    """Sampling among the ``top_k`` most probable tokens."""

    def __init__(self, temperature: float, top_k: int):
        super().__init__(temperature)
        self.top_k = _check_top_k(top_k)

    def _process(self, logits: Tensor) -> Tensor:
        return _mask_top_k(logits, self.top_k)


class NucleusProcessor(MultinomialProcessor):
    """Nucleus (top-p) sampling, applied after the temperature as in transformers."""

    def __init__(self, temperature: float, top_p: float):
        super().__init__(temperature)
        self.top_p = _check_top_p(top_p)

    def _process(self, logits: Tensor) -> Tensor:
        return _mask_top_p(logits, self.top_p)


class TopKNucleusProcessor(MultinomialProcessor):
    """Top-k filtering, then top-p filtering, then sampling."""

    def __init__(self, temperature: float, top_k: int, top_p: float):
        super().__init__(temperature)
        self.top_k = _check_top_k(top_k)
        self.top_p = _check_top_p(top_p)

    def _process(self, logits: Tensor) -> Tensor:
        return _mask_top_p(_mask_top_k(logits, self.top_k), self.top_p)
