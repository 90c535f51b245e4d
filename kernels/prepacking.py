"""Linear layers that run, at each pass width, the kernel measured fastest for it: a float32 CPU
``nn.Linear`` made the model's own ``PrepackedLinear`` module (``set_prepack``), so that every caller
runs the same kernels, computed by the layer's own ``F.linear`` (MKL), by oneDNN from a weight
reordered once, or by the skinny kernel (``kernels.skinny``), as its route says. A bfloat16 layer is
made one only by the C step (``kernels.one_copy.release``: the skinny kernel's route, its bfloat16 path)."""
import copy
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from kernels.blocked import DTYPES, lasting, unreleased
from kernels.memory_fits import can_prepack as _can_prepack, copy_fits, prepack_fits, readers_of  # noqa: F401 (kept importable here)
from kernels.remembered_packs import _REMEMBERED, _Remembered, remembered  # noqa: F401
from kernels.kept_steps import forget_step
from kernels.model_changes import changed as _changed, changes  # noqa: F401 (``prepacking.changes``, as before)
from utils.module_walk import first_module

OWN, PREPACKED, SKINNY = "own", "prepacked", "skinny"  # the kernels a float32 CPU linear layer can run on
# oneDNN's blocked weight layout is chosen for passes of this many rows (verification passes);
# whether prepacking pays at all is measured on the machine that runs it (``choose_kernels``).
_ROW_HINT = 8


# Compiled graphs call prepacked layers by number: oneDNN's packed tensor has no storage, so neither
# dynamo nor inductor can hold it. The numbers are given in the order layers are prepacked, so a
# graph read back from inductor's disk cache (``kernels.compile_cache``), which matches only a trace
# with the same numbers, names this process's layers.
_BY_KEY: List["weakref.ref[PrepackedLinear]"] = []
SWAPS = [0]  # ``set_prepack`` calls that swapped layers (plain dict writes: ``runners.hooks`` remakes its module lists)




class PrepackedLinear(Module):
    """A float32 (or, made so by the C step, bfloat16) CPU ``nn.Linear`` that runs, for each pass width, the kernel its ``route`` names:
    ``route[r - 1]`` for a pass over r positions (rows), the last entry for longer passes. The kernels:
    ``OWN`` (the layer's own ``F.linear``), ``PREPACKED`` (oneDNN, from a copy of its weight
    reordered once, made when a route first asks for it) and ``SKINNY`` (``kernels.skinny``, on the
    weight blocked once, ``kernels.blocked``: the copy the C step reads too).

    Where MKL is slow (it repacks weights at every call on some x86 CPUs, and takes a generic path
    on others) this halves a float32 step; where it is not, oneDNN's path is slower. So it is a
    per-machine choice, measured at start-up (``measure.choose_kernels``), never a
    default. Same result up to float32 rounding (~1e-5); costs one extra copy of the weights.
    ``set_prepack`` makes it the model's own module, so every caller (our runners and
    transformers' ``generate``) runs the same kernel. Forward hooks on the ``nn.Linear`` it replaced
    (registered before the swap, through a reference kept) fire at each call, as they would on it.

    Released (``release``, by ``kernels.one_copy`` where the C step holds the blocked copy): the
    layer's own weight is freed and ``blocks`` is its one copy. ``weight`` then unblocks a temporary
    ``[N, K]`` on each read (the ``OWN`` and ``PREPACKED`` kernels read one; edits to it change
    nothing), ``state_dict`` writes the unblocked weight, and a compiled graph calls it by number on
    its blocks. Loading a state dict, or moving or casting the model to another dtype or device,
    first gives every layer of the model its own weight back (``restore``, all at once: the first
    released layer torch reaches does it), then loads or casts as for any model; the next C step
    (``kernels.c_step.CStep``, which sees that its copies no longer match) releases them again.
    """

    blocks: Optional[Tensor] = None  # released: the weight's one copy, ``[ceil(N/16), K, 16]`` (a view into a fused group)
    owner: Optional["weakref.ref[Module]"] = None  # released: the model released with it (``release``)
    tied: Optional[List[Module]] = None  # a released output layer's embedding, reading its blocks (``kernels.one_head``)
    parked: bool = False  # its own weight's storage freed, oneDNN's copy its one copy (``park``)
    # its weight is another module's too (a tied output layer's is the embedding table, which stays): oneDNN's
    # copy would be a second copy beside it (issue 71), so it makes none and runs its own kernel where its
    # route says prepacked (``kernel_for``; set by ``set_prepack``)
    shared: bool = False

    @property
    def weight(self) -> Tensor:
        """The layer's own weight ``[N, K]``; released, a temporary unblocked from ``blocks`` at each read."""
        own = self._parameters.get("weight")
        if own is not None and not self.parked:
            return own
        if self.parked:  # oneDNN's copy unpacked: the same values, bit for bit
            return self.packed.to_dense()
        if self.blocks is None:
            raise AttributeError("weight")  # not set yet (``__init__``'s registration asks)
        from kernels.blocked import unpack

        return unpack(self.blocks, self.out_features)

    def release(self, blocks: Tensor, owner: Module) -> None:
        """Keep the weight only as ``blocks`` (its blocked copy, the one the C step reads): its own is
        freed. ``owner``: the model released with it (held weakly), whose layers a cast or a load restores."""
        self.blocks, self.owner = blocks, weakref.ref(owner)
        self._parameters["weight"] = None
        self.linear[0]._parameters["weight"] = None

    def park(self) -> None:
        """Keep the weight only as oneDNN's copy (made now where it is not): the own weight's storage is
        freed, the same Parameter (and version) kept empty, so that what holds it still names it. Where no
        other module reads it (the caller checks: a tied output layer's weight is the embedding table)."""
        if self.parked or self.blocks is not None:
            return
        if self.packed is None:
            self._pack()
        self.linear[0].weight.data = torch.empty(0, dtype=self.linear[0].weight.dtype)
        self.source, self.parked = _source(self.linear[0]), True

    @lasting()  # an unpark inside inference mode gives back a normal tensor, which a later in-place write may change
    def unpark(self) -> None:
        """The own weight back, unpacked from oneDNN's copy (which stays, for a route that runs it)."""
        if not self.parked:
            return
        weight = self.linear[0].weight
        weight.data = self.packed.to_dense()
        self.source, self.parked = _source(self.linear[0]), False

    @lasting()  # the weight given back is a normal tensor, in or out of inference mode (``kernels.blocked.lasting``)
    def restore(self) -> None:
        """The layer's own weight again, unblocked from ``blocks`` (a plan that no longer runs the skinny kernel)."""
        if self.blocks is None:
            return
        if self.owner is not None:
            forget_step(self.owner())  # the model's kept C step reads these blocks: it goes with them
        own = torch.nn.Parameter(unreleased(self), requires_grad=False)  # the one unblocking, in place where it can be
        self.linear[0].weight = own
        # a plain dict write: ``self.weight = own`` asks ``hasattr(self, "weight")`` first, which unblocks a second time
        self._parameters["weight"], self.blocks, self.owner = own, None, None
        if self.tied is not None:  # the embedding table is this weight again, a plain embedding (``kernels.one_head``)
            embedding, self.tied = self.tied[0], None
            embedding.__class__ = torch.nn.Embedding
            del embedding.blocks, embedding.head
            embedding._parameters["weight"] = own
        _changed()
        self.source = _source(self.linear[0])

    def _restore_owner(self) -> None:
        """``restore`` every layer of the model released with this one (the C step releases a model's
        layers at once): torch casts or loads modules in order, so the first released layer it reaches
        gives all of them their own weights back before any is cast or loaded, and none is left blocked
        (a fused group half restored would be in no one copy)."""
        model = None if self.owner is None else self.owner()
        for layer in (self,) if model is None else model.modules():
            if type(layer) is PrepackedLinear:
                layer.restore()

    def _follow(self) -> None:
        """The own layer's parameters are this one's again (a load with ``assign=True``, or a cast that
        makes new parameters, replaced them here only); oneDNN's copy is remade at its next use."""
        own = self.linear[0]
        own._parameters["weight"], own._parameters["bias"] = self._parameters["weight"], self._parameters.get("bias")
        if self.blocks is None and self.source != _source(own):
            self.packed = self.packed_bias = None

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        # a parameter assigned (``layer.weight = Parameter(...)``): the own layer's too, which the C step
        # reads (``kernels.c_step.read`` then sees it replaced), and oneDNN's copy remade
        if name in ("weight", "bias") and "linear" in self.__dict__:
            self._follow()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["owner"] = None  # a weak reference does not pickle (``torch.save(model)``)
        return state

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        if self.blocks is not None:  # released: the unblocked weight, where the layer's own would be
            destination[prefix + "weight"] = self.weight
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.parked:  # the unpacked weight, not the parked (empty) Parameter
            destination[prefix + "weight"] = self.weight

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if self.blocks is not None:  # released: the model's own weights back, then loaded as any model's
            self._restore_owner()
        self.unpark()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._follow()
        _changed()  # the model's other parameters may have been replaced too (``assign=True``)

    def _apply(self, fn, recurse=True):
        if self.blocks is not None:
            probe = torch.empty(0, dtype=self.blocks.dtype)
            moved = fn(probe)
            if moved.dtype != probe.dtype or moved.device != probe.device:  # a real move or cast, not ``.float()`` of float32
                self._restore_owner()
        self.unpark()
        made = super()._apply(fn, recurse)
        self._follow()
        _changed()  # the model's other parameters were moved too
        return made

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        # the layer's own parameters stay reachable, for model code that reads .weight or .bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.linear = [linear]  # the module it replaces (a list: not a submodule, no second state_dict entry)
        self.route: Tuple[str, ...] = (PREPACKED,)  # the kernel by pass width (``set_prepack``)
        self.path_shape: Optional[Tuple[int, int]] = None  # its model's bfloat16 path key (``kernels.bf16.chosen``; a C step sets it)
        self.packed = self.packed_bias = None
        self.source = _source(linear)
        self.key = len(_BY_KEY)  # what a compiled graph calls it by (``packed_linear``)
        _BY_KEY.append(weakref.ref(self))

    def _pack(self) -> None:
        """(Re)make oneDNN's copy of the weight (a route asks for it, or the weight changed in place)."""
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), _ROW_HINT)
        self.packed_bias = self.bias.detach() if self.bias is not None else None
        self.source = _source(self.linear[0])

    def __deepcopy__(self, memo: dict) -> "PrepackedLinear":
        """A copy packed from a copy of its layer (oneDNN's packed tensor has no storage to copy):
        ``copy.deepcopy`` of a prepacked model, as ``utils.models.truncated_drafter`` makes, works."""
        own = copy.deepcopy(self.linear[0], memo)
        if self.blocks is not None:  # released: the copy gets its own weight (it blocks it when its C step runs), a tied one its table's
            from kernels.blocked import unblocked

            own.weight = unblocked(self.blocks, self.out_features, memo)
        elif self.parked:  # parked: the copy gets its own weight, unpacked
            own.weight = torch.nn.Parameter(self.weight, requires_grad=False)
        made = PrepackedLinear(own)
        made.route, made.shared, made.path_shape = self.route, self.shared, self.path_shape
        if self.packed is not None:
            made._pack()
        return made

    def kernel_for(self, x: Tensor) -> str:
        """The kernel of a pass over ``x``'s rows (positions): its route's entry for that width."""
        route = self.route
        kernel = route[min(x.numel() // self.in_features, len(route)) - 1]
        return OWN if kernel == PREPACKED and self.shared else kernel

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():  # one opaque call in the graph, the same kernels (``packed_linear``)
            return packed_linear(x, self.weight if self.blocks is None else self.blocks, self.key)
        own = self.linear[0]
        if own._forward_hooks or own._forward_pre_hooks:  # hooked before it was swapped in: they fire here
            return _with_hooks(own, self.run, x)
        return self.run(x)

    def run(self, x: Tensor) -> Tensor:
        """The layer on ``x`` ``[..., in]`` with the kernel its route names for this width."""
        kernel = self.kernel_for(x)
        if kernel == OWN:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        if kernel == SKINNY:
            from kernels.skinny import skinny_blocked, skinny_linear

            if _dtype(self) == torch.bfloat16 and self.in_features % 2 == 0:  # the C step's bfloat16 path (else F.linear)
                from kernels.bf16 import layer_rows
                from kernels.blocked import blocked

                return layer_rows(x, self.blocks if self.blocks is not None else blocked(self.weight), self.out_features, self.bias, self.path_shape)
            if self.blocks is not None:
                return skinny_blocked(x, self.blocks, self.out_features, self.bias)
            return skinny_linear(x, self.weight, self.bias)
        if self.packed is None or self.blocks is None and self.linear[0].weight._version != self.source[0][1]:  # not made yet, or the weights changed in place (a cast or a load: ``_follow``)
            self._pack()
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.packed_bias, "none", [], "")


def _with_hooks(own: torch.nn.Linear, run, x: Tensor) -> Tensor:
    """``run(x)`` with ``own``'s forward pre-hooks and hooks around it, as ``own(x)`` would fire them
    (its own hooks only: the global ones fired for the ``PrepackedLinear`` already)."""
    args, kwargs = (x,), {}
    for key, hook in list(own._forward_pre_hooks.items()):
        if key in own._forward_pre_hooks_with_kwargs:
            result = hook(own, args, kwargs)
            if result is not None:
                args, kwargs = result
        else:
            result = hook(own, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    out = run(*args, **kwargs)
    for key, hook in list(own._forward_hooks.items()):
        result = hook(own, args, kwargs, out) if key in own._forward_hooks_with_kwargs else hook(own, args, out)
        if result is not None:
            out = result
    return out


@torch.library.custom_op("specdec::packed_linear", mutates_args=())
def packed_linear(x: Tensor, weight: Tensor, key: int) -> Tensor:
    """``PrepackedLinear`` number ``key`` applied to ``x`` ``[..., in]`` -> ``[..., out]`` (``weight``
    is the layer's own, or its blocks where released, for the shapes: the kernel reads the packed copy)."""
    layer = _BY_KEY[key]()
    held = None if layer is None else layer.weight if layer.blocks is None else layer.blocks
    if held is None or held is not weight and held.data_ptr() != weight.data_ptr():
        raise RuntimeError("a compiled graph calls a prepacked layer that no longer exists")
    return layer.run(x)


@packed_linear.register_fake
def _(x: Tensor, weight: Tensor, key: int) -> Tensor:
    out = weight.shape[0] if weight.dim() == 2 else _BY_KEY[key]().out_features  # released: the blocks
    return x.new_empty((*x.shape[:-1], out))


def _source(linear: torch.nn.Linear) -> tuple:
    """What identifies the current values of a linear layer's parameters."""
    return tuple((p.data_ptr(), p._version) for p in (linear.weight, linear.bias) if p is not None)


# (the parent's submodule dict, the child's name, the prepacked layer, the model's own layer)
Swap = Tuple[Dict[str, Module], str, PrepackedLinear, torch.nn.Linear]


def prepackable(model: Module, dtypes: Sequence[torch.dtype] = (torch.float32,), copies: bool = True) -> List[Swap]:
    """The model's float32 CPU linear layers (its own or already prepacked) with their prepacked
    copies; [] when none could be prepacked: without oneDNN, or when oneDNN's copies (``copies``: a
    route that makes them) would take more than a quarter of the machine's memory. Quantized, hooked (accelerate) or non-CPU layers, and
    other dtypes, never are. A copy is remade when its layer's parameters change. ``dtypes``: those
    taken (the C step's bfloat16 too: ``kernels.one_copy.release``; a measurement's: float32 only)."""
    if not _can_prepack():
        return []
    found = []
    for parent in model.modules():
        for name, child in parent._modules.items():
            own = child.linear[0] if type(child) is PrepackedLinear else child
            if type(own) is not torch.nn.Linear or hasattr(own, "_hf_hook") or own._forward_hooks or own._forward_pre_hooks:
                continue
            released = type(child) is PrepackedLinear and child.blocks is not None  # CPU, checked when blocked
            weight = child.blocks if released else own.weight
            if weight.device.type != "cpu" or weight.dtype not in dtypes:
                continue
            found.append((parent._modules, name, own, weight.dtype))
    size = sum(own.in_features * own.out_features * dtype.itemsize for _, _, own, dtype in found)
    if not found or copies and not copy_fits(size):
        return []
    swaps = []
    for modules, name, own, _ in found:
        packed = modules[name] if type(modules[name]) is PrepackedLinear else remembered(own)
        if packed is None or packed.blocks is None and packed.source != _source(own):
            packed = PrepackedLinear(own)
        own.__dict__[_REMEMBERED] = _Remembered(packed)
        swaps.append((modules, name, packed, own))
    return swaps


def set_prepack(model: Module, on: bool, route: Sequence[str] = (PREPACKED,), dtypes: Sequence[torch.dtype] = (torch.float32,)) -> bool:
    """Make the model's float32 CPU linear layers ``PrepackedLinear`` (``on``) or its own
    ``nn.Linear`` again; returns whether they are ``PrepackedLinear`` now (False where ``prepackable``
    finds nothing). ``route``: the kernel by pass width 1..R (``OWN``, ``PREPACKED``, ``SKINNY``; a
    longer pass takes the last entry), so that each pass runs on the kernels measured fastest for
    its width; oneDNN's copies of the weights are made only when the route uses them. The modules
    themselves change: every caller of the model, transformers' ``generate`` included, runs what
    this chose, and ``prepacked(model)`` / ``plan(model)`` read it back. Plain dict writes:
    ``Module.__setattr__`` on 200 layers costs about a millisecond. ``dtypes``: ``prepackable``'s, and
    the dtypes of the layers already prepacked (a bfloat16 model's, by the C step: a route or the own
    layers again reach them too)."""
    route = tuple(route)
    if on and (not route or any(k not in (OWN, PREPACKED, SKINNY) for k in route)):
        raise ValueError(f"a route names kernels among {OWN}, {PREPACKED}, {SKINNY}; got {route!r}")
    present = {_dtype(m) for m in model.modules() if type(m) is PrepackedLinear} & set(DTYPES)
    # the wrappers alone (a route without oneDNN's copies, the C step's) hold no second copy: no size limit
    swaps = prepackable(model, (*dtypes, *present), copies=not on or PREPACKED in route) if on or prepacked(model) else []
    SWAPS[0] += 1
    readers = readers_of(model) if swaps and on else {}
    for modules, name, packed, own in swaps:
        if not on:
            packed.restore()  # the model's own layer needs its own weight
            packed.unpark()
        modules[name] = packed if on else own
        if on:
            packed.route = route
            packed.shared = packed.tied is not None or readers.get(id(own.weight), 0) > 1
            if PREPACKED in route and packed.packed is None and not packed.shared:
                packed._pack()
    return bool(on and swaps)


def _dtype(layer: PrepackedLinear) -> torch.dtype:
    """A prepacked layer's weight dtype (a released one's: its blocks')."""
    return (layer.blocks if layer.blocks is not None else layer.linear[0].weight).dtype


def prepacked(model: Module) -> bool:
    """Whether ``model``'s linear layers are ``PrepackedLinear`` ones (``set_prepack``): read from its modules."""
    return any(type(m) is PrepackedLinear for m in model.modules())


def plan(model: Module) -> Optional[Tuple[str, ...]]:
    """The model's kernels by pass width: None (its own layers), or the ``route`` ``set_prepack`` gave."""
    layer = first_module(model, PrepackedLinear)  # read at every pass (``c_step.step_for``): no generator
    return None if layer is None else layer.route


def drop_prepacked(model: Module) -> None:
    """Put the model's own linear layers back and free their prepacked copies (after a measurement chose them)."""
    set_prepack(model, False)
    for layer in model.modules():
        layer.__dict__.pop(_REMEMBERED, None)
