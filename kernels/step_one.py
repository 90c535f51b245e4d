"""A C step's chain pass of 1..``MANY_ROWS`` positions with its call made ready once (``OnePass``): decoding's
pass, the one a token of target AR pays, and a drafting row's verification pass (2..12 positions, since
2026-12-01), where the host side of ``CStep.__call__`` (tensor casts and slices, a chunk plan, a scratch size,
nineteen ctypes objects built) was about as long as a tenth of a bfloat16 pass on a cold cache.

The same C call with the same arguments as ``CStep.__call__`` over ``rows`` <= ``MANY_ROWS`` positions without a mask,
a drafter's rows too since 2026-12-01 (one chunk: a prompt plan's chunks are longer than ``MANY_ROWS``; ``tile`` 0: up to
``kernels.bf16.decoding_rows`` >= ``MANY_ROWS`` rows run decoding's loop), the logits of the last ``asked`` rows with
their tops, and the hidden states a learned head reads where asked (``layers``: an EAGLE row's every pass keeps
them), so the same bits. Never stale: each pass asks the step for its currency first (``CStep.current``: a changed model
remakes it, and then this call's pointers are taken again), binds the cache as every pass does
(``CStep.bind``: a regrown or another cache, the kept key blocks), and sizes the scratch by the cache's
capacity and the thread count it runs with."""
import ctypes
import weakref
from typing import Optional, Tuple

import torch
from torch import Tensor

import kernels.step_scratch as step_scratch
from kernels.kept_keys import passed
from kernels.prompt_gemm import MANY_ROWS
from kernels.step_structs import Top
from utils.logits_processor import with_tops

_P, _I = ctypes.c_void_p, ctypes.c_int64
# c_step.c's c_step: layers, dims, h, cos, sin, r, start, seen, window, hidden_at, n_hidden, hidden, final_norm,
# head, V, logits, n_last, scratch, threads (declared here: ctypes converts plain ints, no objects made a pass)
ARGTYPES = [_P, _P, _P, _P, _P, _I, _I, _P, _P, _P, _I, _P, _P, _P, _I, _P, _I, _P, _I]


class OnePass:
    """``one(h, rope, cache, start, layers, hidden, rows, asked)``: logits ``[asked, V]`` (each row's greedy token
    kept on them, ``with_tops``; ``drafted``: a drafter's rows', none kept) of the last ``asked`` of ``rows``
    positions (1..``MANY_ROWS``) whose float32 embeddings lie at address ``h`` (``[rows, H]``, overwritten) and
    their RoPE rows at ``rope``'s two addresses, cos and sin (``[T, rows, R]`` float32, contiguous), their keys and
    values written at slots ``start..start + rows - 1`` of ``cache``; with ``layers`` (int64 ``[n]``,
    ``CStep.__call__``'s ``at``) and ``hidden`` (float32 ``[rows, n * H]``), the residual stream entering those
    layers written into ``hidden``, as the full pass writes it. Positional arguments only: tests count its calls
    through a wrapper that passes ``*args``."""

    def __init__(self, step):
        # weakly: this object is kept on the step (``one_pass``), and a cycle would keep the step's blocked weights
        # alive after its model lets it go, until a garbage collection (a first start's kernel measurement held 4x)
        self._step = weakref.ref(step)
        self.structs = None  # the step's structs this call was made ready for (a remade step has new ones)
        self.sized: Tuple[int, int] = (-1, -1)  # (capacity, threads) the scratch was sized for
        self.rows = 0  # and the most rows (``c_step_scratch`` grows with them)
        self.tops = (Top * MANY_ROWS)()
        self.tops_at = ctypes.addressof(self.tops)

    @property
    def step(self):
        """The step this call is kept on (its caller holds it while it runs)."""
        return self._step()

    def _ready(self) -> None:
        step = self.step
        self.call = step.library["c_step"]  # a function object of its own: its argtypes set here alone
        self.call.argtypes, self.call.restype = ARGTYPES, ctypes.c_int
        self.structs, self.dims = step.structs, ctypes.byref(step.dims)
        self.fixed = (step.final_norm.data_ptr(), step.head.data_ptr(), step.vocab)
        self.hidden_at = torch.empty(0, dtype=torch.int64)  # read by no one (count 0)
        self.sized = (-1, -1)

    def one(self, h: int, rope: Tuple[int, int], cache, start: int, layers: Optional[Tensor] = None,
            hidden: Optional[Tensor] = None, rows: int = 1, asked: int = 1) -> Tensor:
        logits = self._pass(h, rope, cache, start, (layers, hidden), rows, asked, None)
        tops = self.tops
        return with_tops(logits, [(tops[i].at, tops[i].top, tops[i].others) for i in range(asked)])

    def drafted(self, h: int, rope: Tuple[int, int], cache, start: int, rows: int, asked: int, head) -> Tensor:
        """``one``'s pass over a drafter's rows ``head`` (``kernels.head_rows.HeadRows``, the first blocks of their
        copy, as ``CStep.__call__`` reads them): their logits ``[asked, head.rows]``, no tops kept."""
        return self._pass(h, rope, cache, start, (None, None), rows, asked, head)

    def _pass(self, h: int, rope: Tuple[int, int], cache, start: int, states: tuple, rows: int, asked: int, head) -> Tensor:
        """The C call of ``one`` (``states``: its ``layers`` and ``hidden``) or of ``drafted`` (``head``); the logits."""
        if not 1 <= asked <= rows <= MANY_ROWS:  # more rows: a chunk plan, a many-row variant (``CStep.__call__``)
            raise ValueError(f"a decided pass runs 1..{MANY_ROWS} positions and asks 1..rows logits, not {asked} of {rows}")
        layers, hidden = states
        step = self.step  # alive: the caller holds it
        step.current()
        if step.structs is not self.structs:
            self._ready()
        state = step.bind(cache)
        d, threads = step.dims, torch.get_num_threads()
        if self.sized != (d.cap, threads):
            self.sized, self.rows = (d.cap, threads), 0
        if rows > self.rows:  # the scratch this many positions need at this capacity
            needed = step.library.c_step_scratch(self.dims, _I(rows), _I(threads))
            if step.scratch.numel() < needed:
                step_scratch.grow(step, needed, f"a pass of {rows} positions")
            self.rows = rows
        final_norm, output, vocab = self.fixed
        if head is not None:
            output, vocab = head.blocks.data_ptr(), head.rows
        logits = torch.empty((asked, vocab))  # returned: the caller may keep it past the next pass
        d.tile, d.kept, d.tops = 0, 0 if state is None else state.upto, self.tops_at if head is None else None
        at = self.hidden_at if hidden is None else layers
        self.call(self.structs, self.dims, h, rope[0], rope[1], rows, start, None, None, at.data_ptr(), at.numel(),
                  None if hidden is None else hidden.data_ptr(), final_norm, output, vocab, logits.data_ptr(), asked,
                  step.scratch.data_ptr(), threads)
        d.tops = None
        passed(cache, state, start + rows)
        return logits


def one_pass(step) -> Optional[OnePass]:
    """``step``'s ``OnePass``, made at its first ask and kept on it (None: no step)."""
    if not step:
        return None
    found = step.__dict__.get("one_pass")
    if found is None:
        found = step.__dict__["one_pass"] = OnePass(step)
    return found


__all__ = ["OnePass", "one_pass"]
