"""Hidden states with a pass's logits: the residual stream entering chosen layers of the model, for
the positions the pass fed (what a learned draft head reads: EAGLE-3's three layers). Taken from the
model's own ``output_hidden_states`` (transformers records them with hooks on its decoder layers:
references to tensors the pass computes anyway, no second pass); only the chosen ones are kept."""
from typing import Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module


def check_layers(model: Module, layers: Sequence[int]) -> Tuple[int, ...]:
    """``layers`` as a tuple; refuses, in one line, a layer the model does not have. Layer ``k`` is
    the residual stream entering decoder layer ``k`` (``hidden_states[k]``; 0: the embeddings)."""
    count = model.config.get_text_config(decoder=True).num_hidden_layers
    layers = tuple(int(k) for k in layers)
    bad = [k for k in layers if not 0 <= k < count]
    if bad:
        raise ValueError(f"hidden states of layer {bad[0]} asked for; {type(model).__name__} has layers 0..{count - 1}")
    return layers


def select_hidden(hidden_states: Sequence[Tensor], layers: Tuple[int, ...]) -> Tensor:
    """``[m, len(layers) * H]``: the chosen layers' states of batch row 0, side by side."""
    return torch.cat([hidden_states[k][0] for k in layers], dim=-1)
