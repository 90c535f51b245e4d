"""One kernel option's copy of the weights at a time: ``hold(model, option)`` switches a model's float32
CPU linears to one option (``OWN``, ``PREPACKED``, ``SKINNY``: ``kernels.prepacking``) and leaves it
holding that option's copy of each weight and no other, each copy freed before the next is made.
What the start-up's kernel measurement (``measure.timing.measure_kernels``) times every option on
the whole model with, never three copies of it at once (issue 71: a first start within memory).

What each option holds (W: the float32 weights):
- ``OWN``: the own weights (W).
- ``SKINNY``: the blocked copies, the own weights of the decoder layers released (``kernels.one_copy``)
  where the C step takes the model, as it runs after the start; plus the output layer's blocked copy
  (the C step's). Where it does not, the blocked copies are made beside the own weights.
- ``PREPACKED``: oneDNN's copies, each layer's own weight parked (its storage freed) once its copy is
  made; a layer whose weight another module reads (a tied output layer's is the embedding table) gets
  no copy and runs its own kernel on it (``PrepackedLinear.shared``): never a second copy beside the table.
  ``hold`` with another option, or ``unpark``, gives the weights back (unpacked from oneDNN's copy: the
  same values, bit for bit). Also the state a prepacked plan runs in (``measure.kernels.apply_kernels``):
  a parked layer's ``weight`` unpacks a temporary, and a save, copy, cast or load reads the weight back.

A switch goes layer by layer: at most one layer's weight (one fused group of the C step's) is held twice
at any moment; the released output layer is unblocked over its own blocks (``kernels.one_head.unreleased``). The C step's own copy of the output layer lives in the step its runners share (``kernels.step_pool``): the
caller drops that step (``drop_step``) before switching away from ``SKINNY``."""
from torch.nn import Module

from kernels.plans import drop_blocked_copies
from kernels.prepacking import OWN, PREPACKED, SKINNY, PrepackedLinear, readers_of, set_prepack
from kernels.kept_steps import forget_step


def hold(model: Module, option: str) -> bool:
    """Switch ``model``'s float32 CPU linears to ``option`` at every pass width, holding only its copy of
    their weights (the module docstring); whether they are ``PrepackedLinear`` now (False: nothing to
    switch, ``set_prepack``'s). Every other copy is freed first, those beside an own weight (the output
    layer's) before any weight is given back, so that no switch holds two whole copies."""
    from kernels.c_step import step_unsupported
    from kernels.one_copy import release

    for layer in model.modules():  # oneDNN's copies beside an own weight (not parked): nothing to give back
        if type(layer) is PrepackedLinear and not layer.parked:
            layer.packed = layer.packed_bias = None
    if option != SKINNY:
        drop_blocked_copies(model)  # the output layer's blocked copy first, then the own weights back, group by group
    unpark(model)
    if not set_prepack(model, True, (OWN,)):  # no copy made
        return False
    if option == PREPACKED:
        _pack_and_park(model)
    elif option == SKINNY and step_unsupported(model) is None:
        release(model)
    set_prepack(model, True, (option,))  # the copies it runs are made: nothing is made here
    return True


def _pack_and_park(model: Module) -> None:
    """oneDNN's copy of each layer's weight, the weight parked right after where no other module reads it
    (the pages of a weight read from its safetensors file given back, as ``kernels.one_copy.release`` does)."""
    from kernels.file_pages import _drop_pages, _file_mappings

    readers, files = readers_of(model), _file_mappings()
    for layer in [m for m in model.modules() if type(m) is PrepackedLinear and not m.shared]:
        if layer.packed is None:
            layer._pack()
        weight = layer.linear[0].weight
        if readers.get(id(weight), 0) == 1 and weight.numel():
            span = (weight.data_ptr(), weight.data_ptr() + weight.numel() * weight.element_size(), weight.untyped_storage())
            layer.park()  # the same Parameter (and version), its storage freed; its copy holds the weight
            _drop_pages([span], files)
            del span


def parked(model: Module) -> bool:
    """Whether some linear of ``model`` has its own weight parked (``hold(model, PREPACKED)``)."""
    return any(layer.parked for layer in model.modules() if type(layer) is PrepackedLinear)


def unpark(model: Module) -> None:
    """Give every parked layer of ``model`` its own weight back, unpacked from oneDNN's copy (then freed),
    layer by layer; the layers keep their identity (``source``), so nothing is packed again."""
    for layer in [m for m in model.modules() if type(m) is PrepackedLinear and m.parked]:
        layer.unpark()
        layer.packed = layer.packed_bias = None


def drop_step(runner: object) -> None:
    """Forget the C step ``runner`` made (its copies of the weights, the output layer's blocked copy):
    made again at its next pass that runs it (the step kept for its model too, ``kernels.step_pool``)."""
    if getattr(runner, "step", None):
        runner.step = None
    forget_step(getattr(runner, "model", None))


__all__ = ["drop_step", "hold", "parked", "unpark"]
