"""The static KV cache's operations, written once for every runner that uses one (the eager
``KVCacheModel(cache="static")`` and the compiled ``CompiledRunner``).

A static cache is transformers' ``StaticCache``: per layer, keys and values preallocated as
``[1, heads, capacity, head_dim]`` and a write position (``cumulative_length``). A pass writes its
positions at the write position; a rollback only moves the write position back (stale entries are
masked, then overwritten); a regrowth allocates a larger cache and copies what the old one holds.
A tree pass writes node ``i`` at slot ``cur + i`` (``runners.trees.tree_inputs`` with
``kv_length=capacity(cache)``) and ``runners.trees.gather_branch`` moves the kept branch into place.
"""
from torch import Tensor
from torch.nn import Module

STATIC_SLACK = 256  # positions the eager runner preallocates beyond the first pass (new tokens, verification passes)
STATIC_ROUND = 128  # and the multiple its capacities are rounded up to


def static_cache(model: Module, capacity: int):
    """transformers' ``StaticCache`` for ``capacity`` positions, or None when the model cannot take one.

    Every layer is a full-length ``StaticLayer``, sliding-window layers included: the model's
    sliding-window mask (from absolute positions) still limits what such a layer attends to,
    while a rollback, which only moves the write position back, never needs a position that a
    ring buffer would have overwritten."""
    try:
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer

        config = model.config.get_text_config(decoder=True)
        cache = StaticCache(config=config, max_cache_len=capacity)
    except (ImportError, TypeError, ValueError, AttributeError, KeyError):
        return None
    for i, layer in enumerate(cache.layers):
        if type(layer) is not StaticLayer:
            if not getattr(layer, "is_sliding", False):
                return None  # linear attention, indexed layers...: not a plain K/V store
            cache.layers[i] = StaticLayer(max_cache_len=capacity)
    return cache


def capacity(cache) -> int:
    """The positions a static cache holds at most."""
    return cache.layers[0].max_cache_len


def set_length(cache, length: int) -> None:
    """Move every allocated layer's write position to ``length``: a rollback (or, past what was
    written, forgetting a padded pass's extra positions). Nothing is reallocated or cleared."""
    for layer in cache.layers:
        if layer.is_initialized:
            layer.cumulative_length.fill_(length)


def carry(old, new, length: int) -> None:
    """Copy the first ``length`` positions of every allocated layer of ``old`` into ``new`` (a regrowth),
    allocating ``new``'s layers as ``old``'s where they are not yet; ``new``'s write position is then ``length``."""
    for before, after in zip(old.layers, new.layers):
        if before.is_initialized:
            after.lazy_initialization(before.keys, before.values)
            after.keys[:, :, :length].copy_(before.keys[:, :, :length])
            after.values[:, :, :length].copy_(before.values[:, :, :length])
    set_length(new, length)


def grown_capacity(length: int, current: int) -> int:
    """The eager runner's next capacity for ``length`` positions: ``length`` plus ``STATIC_SLACK``,
    at least double ``current``, rounded up to ``STATIC_ROUND``."""
    step = STATIC_ROUND
    return -(-max(length + STATIC_SLACK, 2 * current) // step) * step


def fed(runner, ids: Tensor, n_last: int) -> Tensor:
    """The positions of ``ids`` ``[1, L]`` a static-cache runner has not cached yet, ``[1, L - cached]``
    on its device, after ``runner._reserve(L)`` made room for them; refuses ``n_last`` logits beyond them."""
    length, start = ids.shape[1], runner.cached
    if length - start < n_last:
        raise RuntimeError(f"asked for {n_last} logits but only {length - start} positions are new")
    runner._reserve(length)
    return ids[:, start:length].to(runner.device, non_blocking=True)
