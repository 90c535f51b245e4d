"""Logits -> probabilities (``__call__``) and probabilities -> token (``sample``).

The two halves are kept apart so that verification can compare the target's and the
drafter's *probabilities* and still draw tokens with the same rule. No processor
modifies the caller's logits tensor. ``choose`` is the two in one, for a caller that needs
no probabilities (target AR, a greedy loop's verification): the same tokens, and greedy's skips the
softmax where it can.
"""
import abc
import math
from typing import List, Optional, Tuple

import numpy as np
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

    def choose(self, logits: Tensor) -> Tensor:
        """Logits ``[..., V]`` -> tokens ``[..., 1]`` (int64): ``sample(self(logits))``, the same draws."""
        return self.sample(self(logits))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class GreedyProcessor(LogitsProcessor):
    """Greedy: the most probable token. Temperature does not change the choice."""

    def __init__(self, temperature: float = 1):
        super().__init__(temperature)

    def sample(self, probs: Tensor) -> Tensor:
        return torch.argmax(probs, dim=-1, keepdim=True)

    def choose(self, logits: Tensor) -> Tensor:
        """The tokens ``sample(self(logits))`` gives, from the logits where that is sure (``clear_argmax``: CPU
        rows whose largest logit stands clear of the rest, each row; a verification pass's ``k + 1`` rows too),
        else through the probabilities of every row (one row unclear: the softmax decides, as it always did)."""
        if self._plain() and logits.dim() > 0 and logits.shape[-1] > 0:
            if row_tops(logits) is not None:  # where the pass that made them read each row's largest (the C step)
                tokens = self.clear_tokens(logits)
                return self.sample(self(logits)) if tokens is None else torch.tensor(tokens).reshape(*logits.shape[:-1], 1)
            rows = logits.reshape(-1, logits.shape[-1])
            tokens = [clear_argmax(rows[r : r + 1], self.temperature) for r in range(rows.shape[0])]
            if tokens and all(t is not None for t in tokens):
                return torch.cat(tokens).reshape(*logits.shape[:-1], 1)
        return self.sample(self(logits))

    def _plain(self) -> bool:
        """Whether this is greedy's own rule (a subclass's own ``__call__``, ``_process`` or ``sample`` goes its own way)."""
        return (type(self).__call__ is LogitsProcessor.__call__ and type(self)._process is LogitsProcessor._process
                and type(self).sample is GreedyProcessor.sample)

    def clear_tokens(self, logits: Tensor) -> Optional[List[int]]:
        """``choose(logits)``'s tokens as ints, read from the row tops the pass kept on ``logits`` (``row_tops``), where
        they hold and every row's largest stands clear (``clear_token``); else None (``choose`` decides): a decoding
        loop's token without a tensor made and read back."""
        tops = row_tops(logits)
        if tops is None or not self._plain():
            return None
        tokens = [clear_token(*top, self.temperature, logits.dtype) for top in tops]
        return None if None in tokens else tokens


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


# How far (relative, in tempered logits) the largest logit must stand above every other for its index
# to be, for sure, the one argmax of the float32 softmax picks. Not 0: the softmax rounds (exp near 1 in
# steps of 2**-24, torch's vectorized exp within ~20 units in the last place, a product by 1/sum), so
# logits a few units in the last place apart can get equal probabilities, and argmax then takes the
# first of them: logits [0.1, 0.1 + 2**-27] give probabilities [0.5, 0.5] and token 0, their argmax 1.
# 2**-13 (about 1.2e-4) is over a thousand of those units: e_j <= exp(-1.2e-4) < 1 = e_max, whatever the rounding.
CLEAR = 2.0 ** -13


def clear_argmax(logits: Tensor, temperature: float = 1.0) -> Optional[Tensor]:
    """``argmax(softmax(logits / temperature))`` as ``[..., 1]`` (int64) for one row ``[..., V]`` of float32
    or float64 logits on CPU whose largest value is finite (tempered too) and above every other by ``CLEAR`` relative to
    ``max(1, |largest| / temperature)``: then no rounding of the softmax can tie or pass it, and the token
    is the logits' own argmax. Else None (a near tie, a NaN or an infinity, more rows, another dtype or
    device: the caller goes through the probabilities). Two vectorized reads of the row (numpy's argmax
    and max), no softmax, no allocation of the row's size."""
    if logits.device.type != "cpu" or logits.dtype not in (torch.float32, torch.float64) or logits.numel() != logits.shape[-1]:
        return None
    row = logits.detach().reshape(-1).numpy()  # a view (a row is contiguous)
    at = int(row.argmax())  # the first largest; a NaN's index where there is one (as torch.argmax)
    top = float(row[at])
    if not math.isfinite(top):
        return None  # NaN or infinite: the softmax's NaNs decide
    # the largest of the others: before ``at`` every value is below ``top``, after it at most ``top``
    others = max(float(row[:at].max()) if at else -math.inf, float(row[at + 1:].max()) if at + 1 < row.size else -math.inf)
    token = clear_token(at, top, others, temperature, logits.dtype)
    return None if token is None else torch.full((*logits.shape[:-1], 1), token, dtype=torch.int64)


def clear_token(at: int, top: float, others: float, temperature: float, dtype: torch.dtype) -> Optional[int]:
    """``at`` where a row's largest logit ``top`` (at index ``at``, the first largest) stands clear of the largest
    of the others, ``others``, as ``clear_argmax`` asks; else None (NaN, infinite once tempered, a near tie)."""
    if not math.isfinite(top) or abs(top) / temperature >= torch.finfo(dtype).max / 2:
        return None  # NaN, infinite, or infinite once tempered: the softmax's NaNs decide
    if not (top - others) / temperature >= CLEAR * max(1.0, abs(top) / temperature):
        return None  # a near tie (or an exact one, or NaN among the others): the softmax decides, as it always did
    return at


# ``clear_ranks``: how far below a row's largest tempered logit the last ranked one may be. exp(-SPAN) / V stays a normal
# float32 for any vocabulary below e^27 (about 5e11): no two ranked probabilities underflow to the same value.
SPAN = 60.0


def clear_ranks(values: List[float], temperature: float, dtype: torch.dtype) -> bool:
    """Whether a row's ``m + 1`` largest logits ``values`` (descending, as ``topk`` gives them) keep that order strictly in
    ``softmax(row / temperature)`` whatever its rounding, so that the probabilities' ``topk(m)`` gives the logits' first
    ``m`` indices in the same order: all finite, each above the next by ``CLEAR`` relative to the largest magnitude among
    them (``clear_token``'s margin, pair by pair), the last within ``SPAN`` of the first."""
    if not values or not all(math.isfinite(v) for v in values) or max(abs(values[0]), abs(values[-1])) / temperature >= torch.finfo(dtype).max / 2:
        return False
    margin = CLEAR * max(1.0, abs(values[0]) / temperature, abs(values[-1]) / temperature)
    return (values[0] - values[-1]) / temperature <= SPAN and all((a - b) / temperature >= margin for a, b in zip(values, values[1:]))


BLOCK = 64  # ``largest``: a row's values read as blocks of this many, their maxima first


def largest(logits: Tensor, count: int) -> Tuple[Tensor, Tensor]:
    """``logits.topk(count, dim=-1)``'s values ``[n, count]``, and its indices wherever a row's ``count`` largest values
    are finite, distinct and above the rest (where two tie, the indices may be either's). On CPU float rows, in numpy:
    a row of ``V`` read as ``BLOCK`` stripes of ``V / BLOCK``, each column's maximum taken down the stripes (a
    vectorized max), and the row's ``count`` largest values sought in the ``count`` columns of the largest maxima,
    which hold them (a value outside them is below ``count`` column maxima). 49,152-wide rows, one thread, noisy: one
    row 83 against torch's 123 us, five 188 against 429, and no torch reduction that wide (it wakes the thread team
    the C step uses)."""
    n, width = logits.shape
    columns = width // BLOCK
    if logits.device.type != "cpu" or logits.dtype not in (torch.float32, torch.float64) or width % BLOCK or columns < 4 * count:
        return logits.topk(count, dim=-1)
    tiled = logits.detach().numpy().reshape(n, BLOCK, columns)  # a view of contiguous rows (else a copy)
    chosen = np.argpartition(tiled.max(axis=1), columns - count, axis=1)[:, columns - count :]  # [n, count], unordered
    held = np.take_along_axis(tiled, chosen[:, None, :], axis=2).reshape(n, BLOCK * count)  # [n, stripe * count + c]
    order = np.argsort(-held, axis=1, kind="stable")[:, :count]  # descending
    indices = (order // count) * columns + np.take_along_axis(chosen, order % count, axis=1)
    return torch.from_numpy(np.take_along_axis(held, order, axis=1)), torch.from_numpy(indices)


class RowTops(list):
    """Each row's ``(at, top, others)`` of logits ``[n, V]`` float32 on CPU, read by the code that wrote them (the C
    step, ``kernels.logits_top.h``: ``at`` the index torch.argmax gives, ``top`` its value, ``others`` the largest of
    the rest): kept on the logits tensor (``with_tops``) at its version then, so that ``GreedyProcessor.choose``
    reads three numbers a row instead of the row. A tensor written through torch since (its version moved) has none
    (a write through another view of its memory, numpy's, counts no version: the logits a pass returns are its own)."""

    def __init__(self, logits: Tensor, tops: list):
        super().__init__(tops)
        self.version = logits._version


def with_tops(logits: Tensor, tops: list) -> Tensor:
    """``logits`` ``[n, V]`` with its rows' ``(at, top, others)`` kept on it (``RowTops``); none on an inference
    tensor (made under ``torch.inference_mode``: it counts no writes, so nothing could tell the tops stale)."""
    if not logits.is_inference():
        logits.row_tops = RowTops(logits, tops)
    return logits


def first_rows(logits: Tensor, n: int) -> Tensor:
    """``logits[:n]``, with the tops of those rows where ``logits`` holds them (a view: it shares their version)."""
    if n >= logits.shape[0]:  # every row (a pass of the step's own width): the tensor itself, no view made
        return logits
    tops, rows = row_tops(logits), logits[:n]
    return rows if tops is None else with_tops(rows, tops[:n])


def row_tops(logits: Tensor) -> Optional[RowTops]:
    """The rows' tops kept on ``logits`` where they still hold (the same tensor, unwritten through torch since,
    one per row), else None."""
    tops = getattr(logits, "row_tops", None)
    if tops is None or tops.version != logits._version or logits.dim() != 2 or len(tops) != logits.shape[0]:
        return None
    return tops
