"""What ``model.modules()`` and ``model.parameters()`` find first, without their generators: a pass reads
them (``kernels.c_step.step_for``: the weights' dtype and the kernel plan), and the generators' walk cost
about 50 us each on the embedded model, per pass. The same order (pre-order, children in registration
order, ``None`` entries skipped), so the same answer."""
from typing import Optional, Type

from torch import Tensor
from torch.nn import Module


def first_module(module: Module, kind: Type[Module]) -> Optional[Module]:
    """The first module of exactly type ``kind`` in ``module.modules()``'s order, else None."""
    if type(module) is kind:
        return module
    for child in module._modules.values():
        if child is not None:
            found = first_module(child, kind)
            if found is not None:
                return found
    return None


def first_parameter(module: Module) -> Optional[Tensor]:
    """``next(module.parameters(), None)``."""
    for parameter in module._parameters.values():
        if parameter is not None:
            return parameter
    for child in module._modules.values():
        if child is not None:
            found = first_parameter(child)
            if found is not None:
                return found
    return None
