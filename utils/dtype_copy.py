"""A float32 model's bfloat16 copy, made in memory as a bfloat16 load of its folder would give it, without
reading the file again or holding a second float32 copy (transformers' own bfloat16 load maps the whole
float32 file while it casts: beside a float32 model already loaded, twice its weights). ``app.pair`` races
the two copies' passes (``measure.pass_dtype``) and keeps one."""
import copy

import torch
from torch.nn import Module, Parameter


def bfloat16_copy(model: Module) -> Module:
    """``model`` in bfloat16: each floating parameter cast once (to nearest even, as a bfloat16 load casts
    its float32 file; a tied one stays one), the buffers copied as they are (such a load keeps its rotary
    tables float32), the config saying bfloat16. Holds the float32 weights and this half-size copy at most."""
    memo = {id(p): Parameter(p.detach().to(torch.bfloat16), requires_grad=p.requires_grad)
            for p in model.parameters() if p.is_floating_point()}
    twin = copy.deepcopy(model, memo)  # every module and buffer copied, the parameters taken from ``memo``
    twin.config.dtype = torch.bfloat16
    return twin
