"""Prepacked linear layers: a float32 CPU ``nn.Linear`` computed by oneDNN from a weight reordered
once, made the model's own module (``set_prepack``) so that every caller runs the same kernel."""
import contextlib
import copy
import os
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module


# oneDNN's blocked weight layout is chosen for passes of this many rows (verification passes);
# whether prepacking pays at all is measured on the machine that runs it (``choose_kernels``).
_ROW_HINT = 8


# Compiled graphs call prepacked layers by number: oneDNN's packed tensor has no storage, so neither
# dynamo nor inductor can hold it. The numbers are given in the order layers are prepacked, so a
# graph read back from inductor's disk cache (``runners.compile_cache``), which matches only a trace
# with the same numbers, names this process's layers.
_BY_KEY: List["weakref.ref[PrepackedLinear]"] = []



class PrepackedLinear(Module):
    """A float32 CPU ``nn.Linear`` computed by oneDNN from a copy of its weight reordered once.

    Where MKL is slow (it repacks weights at every call on some x86 CPUs, and takes a generic path
    on others) this halves a float32 step; where it is not, oneDNN's path is slower. So it is a
    per-machine choice, measured at start-up (``measure.choose_kernels``), never a
    default. Same result up to float32 rounding (~1e-5); costs one extra copy of the weights.
    ``set_prepack`` makes it the model's own module, so every caller (our runners and
    transformers' ``generate``) runs the same kernel.
    """

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        # the layer's own parameters stay reachable, for model code that reads .weight or .bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.linear = [linear]  # the module it replaces (a list: not a submodule, no second state_dict entry)
        self.own_at: Tuple[bool, ...] = ()  # by pass width 1..R: True where the layer's own kernel runs (``set_prepack``)
        self._pack()
        self.key = len(_BY_KEY)  # what a compiled graph calls it by (``packed_linear``)
        _BY_KEY.append(weakref.ref(self))

    def _pack(self) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), _ROW_HINT)
        self.packed_bias = self.bias.detach() if self.bias is not None else None
        self.source = _source(self.linear[0])

    def __deepcopy__(self, memo: dict) -> "PrepackedLinear":
        """A copy packed from a copy of its layer (oneDNN's packed tensor has no storage to copy):
        ``copy.deepcopy`` of a prepacked model, as ``utils.models.truncated_drafter`` makes, works."""
        return PrepackedLinear(copy.deepcopy(self.linear[0], memo))

    def runs_own(self, x: Tensor) -> bool:
        """Whether a pass over ``x``'s rows (positions) runs the layer's own kernel (``own_at``; widths
        past the plan take its last entry)."""
        plan = self.own_at
        return bool(plan) and plan[min(x.numel() // self.in_features, len(plan)) - 1]

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():  # one opaque call in the graph, the same kernels (``packed_linear``)
            return packed_linear(x, self.weight, self.key)
        return self.run(x)

    def run(self, x: Tensor) -> Tensor:
        """The layer on ``x`` ``[..., in]`` with the kernel its plan names for this width."""
        if self.runs_own(x):
            return torch.nn.functional.linear(x, self.weight, self.bias)
        if self.weight._version != self.source[0][1]:  # the weights were changed in place since packing
            self._pack()
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.packed_bias, "none", [], "")


@torch.library.custom_op("specdec::packed_linear", mutates_args=())
def packed_linear(x: Tensor, weight: Tensor, key: int) -> Tensor:
    """``PrepackedLinear`` number ``key`` applied to ``x`` ``[..., in]`` -> ``[..., out]`` (``weight``
    is the layer's own, for the shapes: the kernel reads the packed copy)."""
    layer = _BY_KEY[key]()
    if layer is None or layer.weight is not weight and layer.weight.data_ptr() != weight.data_ptr():
        raise RuntimeError("a compiled graph calls a prepacked layer that no longer exists")
    return layer.run(x)


@packed_linear.register_fake
def _(x: Tensor, weight: Tensor, key: int) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _source(linear: torch.nn.Linear) -> tuple:
    """What identifies the current values of a linear layer's parameters."""
    return tuple((p.data_ptr(), p._version) for p in (linear.weight, linear.bias) if p is not None)


def _can_prepack() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._reorder_linear_weight and torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):
        return False


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def prepack_fits(size: int) -> bool:
    """Whether float32 linear layers of ``size`` bytes would be prepacked (``prepackable``'s limits)."""
    return _can_prepack() and 0 < size <= _physical_memory() // 4


_PREPACKED: "weakref.WeakKeyDictionary[Module, PrepackedLinear]" = weakref.WeakKeyDictionary()

# (the parent's submodule dict, the child's name, the prepacked layer, the model's own layer)
Swap = Tuple[Dict[str, Module], str, PrepackedLinear, torch.nn.Linear]


def prepackable(model: Module) -> List[Swap]:
    """The model's float32 CPU linear layers (its own or already prepacked) with their prepacked
    copies; [] when none could be prepacked: without oneDNN, or when the copies would take more
    than a quarter of the machine's memory. Quantized, hooked (accelerate) or non-CPU layers, and
    other dtypes, never are. A copy is remade when its layer's parameters change."""
    if not _can_prepack():
        return []
    found = []
    for parent in model.modules():
        for name, child in parent._modules.items():
            own = child.linear[0] if type(child) is PrepackedLinear else child
            if type(own) is not torch.nn.Linear or hasattr(own, "_hf_hook") or own._forward_hooks or own._forward_pre_hooks:
                continue
            if own.weight.device.type != "cpu" or own.weight.dtype != torch.float32:
                continue
            found.append((parent._modules, name, own))
    size = sum(own.weight.numel() * 4 for _, _, own in found)
    if not found or size > _physical_memory() // 4:
        return []
    swaps = []
    for modules, name, own in found:
        packed = modules[name] if type(modules[name]) is PrepackedLinear else _PREPACKED.get(own)
        if packed is None or packed.source != _source(own):
            packed = PrepackedLinear(own)
        _PREPACKED[own] = packed
        swaps.append((modules, name, packed, own))
    return swaps


def set_prepack(model: Module, on: bool, own_at: Sequence[bool] = ()) -> bool:
    """Make the model's float32 CPU linear layers ``PrepackedLinear`` (``on``) or its own
    ``nn.Linear`` again; returns whether they are prepacked now (False where ``prepackable`` finds
    nothing). ``own_at``: by pass width 1..R, True where the prepacked layers run the layer's own
    kernel instead (a width past R takes the last entry; empty: prepacked at every width), so that
    each pass runs on the kernels measured fastest for its width. The modules themselves change:
    every caller of the model, transformers' ``generate`` included, runs what this chose, and
    ``prepacked(model)`` / ``plan(model)`` read it back. Plain dict writes: ``Module.__setattr__``
    on 200 layers costs about a millisecond."""
    swaps = prepackable(model) if on or prepacked(model) else []
    own_at = tuple(bool(o) for o in own_at) if on else ()
    for modules, name, packed, own in swaps:
        modules[name] = packed if on else own
        packed.own_at = own_at
    return bool(on and swaps)


def plan(model: Module) -> Optional[Tuple[bool, ...]]:
    """The model's kernels by pass width: None (its own layers), () (prepacked at every width), or
    ``own_at`` as ``set_prepack`` took it."""
    layer = next((m for m in model.modules() if type(m) is PrepackedLinear), None)
    return None if layer is None else layer.own_at


def prepacked(model: Module) -> bool:
    """Whether ``model``'s linear layers are prepacked (``set_prepack``): read from its modules."""
    return any(type(m) is PrepackedLinear for m in model.modules())


@contextlib.contextmanager
def kernels(model: Module, prepack: bool | Tuple[bool, ...] | None):
    """``model`` for the block with its linear layers prepacked (True), its own (False), prepacked
    with their own kernel at the widths a plan marks (a tuple, ``set_prepack``'s ``own_at``), or as
    they are (None); then as before."""
    if prepack is None:
        yield model
        return
    wanted = () if prepack is True else prepack
    before = plan(model)
    if wanted is False or before != wanted:
        _set_plan(model, False if wanted is False else wanted)
    try:
        yield model
    finally:
        _set_plan(model, False if before is None else before)


def _set_plan(model: Module, value: bool | Tuple[bool, ...]) -> None:
    """``set_prepack`` from a plan as ``kernels`` takes it (False: the model's own layers)."""
    if value is False:
        set_prepack(model, False)
    else:
        set_prepack(model, True, value)


def drop_prepacked(model: Module) -> None:
    """Put the model's own linear layers back and free their prepacked copies (after a measurement chose them)."""
    set_prepack(model, False)
    for layer in model.modules():
        _PREPACKED.pop(layer, None)
