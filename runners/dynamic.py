"""The dynamic KV cache's operations: the model's own ``DynamicCache`` (grown by concatenation),
rolled back by cropping (with the reference's ``prune_cache``, defined in ``utils.caching``)."""
from torch.nn import Module

from utils.caching import prune_cache, prune_dynamic_cache, prune_tuple_cache  # noqa: F401 (the reference's names, defined there)


def rollback_capable_cache(model: Module):
    """The model's own dynamic cache (sliding-window layers included), recording past states so
    that a rollback may reach behind a sliding window: such a layer keeps what it has seen until
    the next ``crop``, which then cuts it back to its window. None lets the model make its own."""
    try:
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
    except (ImportError, TypeError, ValueError, AttributeError):
        return None
    cache.activate_past_recording()
    return cache
