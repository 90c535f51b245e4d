"""Part of an output layer's rows, blocked as the C step reads them (``kernels.c_step``: ``head=``), for a drafter
model: FR-Spec's frequency-ranked draft vocabulary (Zhao et al. 2025, arXiv 2502.14856). A drafter's pass reads
its whole output layer, 151,936 x 896 on the Qwen2.5 0.5B, over a quarter of its bytes; computing the logits of
the most frequent tokens alone reads a fraction of them. BPE ids are roughly in merge order, most frequent
first, so the first ``count`` ids stand for the most frequent; every token the runner is fed (the prompt, the
output so far) and the model's end tokens are added as they come (``add``), up to ``ROOM`` of them.

The rows are copied once: the first ``count`` rows are the first ``count / 16`` blocks of the full blocked copy,
one contiguous slice; each added token's row is copied into the lanes after them. Only a drafter reads them: its
logits outside the rows are minus infinity (``full``), so its distribution is zero there, and a draft is drawn
from the distribution the loop is told (speculative sampling stays exact; greedy compares tokens).
"""
import math
import time
import weakref
from typing import Iterable, Optional

import torch
from torch import Tensor

import kernels.once as once
from kernels.blocked import BLOCK, _ByTensor, _memory, lasting

NUMPY = (torch.float32, torch.float64)  # the logits' dtypes ``full`` writes with numpy (the C step's: float32)
ROOM = 8192  # tokens past the first ``count`` a drafter's rows take at most (a long prompt's distinct ones): 14 MB at 896 bfloat16 features


def rows_words(count: int, vocab: int) -> str:
    """The header's words for ``count`` of ``vocab`` rows: "drafter head: 32,768 of 151,936 tokens (the most
    frequent, and the prompt's and output's)"."""
    return f"drafter head: {min(count, vocab):,} of {vocab:,} tokens (the most frequent, and the prompt's and output's)"


class HeadRows:
    """The rows of ``source`` (a blocked output layer ``[ceil(V/16), H, 16]``, float32 or bfloat16) for ids
    ``0..count-1`` then for the ids ``add`` is given, blocked alike in ``blocks`` ``[ceil((count + ROOM)/16), H, 16]``.
    ``ids`` ``[len]``: the token of each row held; ``rows``: the rows a pass computes (``len`` rounded up to 16:
    the lanes past ``len`` hold zeros or a reset's stale rows, never read back). ``owner``: the runner whose
    tokens the added rows are (``take``)."""

    def __init__(self, source: Tensor, vocab: int, count: int):
        started = time.perf_counter()
        # weakly: kept by ``source`` (``kept_rows``), a strong reference would keep it, and its model's output layer, forever
        self.source, self.vocab = weakref.ref(source), vocab
        self.count = min(vocab, max(BLOCK, count // BLOCK * BLOCK))  # whole blocks: the prefix is a slice of them
        self.identity = (source.data_ptr(), source._version)
        room = min(ROOM, vocab - self.count)
        self.capacity, self.length = self.count + room, self.count
        with lasting():  # written in place later, in or out of inference mode
            self.blocks = torch.zeros((-(-self.capacity // BLOCK), *source.shape[1:]), dtype=source.dtype)
            self.blocks[: self.count // BLOCK].copy_(source[: self.count // BLOCK])
            self.ids = torch.arange(self.capacity)
            self.held = torch.zeros(vocab, dtype=torch.bool)
            self.held[: self.count] = True
        self.owner: Optional["weakref.ref"] = None
        once.note("drafter rows", f"{self.count:,} of {vocab:,} rows copied", started)

    @property
    def rows(self) -> int:
        return -(-self.length // BLOCK) * BLOCK

    def take(self, owner: object, tokens: Iterable[int]) -> None:
        """Hand the added rows to ``owner``: the earlier owner's go, ``tokens`` are added."""
        self.held[self.ids[self.count : self.length]] = False
        self.length, self.owner = self.count, weakref.ref(owner)
        self.add(tokens)

    def owned_by(self, owner: object) -> bool:
        return self.owner is not None and self.owner() is owner

    def add(self, tokens: Iterable[int]) -> None:
        """Rows for those of ``tokens`` not held yet (ids in ``0..V-1``; past ``capacity``, none)."""
        ids = torch.as_tensor(list(tokens), dtype=torch.long).unique()
        ids = ids[(ids >= 0) & (ids < self.vocab)]
        ids = ids[~self.held[ids]][: self.capacity - self.length]
        source = self.source()
        if ids.numel() == 0 or source is None:
            return
        at = torch.arange(self.length, self.length + ids.numel())
        pairs = source.dtype == torch.bfloat16  # a row: lane n % 16 of block n // 16 (``kernels.blocked``)
        _memory(self.blocks, pairs)[at // BLOCK, :, at % BLOCK] = _memory(source, pairs)[ids // BLOCK, :, ids % BLOCK]
        self.ids[at], self.held[ids] = ids, True
        self.length += ids.numel()

    def full(self, logits: Tensor, out: Optional[Tensor] = None) -> Tensor:
        """``logits`` ``[n, rows]`` of these rows -> ``[n, V]``: theirs at their ids, minus infinity elsewhere.
        Written into ``out`` (``[n, V]`` in ``logits``' dtype: a runner's buffer, reused pass after pass, so a
        drafter's pass allocates no ``[n, V]`` tensor; ``wide_buffer``), else into a new tensor."""
        if out is None:
            out = torch.empty((logits.shape[0], self.vocab), dtype=logits.dtype)
        if logits.device.type == "cpu" and logits.dtype in NUMPY and out.dtype == logits.dtype:
            # numpy's copies, on this thread: torch's fill of [n, V] is an intra-op parallel region, whose threads wait
            # for a core on a busy machine (scripts/pair_split.py: ms a drafter pass); the same values either way
            wide, part = out.numpy(), logits.numpy()
            wide.fill(-math.inf)
            wide[:, : self.count] = part[:, : self.count]
            if self.length > self.count:
                wide[:, self.ids[self.count : self.length].numpy()] = part[:, self.count : self.length]
            return out
        out.fill_(float("-inf"))  # every lane: the rows held may differ from the last pass's (``take``)
        out[:, : self.count] = logits[:, : self.count]  # the first rows are ids 0..count-1: a slice (an index of 32,768: 4x its time)
        if self.length > self.count:
            out[:, self.ids[self.count : self.length]] = logits[:, self.count : self.length]
        return out


def wide_buffer(buffer: Optional[Tensor], n: int, vocab: int, dtype: torch.dtype) -> Tensor:
    """``buffer`` if it holds ``[>= n, vocab]`` in ``dtype``, else a new one of ``n`` rows (made with ``lasting``:
    written in place in or out of inference mode). A runner keeps it and hands ``[:n]`` to ``HeadRows.full``: the
    logits it returns are then valid until its next pass (its drafter reads each pass's before the next)."""
    if buffer is not None and buffer.shape[0] >= n and buffer.shape[1] == vocab and buffer.dtype == dtype:
        return buffer
    with lasting():
        return torch.empty((n, vocab), dtype=dtype)


_KEPT = _ByTensor()  # a model's blocked output layer -> {count: its HeadRows}


def kept_rows(source: Tensor, vocab: int, count: int) -> HeadRows:
    """The ``HeadRows`` of ``source``'s first ``count`` ids: kept while ``source`` is unchanged (address and
    version), one per count asked, so a generation's runner copies no rows but its own tokens'."""
    counts = _KEPT.get(source)
    if counts is None:
        counts = _KEPT[source] = {}
    wanted = min(vocab, max(BLOCK, count // BLOCK * BLOCK))
    found = counts.get(wanted)
    if found is None or found.identity != (source.data_ptr(), source._version) or found.vocab != vocab:
        found = counts[wanted] = HeadRows(source, vocab, count)
    return found


__all__ = ["HeadRows", "ROOM", "kept_rows", "rows_words", "wide_buffer"]
