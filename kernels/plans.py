"""A model's kernel plan as a whole (``kernels.prepacking.plan``): switched for a block (``kernels``),
the weights' copies a plan no longer uses freed (``drop_blocked_copies``, ``drop_packed_copies``), and
plans named and read back from their names (``plan_label``, ``label_plan``)."""
import contextlib
from typing import Optional, Sequence, Tuple

import torch
from torch.nn import Module

from kernels.prepacking import OWN, PREPACKED, SKINNY, PrepackedLinear, plan, set_prepack


@contextlib.contextmanager
def kernels(model: Module, prepack: bool | Tuple[str, ...] | None):
    """``model`` for the block with its linear layers prepacked (True), its own (False: the route
    ``(OWN,)``, so that no pass runs the C step either), on a route by pass width (a tuple,
    ``set_prepack``'s), or as they are (None); then as before."""
    if prepack is None:
        yield model
        return
    wanted = (PREPACKED,) if prepack is True else (OWN,) if prepack is False else prepack
    before = plan(model)
    if before != wanted:
        set_prepack(model, True, wanted)
    try:
        yield model
    finally:
        if plan(model) != before:
            if before is None:
                set_prepack(model, False)
            else:
                set_prepack(model, True, before)


def drop_blocked_copies(model: Module) -> None:
    """Free the skinny kernel's blocked copies of the model's float32 linear weights (``kernels.blocked``):
    first those made beside an own weight (the output layer's, the C step's), then the released
    layers' own weights given back (unblocked), each fused group freed once its last layer has its own."""
    from kernels.blocked import forget
    from kernels.kept_steps import forget_step

    forget_step(model)  # its kept C step holds the output layer's blocked copy
    linears = [m for m in model.modules() if type(m) in (torch.nn.Linear, PrepackedLinear)]
    # the own Parameters, never ``weight``: a parked layer's would unpack a temporary of every layer at once
    forget([m._parameters["weight"] for m in linears if getattr(m, "blocks", None) is None and m._parameters.get("weight") is not None])
    for layer in linears:
        if type(layer) is PrepackedLinear:
            layer.restore()


def drop_packed_copies(model: Module) -> None:
    """Free oneDNN's copies of the weights of the model's ``PrepackedLinear`` layers (a route that no
    longer uses them); a route that asks again makes them again."""
    for layer in model.modules():
        if type(layer) is PrepackedLinear:
            layer.unpark()  # a parked weight's one copy is oneDNN's: unpacked first
            layer.packed = layer.packed_bias = None


def plan_label(route: Optional[Sequence[str]]) -> str:
    """The name of a kernel plan (``kernels.prepacking.plan``): one option when the route names one
    (None: "own"), else the widths of each, e.g. "own at 1-2, prepacked at 3+ positions"."""
    if route is None:
        return OWN
    if len(set(route)) == 1:
        return route[0]
    ranges, start = [], 1
    for width in range(2, len(route) + 2):
        if width > len(route) or route[width - 1] != route[start - 1]:
            ranges.append(f"{route[start - 1]} at {start}" + ("+" if width > len(route) else f"-{width - 1}" if width - 1 > start else ""))
            start = width
    return ", ".join(ranges) + " positions"


def label_plan(label: str) -> bool | Tuple[str, ...]:
    """The plan ``plan_label`` named, as ``runners.kernels`` takes it (False: the model's own layers)."""
    if label == OWN:
        return False
    if label in (OWN, PREPACKED, SKINNY):
        return (label,)
    route = []
    for part in label.removesuffix(" positions").split(", "):
        name, _, widths = part.partition(" at ")
        first, _, last = widths.rstrip("+").partition("-")
        route += [name] * (int(last or first) - int(first) + 1)
    return tuple(route)
