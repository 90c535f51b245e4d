"""Forward hooks and the fast paths: a model with a forward hook or forward pre-hook on any of its
modules (a ``PrepackedLinear``, the ``nn.Linear`` it routes, a decoder layer, a norm, attention, MLP,
embeddings, the model itself), or with a global module forward hook, runs transformers' own forward
for that pass on every runner with a fast path (the C step, the lean forward, the compiled passes),
so that every hook fires as in plain transformers: researchers hook layers to steer, ablate or read
activations, and a fast path that ran its own layer code would silently skip them. The check runs
at every pass; the pass after the hooks are removed runs the fast path again.

Not counted: transformers' own output-capturing hooks (installed once by ``output_hidden_states``,
inactive otherwise), the project's pass clock (``skippable``), and backward hooks (the runners'
passes run under ``torch.no_grad``: nothing for them to fire on).

Cost per pass: a few integer comparisons and the lengths of the hook dicts that held hooks at the
last read (a hook added anywhere takes a new ``RemovableHandle`` id; one removed shortens its dict);
only then are the hooks read again, over a cached list of the model's modules (walking
``model.modules()`` costs about 1 ms for 400 modules). The list is remade when a hook is registered
anywhere or ``set_prepack`` swaps layers (``kernels.prepacking.SWAPS``): a module put in after the list
was made is seen once a hook is registered on it (a module put in with hooks it already had, by plain
assignment, is seen at the next registration or swap).
"""
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn.modules.module as torch_module
from torch import Tensor
from torch.nn import Module
from torch.utils.hooks import RemovableHandle

import kernels.prepacking as prepacking

LABEL = "transformers' forward"  # what the headers say runs a hooked model's passes
_OUTPUT_CAPTURING = "transformers.utils.output_capturing"  # where transformers' own recording hooks live
# No global module-registration hook counts submodules put in: its presence makes dynamo recompile
# compiled passes (tests/test_compiled.py's steady state, found after the merge); a hook registered
# anywhere takes a new handle id, and that remakes the module list instead.


def skippable(hook: Callable) -> Callable:
    """Mark ``hook`` as one a fast path may skip (it does not count here): the project's own pass clock
    (``runners.clock.model_passes``), which times transformers' ``generate`` at the model's top-level
    calls while a runner's passes are timed at the runner."""
    hook.skippable_hook = True
    return hook


def _own(hooks: Dict) -> bool:
    """Whether a hook dict holds a hook of the user's (not transformers' output-capturing ones, nor ``skippable``)."""
    return any(getattr(hook, "__module__", None) != _OUTPUT_CAPTURING and not getattr(hook, "skippable_hook", False)
               for hook in hooks.values())


def _modules(model: Module) -> Iterator[Tuple[str, Module]]:
    """``model``'s named modules, and after each ``PrepackedLinear`` the ``nn.Linear`` it routes (its
    hooks fire too: ``PrepackedLinear.forward``)."""
    for name, module in model.named_modules():
        yield name, module
        inner = getattr(module, "linear", None) if type(module) is prepacking.PrepackedLinear else None
        if inner:
            yield f"{name} (its own nn.Linear)", inner[0]


def global_hooks() -> bool:
    """Whether a global module forward hook or pre-hook is registered (``register_module_forward_hook``)."""
    found = torch_module._global_forward_hooks, torch_module._global_forward_pre_hooks
    return any(hooks and _own(hooks) for hooks in found)


def hooked_modules(model: Module) -> List[str]:
    """The names of ``model``'s modules with forward hooks or pre-hooks ("model.layers.3.mlp.down_proj";
    "" is the model itself), and "a global forward hook" where there is one; [] when none. A walk:
    for the headers, not per pass."""
    found = [name or type(model).__name__ for name, module in _modules(model)
             if _own(module._forward_hooks) or _own(module._forward_pre_hooks)]
    return found + (["a global forward hook"] if global_hooks() else [])


def hooks_note(model: Module) -> str:
    """The headers' phrase for a hooked ``model``'s passes, "" when it has no hooks."""
    names = hooked_modules(model)
    if not names:
        return ""
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return f"{LABEL} (the model has forward hooks: {shown}; the fast path runs again once they are removed)"


class HookWatch:
    """Whether a model has hooks now, cheaply enough for every pass (``hooked()``)."""

    def __init__(self, model: Module):
        self.model = model
        self.dicts: List[Dict] = []  # every module's forward hook and pre-hook dicts
        self.busy: List[Dict] = []  # those that held hooks at the last read, and how many
        self.lengths: List[int] = []
        self.stamp: Tuple[int, int] = (-1, -1)  # swaps, handle ids at the last read
        self.found = False  # whether that read found a hook of the user's

    def hooked(self) -> bool:
        """Whether this pass must run transformers' forward: a hook of the user's on any module, or a global one."""
        if global_hooks():
            return True
        # a hook added anywhere takes a new handle id; one removed shortens a dict that held it
        stamp = (prepacking.SWAPS[0], RemovableHandle.next_id)
        if stamp != self.stamp or [len(hooks) for hooks in self.busy] != self.lengths:
            self._read(stamp)
        return self.found

    def _read(self, stamp: Tuple[int, int]) -> None:
        """Read the hooks again (the module list too where layers were swapped or a hook registered since)."""
        if stamp != self.stamp:
            modules = [module for _, module in _modules(self.model)]
            self.dicts = [module._forward_hooks for module in modules] + [module._forward_pre_hooks for module in modules]
        self.busy = [hooks for hooks in self.dicts if hooks]
        self.lengths = [len(hooks) for hooks in self.busy]
        self.found = any(_own(hooks) for hooks in self.busy)  # transformers' own hooks (hidden states) stay
        self.stamp = stamp


def static_view(model: Module, cache, start: int, end: int):
    """transformers' ``StaticCache`` over the first ``end`` slots of ``cache`` (``models.llama.KVCache``:
    keys and values ``[1, Hkv, capacity, D]`` a layer), its write position at slot ``start``: transformers'
    forward reads and writes the runner's own tensors (views, nothing copied), and attends to the slots
    ``< end`` as the lean forward does (a slot past them was never written: uninitialized, maybe NaN,
    which a masked softmax weight of 0 would still carry into the sum)."""
    from runners.static import static_cache

    view = static_cache(model, end)
    for layer, kv in zip(view.layers, cache.layers):
        layer.device, layer.batch_size, layer.num_heads = kv.keys.device, 1, kv.keys.shape[1]
        layer.k_head_dim, layer.v_head_dim = kv.keys.shape[-1], kv.values.shape[-1]
        layer.keys, layer.values = kv.keys[:, :, :end], kv.values[:, :, :end]
        layer.cumulative_length = torch.tensor(start, device=kv.keys.device)
        layer.is_initialized = True
    return view


def _additive(mask: Tensor, end: int, dtype: torch.dtype) -> Tensor:
    """A tree pass's ``mask`` ``[1, 1, r, L]`` (boolean: True attends; or additive) as an additive mask
    over slots ``< end`` (cut, or padded with masked slots)."""
    minimum = torch.finfo(dtype).min
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, minimum)
    mask = mask[..., :end].to(dtype)
    return torch.nn.functional.pad(mask, (0, end - mask.shape[-1]), value=minimum)


def transformers_pass(model: Module, ids: Tensor, positions: Tensor, cache, start: int, n_last: int,
                      mask: Optional[Tensor], hidden_layers: Tuple[int, ...]) -> Tuple[Tensor, Optional[Tensor]]:
    """One pass of transformers' own forward (every hook fires) into a lean runner's ``cache``: ``ids``
    and ``positions`` ``[r]`` written at slots ``start..start + r - 1``; ``mask`` ``[1, 1, r, L]`` (a tree
    pass: boolean or additive) or None (causal). Returns the logits ``[n_last, V]`` and, with
    ``hidden_layers``, the hidden states entering them ``[r, len * H]``."""
    from runners.cache_kind import cache_keyword
    from runners.hidden import select_hidden
    from runners.trees import compute_dtype

    end = start + ids.shape[0]
    kwargs = {cache_keyword(model): static_view(model, cache, start, end), "use_cache": True, "logits_to_keep": n_last,
              "input_ids": ids[None], "position_ids": positions[None], "output_hidden_states": bool(hidden_layers)}
    if mask is not None:
        kwargs["attention_mask"] = _additive(mask, end, compute_dtype(model))
    out = model(**kwargs)
    hidden = select_hidden(out.hidden_states, hidden_layers) if hidden_layers else None
    return out.logits[0, -n_last:], hidden
