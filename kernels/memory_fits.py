"""What the machine allows a copy of weights: oneDNN's prepacking available here, and a second copy at most
a quarter of physical memory (``copy_fits``: the one limit every copy of weights is held to)."""
import os
from typing import Dict

import torch
from torch.nn import Module


def can_prepack() -> bool:
    """Whether this torch has oneDNN's linear weight reorder and its prepacked linear."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._reorder_linear_weight and torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):
        return False


def physical_memory() -> int:
    """The machine's physical memory in bytes (0 where it cannot be read)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def copy_fits(size: int) -> bool:
    """Whether a second copy of ``size`` bytes of weights is allowed: at most a quarter of the machine's memory."""
    return 0 < size <= physical_memory() // 4


def prepack_fits(size: int) -> bool:
    """Whether float32 linear layers of ``size`` bytes would be prepacked (``prepackable``'s limits)."""
    return can_prepack() and copy_fits(size)


def readers_of(model: Module) -> Dict[int, int]:
    """How many of ``model``'s modules hold each parameter (by id): a ``PrepackedLinear`` and the own
    layer it wraps count once (the own layer is no submodule once swapped), a tied embedding once more."""
    count: Dict[int, int] = {}
    for module in model.modules():
        for parameter in module._parameters.values():
            if parameter is not None:
                count[id(parameter)] = count.get(id(parameter), 0) + 1
    return count
