"""The C step kept for each model (``kernels.step_pool`` makes and checks it), held weakly on the model:
apart, so that what only lets go of a step (a restore of the layers, a switch of kernels) imports nothing
of the step's."""
import weakref
from typing import Optional

from torch.nn import Module

_STEPS: "weakref.WeakKeyDictionary[Module, object]" = weakref.WeakKeyDictionary()  # model -> step_pool._Kept


def kept_step(model: Module) -> Optional[object]:
    """The step kept for ``model`` (None: none), as it is: for the tests and ``drop`` callers."""
    kept = _STEPS.get(model)
    return None if kept is None else kept.step


def forget_step(model: Optional[Module]) -> None:
    """Let go of ``model``'s kept step (a switch of its kernels, a restore of its layers)."""
    if model is not None:
        _STEPS.pop(model, None)


__all__ = ["forget_step", "kept_step"]
