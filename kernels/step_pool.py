"""One C step per model (``kernels.c_step.CStep``), shared by every runner of it: ``shared_step(model)``
gives the step a runner's first pass runs, made once and reused by the runners after (a generate call
makes a runner: without the pool each paid the step's making again).

Held weakly on the model (a ``WeakKeyDictionary``; the step keeps only a weak reference to its model,
so an entry never holds its own key): the step goes with the model. Never replayed stale: each
runner's first take compares what the step reads by identity (``kernels.c_step.read``: every tensor's
address and version, a released layer's blocks; a cast, a load, a restore, an in-place edit, a
replaced parameter), the library build it calls, and, as a newly made step would (``kernels.blocked``'s ``verify``), the copies it
made beside a live weight by value: the output layer's blocked copy where that layer is not released
(``kernels.one_head``; ``kernels.skinny.holds``) and
its small float32 copies (Gemma's ``1 + w`` norms, q/k/v biases), for edits through ``w.data``,
which change no version. Any difference: a new step. Only a step whose decoder layers are all
released is kept (their blocks are the model's one copy, so keeping the step holds no second one);
a restore of the model's layers (``kernels.prepacking.PrepackedLinear.restore``: a cast, a load, a
held measurement) forgets it at once, so that it never keeps the freed blocks alive.
"""
from typing import List

import torch
from torch import Tensor
from torch.nn import Module

from kernels.kept_steps import _STEPS, forget_step, kept_step


class _Kept:
    """A pooled step with what its per-runner check reads: the ``read`` it was made at, and the bits
    of the model's tensors it holds copies of (``CStep.copied``) then."""

    def __init__(self, step):
        self.step, self.read = step, step.read
        self.copied: List[Tensor] = [_bits(t).clone() for t in step.copied]

    def fresh(self, model: Module) -> bool:
        """Whether the step still computes ``model``'s pass on its weights as they are now (about 2 us a
        layer, plus one read of the output layer and its blocked copy: per runner, never per pass)."""
        from kernels.c_step import _Released, read
        from kernels.skinny import holds, library

        step = self.step
        if step.model() is not model or step.read is not self.read or step.library is not library():
            return False  # remade since this entry (its copies' bits unknown here), or another build of the library
        if read(model) != self.read:
            return False  # changed by identity: cast, loaded, restored, replaced, edited in place
        if not isinstance(step.output, _Released) and not holds(step.head, step.output.weight):
            return False  # a copy beside a live output layer (a released one's blocks are its one copy: no edit reaches them)
        return all(torch.equal(_bits(t), bits) for t, bits in zip(step.copied, self.copied))


def _bits(t: Tensor) -> Tensor:
    """``t``'s bits as integers (-0.0 and NaN compare as written)."""
    return t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def taken_step(model: Module):
    """The step a runner's first pass takes (``runners.lean``): the kept one where it is still fresh, without
    asking ``step_unsupported`` again (a kept step was made where it found nothing, and ``fresh`` finds the
    model as it was then by identity: its layers' blocks, tensors, biases and norms' epsilons; a hooked model
    never reaches the step, ``runners.hooks``), else ``shared_step`` where ``step_unsupported`` finds nothing,
    else None. ``step_unsupported`` walks every linear of every layer: on the embedded model about as long
    as the kept step's whole check, the bulk of what a generate call paid before its first pass."""
    from kernels.c_step import step_unsupported

    kept = _STEPS.get(model)
    if kept is not None and _fresh(kept, model):
        return kept.step
    return shared_step(model) if step_unsupported(model) is None else None


def _fresh(kept: _Kept, model: Module) -> bool:
    """``kept.fresh(model)``, False where the model now holds a module ``read`` cannot read (a quantized
    linear put in: ``step_unsupported`` says why)."""
    try:
        return kept.fresh(model)
    except (AttributeError, TypeError):
        return False


def shared_step(model: Module):
    """``model``'s C step (``CStep``): the one kept for it where it is still fresh (``_Kept.fresh``), else
    made now (and kept where its decoder layers are released). Raises as ``CStep`` does."""
    from kernels.c_step import CStep

    kept = _STEPS.get(model)
    if kept is not None and _fresh(kept, model):
        return kept.step
    forget_step(model)  # the stale step's copies go before the new one is made
    step = CStep(model)
    if step.released:
        _STEPS[model] = _Kept(step)
    return step


__all__ = ["forget_step", "kept_step", "shared_step", "taken_step"]
