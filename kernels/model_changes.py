"""One process-wide count of the changes that can make a C step's copies and addresses stale: a cast, move, load
or restore of a prepacked layer (``kernels.prepacking`` counts those), and any module, parameter or buffer set on
a module in place of another. A step compares the count at each pass (``kernels.c_step.CStep.current``) and reads
its model again only where it moved: about a microsecond a pass instead of a walk of every weight."""
import torch
from torch.nn import Module

_CHANGES = 0  # changes so far, in any model (``changes``)


def changes() -> int:
    """How many changes this process has made to any model a C step may read (see the module's docstring)."""
    return _CHANGES


def changed() -> None:
    global _CHANGES
    _CHANGES += 1


def _replaced(table: str):
    """A registration hook that counts a change where ``name`` replaces what a module had under it."""
    def hook(module: Module, name: str, _value) -> None:
        if name in module.__dict__.get(table, ()):
            changed()
    return hook


# A module, parameter or buffer set on any module in place of another (``layer.mlp = MLP(...)``, ``norm.weight =
# Parameter(...)``) is a change: a runner held across it reads its model again at its next pass (never the copies
# and addresses of what was replaced). Torch calls these hooks from ``Module.__setattr__`` and ``register_*``
# before it stores the value; a hook that returns None changes nothing. A new name is none: a step reads only
# what its model had when it was made, and transformers' forward builds a new ``ModuleList`` of the layers at
# every pass (``self.layers[:n]``), which would otherwise make every step read its model again.
torch.nn.modules.module.register_module_module_registration_hook(_replaced("_modules"))
torch.nn.modules.module.register_module_parameter_registration_hook(_replaced("_parameters"))
torch.nn.modules.module.register_module_buffer_registration_hook(_replaced("_buffers"))
