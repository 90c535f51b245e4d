"""The C step's RoPE tables kept by a runner (``runners.lean.LeanRunner``): cos and sin ``[T, N, R]`` float32 for
positions ``0..N-1`` (``T`` tables, ``models.layer_spec.ModelSpec.ropes``), made once and grown with the cache, so
that a pass reads its rows instead of computing them: a one-position pass computed its own with about ten small
tensor operations and a stack (about 150 us a token on the embedded model, beside a pass of 20 ms).

The same numbers as a pass's own (``models.llama.rope``): made by that function, over positions in chunks of
``CHUNK``, and every operation in it is elementwise (a product, cos and sin, a scaling: a value depends on its own
position only, not on the tensor that holds it), which the pass-width invariance already rests on. Made again
when the model's inverse frequencies or scalings change (another tensor, an in-place edit, a cast)."""
from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from models.layer_spec import ModelSpec
from models.llama import rope

CHUNK = 256  # positions a making computes at once (the width of a long pass's own tables)


class RopeTable:
    """``at(positions, start)``: cos and sin ``[T, r, R]`` float32 of ``model`` at ``positions`` ``[r]`` (CPU)."""

    def __init__(self, model: Module, spec: ModelSpec):
        self.model, self.spec = model, spec
        self.names = [(f"{p}inv_freq", f"{p}attention_scaling") for p in spec.ropes]  # each table's buffer and scaling
        self.sources: List[Tuple[Tensor, int, float]] = []  # each table's inv_freq, its version, its scaling
        self.cos = self.sin = torch.empty(0)
        self.length = 0
        self.bases: Optional[Tuple[int, int, int]] = None  # one table's cos and sin addresses and a row's bytes (``row``)

    def _current(self) -> List[Tuple[Tensor, int, float]]:
        rotary = self.model._modules["model"]._modules["rotary_emb"]  # module dicts read directly: a pass reads them
        found = []
        for frequencies, scaling in self.names:
            inv_freq = rotary._buffers.get(frequencies)
            inv_freq = getattr(rotary, frequencies) if inv_freq is None else inv_freq  # a buffer, where transformers made one
            found.append((inv_freq, inv_freq._version, getattr(rotary, scaling)))
        return found

    def _grow(self, length: int) -> None:
        """Rows for positions ``self.length..length - 1`` appended (one allocation per growth)."""
        made: List[List[Tensor]] = [[], []]
        for a in range(self.length, length, CHUNK):
            positions = torch.arange(a, min(a + CHUNK, length))
            tables = [rope(positions, inv_freq, scaling, torch.float32) for inv_freq, _, scaling in self.sources]
            for k in (0, 1):  # [T, n, R]
                made[k].append(torch.stack([table[k][0, 0] for table in tables]))
        self.cos, self.sin = (torch.cat([old] + parts, dim=1) if self.length else torch.cat(parts, dim=1)
                              for old, parts in zip((self.cos, self.sin), made))
        self.length = length
        one = self.cos.shape[0] == 1  # one table: a position's row is contiguous (``row``)
        self.bases = (self.cos.data_ptr(), self.sin.data_ptr(), self.cos.stride(1) * self.cos.element_size()) if one else None

    def _fresh(self, end: int, capacity: int) -> None:
        """The tables made again where the model's RoPE changed, grown to ``max(end, capacity)`` where short of ``end``."""
        current = self._current()
        if len(current) != len(self.sources) or any(a is not b or v != w or s != t for (a, v, s), (b, w, t) in zip(current, self.sources)):
            self.sources, self.length = current, 0  # remade from position 0
        if end > self.length:
            self._grow(max(end, capacity))

    def at(self, positions: Tensor, start: Optional[int] = None, capacity: int = 0) -> Tuple[Tensor, Tensor]:
        """cos and sin ``[T, r, R]`` at ``positions``; ``start``: they are ``start..start + r - 1`` (a chain pass,
        read as a view), else gathered (a tree pass). The table grows to ``capacity`` positions at least."""
        end = start + positions.shape[0] if start is not None else int(positions.max()) + 1
        self._fresh(end, capacity)
        if start is not None:
            return self.cos[:, start:end], self.sin[:, start:end]
        return self.cos.index_select(1, positions), self.sin.index_select(1, positions)

    def row(self, position: int, capacity: int = 0, count: int = 1) -> Optional[Tuple[int, int]]:
        """The addresses of cos and sin ``[1, count, R]`` from ``position`` where the model has one table (``T`` 1: those
        rows are contiguous in it), read as ``at`` reads them (made again where changed, grown to ``position +
        count``): no tensor made. None where it has more tables (their rows at a position lie ``N R`` apart)."""
        self._fresh(position + count, capacity)
        if self.bases is None:
            return None
        cos, sin, step = self.bases
        return cos + position * step, sin + position * step
