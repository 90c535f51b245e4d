"""A C step's scratch (``kernels.c_step.CStep.scratch``, float32): grown to the largest pass yet, never per pass, and
reserved before a timed run (``app.steps.reserve_scratch``) so that none grows it (``kernels.once`` logs each growth)."""
import ctypes
import time

import torch

import kernels.once as once


def grow(step, floats: int, why: str, touch: bool = False, whose: str = "C step") -> None:
    """``step``'s scratch (a C step's, or ``whose`` else: the C head step's) grown to ``floats`` float32 (``touch``:
    written once, its pages taken now rather than in the next pass), noted as one-time work."""
    started = time.perf_counter()
    step.scratch = torch.zeros(floats) if touch else torch.empty(floats)
    once.note("scratch", f"{whose} scratch grown to {floats * 4 / 2**20:.1f} MB for {why}", started)


def reserve(step, rows: int, capacity: int, chunk: int) -> None:
    """Grow ``step``'s scratch (a ``CStep``) to what a pass of up to ``rows`` positions (a longer one runs in chunks of
    ``chunk``: its model's ``kernels.prompt_gemm.plan_of``) needs over a cache of ``capacity`` slots
    (``c_step_scratch`` grows with both), so that no later pass grows it."""
    dims = step.dims
    cap, dims.cap = dims.cap, capacity
    try:
        needed = step.library.c_step_scratch(ctypes.byref(dims), ctypes.c_int64(min(rows, chunk)), ctypes.c_int64(torch.get_num_threads()))
    finally:
        dims.cap = cap  # ``CStep.bind`` points the step at a cache by its capacity: left as it was
    if step.scratch.numel() < needed:
        grow(step, needed, f"passes of up to {rows} positions over {capacity} slots", touch=True)
