"""One copy of the weights: where the C step (``kernels.c_step``) holds the blocked copy of a decoder
layer's linear (q/k/v and gate/up fused, o and down alone: ``kernels.blocked``), the model's own
weight is freed and the layer (a ``kernels.prepacking.PrepackedLinear``) computes from the blocked
copy: the skinny kernel for the widths its route runs on it (every width, where the C step runs
the model: it takes passes of any length), and for the others (a plan's "own" or "prepacked" widths)
a weight unblocked on demand, one layer at a time, into a temporary (the same values, so the same
products bit for bit).

Why a released ``PrepackedLinear`` and not a strided view: ``[N/16, K, 16]`` is no strided view of a
row-major ``[N, K]`` (a row's 16-feature block interleaves K), and the plan by width (``set_prepack``'s
route, what the start-up measurement chose) already lives on that module: every caller, transformers'
forward included, runs what our rows run. A model with no plan gets the one the C step implies
(``STEP_ROUTE``: the skinny kernel at every width), so its header names it.

A bfloat16 model alike: its layers' copies are blocked in bfloat16 (``[N/16, K/2, 16, 2]`` in memory),
so it holds about half a float32 model's bytes; its layers' forward reads them by the step's
bfloat16 path (``kernels.bf16.layer_rows``: float32 sums, each output rounded to bfloat16 once).

With ``kernels.huge_pages.ON`` set the blocked copies made are then moved onto 2 MB pages where Linux grants them
(``kernels.huge_pages``: a pass streams them, and on 4 KB pages pays a TLB miss every 4 KB of each stream), the
output layer's too; off by default (``kernels.huge_pages.ON`` says why). The output layer alike (``kernels.one_head``): its blocked copy is its one copy, and a tied embedding
table reads its rows from it. The start-up kernel measurement
holds one option's copy at a time (``kernels.holding``: the own weights given back for "own", released
again for "skinny"). What a user loses is in docs/limitations.md.
"""
import contextlib
import weakref
from typing import List, Optional, Sequence

import torch
from torch import Tensor
from torch.nn import Module

from kernels.blocked import DTYPES, blocked, fused, lasting
from kernels.file_pages import _drop_pages, _file_mappings, unviewed  # noqa: F401 (importable here too)
from kernels.huge_pages import collapse
from kernels.prepacking import OWN, SKINNY, PrepackedLinear, plan, prepackable, set_prepack

NOTE = "the layers' weights held once, blocked"  # the headers' words
STEP_ROUTE = (SKINNY,)  # what a model with no plan runs: the step's kernel at every width (the C step takes any)

_HELD: "weakref.WeakSet[Module]" = weakref.WeakSet()  # models whose own weights stay (``held``)
_KEPT: "weakref.WeakSet[Module]" = weakref.WeakSet()  # models whose own weights stay for good (``keep``)


def groups(layer: Module) -> List[List[Module]]:
    """A decoder layer's linears as the C step reads them: q/k/v, o, gate/up, down (Phi-3's q/k/v and
    gate/up are one linear each: the same blocked layout as the fused three, two)."""
    a, m = layer.self_attn, layer.mlp
    qkv = [a.qkv_proj] if hasattr(a, "qkv_proj") else [a.q_proj, a.k_proj, a.v_proj]
    gate_up = [m.gate_up_proj] if hasattr(m, "gate_up_proj") else [m.gate_proj, m.up_proj]
    return [qkv, [a.o_proj], gate_up, [m.down_proj]]


def released(module: Module) -> bool:
    """Whether ``module`` keeps its weight only as its blocked copy."""
    return type(module) is PrepackedLinear and module.blocks is not None


def group_blocks(modules: Sequence[Module]) -> Optional[Tensor]:
    """The one blocked tensor of released ``modules`` (their fused group, or a lone layer's copy); None
    where any is not released."""
    if not all(released(m) for m in modules):
        return None
    if len(modules) == 1:
        return modules[0].blocks
    whole = modules[0].blocks._base  # each layer's blocks are a view of the group (``fused``)
    if whole is None or any(m.blocks._base is not whole for m in modules) or \
            sum(m.blocks.shape[0] for m in modules) != whole.shape[0]:
        return None
    return whole


@lasting()  # the blocks outlive an inference_mode block the first step is made in (``kernels.blocked.lasting``)
def release(model: Module) -> bool:
    """Free the own weights of ``model``'s decoder-layer linears, keeping their blocked copies (made now
    where they are not yet), float32 or bfloat16 (a bfloat16 model's layers become ``PrepackedLinear``
    here, on the step's route, blocked in bfloat16); whether they are released. Not where ``held``, nor where its layers cannot
    be ``PrepackedLinear`` (no oneDNN: ``set_prepack`` finds nothing), nor twice. The caller has
    checked that the C step takes the model (``kernels.c_step.step_unsupported``)."""
    from kernels.one_head import release_head

    if model in _HELD or model in _KEPT:
        return False
    if plan(model) is None and not set_prepack(model, True, STEP_ROUTE, DTYPES):
        return False
    layers = model.model.layers[: model.config.num_hidden_layers]
    if not all(type(x) is PrepackedLinear for layer in layers for group in groups(layer) for x in group):
        return False
    files, made = _file_mappings(), []
    for layer in layers:
        for group in groups(layer):
            if group_blocks(group) is not None:
                continue
            weights = [x.linear[0].weight for x in group]
            if len(group) > 1:
                fused(weights)  # each weight's copy a view of the group's
            for x, weight in zip(group, weights):
                x.release(blocked(weight), model)
            spans = [(w.data_ptr(), w.data_ptr() + w.numel() * w.element_size(), w.untyped_storage()) for w in weights]
            del weights, weight
            _drop_pages(spans, files)  # group by group: at most one group's weights held twice
            made.append(group_blocks(group))
    release_head(model)  # the output layer (and a tied embedding) on its blocked copy alone (``kernels.one_head``)
    head = model.get_output_embeddings()  # its blocks too: a fifth of SmolLM2's pass (a file mapping's: refused, kept)
    made += [head.blocks] if released(head) else []
    collapse([(b.data_ptr(), b.numel() * b.element_size()) for b in made if b is not None])  # 2 MB pages (``kernels.huge_pages``)
    return True


def note(model: Module) -> str:
    """``NOTE`` where the C step's first pass over ``model`` releases its layers' weights (or has), else ""."""
    if any(released(m) for m in model.modules()):
        return NOTE
    return NOTE if model not in _HELD and (plan(model) is not None or prepackable(model, DTYPES)) else ""


@contextlib.contextmanager
def held(model: Module):
    """``model`` for the block with its own weights kept (given back where they were released): the
    start-up kernel measurement times its own linears, not an unblocked temporary. Released again at
    the next C step made after it."""
    for layer in model.modules():
        if type(layer) is PrepackedLinear:
            layer.restore()
    _HELD.add(model)
    try:
        yield model
    finally:
        _HELD.discard(model)


def keep(model: Module) -> None:
    """Keep ``model``'s own weights from now on (given back where they were released): transformers'
    forward is compiled over its layers (``runners.compiled``), and a release would change those layers
    under the graphs (rebuilt inside a timed run)."""
    for layer in model.modules():
        if type(layer) is PrepackedLinear:
            layer.restore()
    _KEPT.add(model)


def parameter_count(model: Module) -> int:
    """``model``'s parameters, a released layer's weight counted (it is no parameter any more), a parked
    one's too (its Parameter is empty: ``kernels.holding``)."""
    return sum(p.numel() for p in model.parameters()) + \
        sum(m.in_features * m.out_features for m in model.modules() if released(m) or getattr(m, "parked", False))


def weight_bytes(model: Module, *more: Tensor) -> int:
    """Bytes of the distinct storages behind ``model``'s parameters, buffers, released blocked copies
    and ``more`` (each storage once, by address): what the process holds of the model."""
    tensors = [*model.parameters(), *model.buffers(), *more]
    tensors += [m.blocks for m in model.modules() if released(m)]
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


__all__ = ["NOTE", "STEP_ROUTE", "note", "parameter_count", "group_blocks", "groups", "held", "keep", "release", "released",
           "weight_bytes"]
