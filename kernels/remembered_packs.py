"""A prepacked copy remembered on the model's own linear layer (``kernels.prepacking.prepackable`` makes
and reads it), for a later prepacking of the same layer."""
from typing import Optional

import torch


class _Remembered:
    """A linear layer's prepacked copy, kept on the layer itself while the model runs its own layer
    (``set_prepack(False)``), for a later ``set_prepack(True)``. On the layer, not in a registry keyed
    weakly by it: the copy holds the layer (``linear``), so such a registry's value would hold its own
    key and keep every model a process ever prepacked; here the pair is a cycle that dies with the
    model. Neither copied nor pickled (oneDNN's copy has no storage): a copy prepacks its own."""

    __slots__ = ("layer",)

    def __init__(self, layer: Optional["kernels.prepacking.PrepackedLinear"] = None):
        self.layer = layer

    def __deepcopy__(self, memo: dict) -> "_Remembered":
        return _Remembered()

    def __reduce__(self):
        return (_Remembered, ())


_REMEMBERED = "_specdec_prepacked"  # the own layer's ``__dict__`` entry (not ``Module.__setattr__``: no submodule)


def remembered(own: torch.nn.Linear) -> Optional["kernels.prepacking.PrepackedLinear"]:
    """The prepacked copy kept for the model's own layer ``own`` (made by ``prepackable``), or None."""
    found = own.__dict__.get(_REMEMBERED)
    layer = None if found is None else found.layer
    return layer if layer is not None and layer.linear[0] is own else None  # a shallow copy's entry names another layer
