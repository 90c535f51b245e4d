"""The reference's cache functions, at the reference's path (``utils/caching.py``): they prune a
KV cache, legacy tuples or a transformers ``Cache``. The runners (``runners/``) roll their caches
back with them; the runners themselves are imported from ``runners``."""


def prune_cache(cache, num_tokens_to_discard: int):
    """Drop the last ``num_tokens_to_discard`` positions of a KV cache; returns the pruned cache.

    A transformers ``Cache`` (``DynamicCache``, ``EncoderDecoderCache``, ...) is cropped in place
    with ``Cache.crop`` and a negative count, which means "remove that many tokens" both in
    transformers 4.x (where a positive argument is an absolute length) and 5.x (which only
    accepts negative counts). A legacy tuple cache gets a new, shorter tuple
    (``prune_tuple_cache``). ``None`` stays ``None``; 0 tokens leaves the cache as it is.
    """
    if cache is None:
        return None
    if isinstance(cache, (tuple, list)):
        return prune_tuple_cache(cache, num_tokens_to_discard)
    if not hasattr(cache, "crop"):
        raise ValueError(f"Unsupported cache type: {type(cache).__name__}")
    if num_tokens_to_discard > 0:
        cache.crop(-num_tokens_to_discard)
    return cache


def prune_tuple_cache(cache, num_tokens_to_discard: int):
    """Prune a legacy tuple cache (one tuple per layer of 2 tensors, or 4 for an encoder-decoder:
    self-attention keys and values, then cross-attention keys and values; each
    ``[batch, heads, positions, head_dim]``): a new tuple without the last ``num_tokens_to_discard``
    positions of the self-attention tensors. The cross-attention tensors hold the encoder's
    positions and are kept whole (the reference cut them too), and 0 tokens keeps everything
    (the reference's ``[:-0]`` emptied the cache)."""
    if cache is None:
        return None
    keep = None if num_tokens_to_discard <= 0 else -num_tokens_to_discard
    pruned = []
    for layer in cache:
        if layer is None:
            pruned.append(None)
            continue
        pruned.append(tuple(t[:, :, :keep, :] if i < 2 else t for i, t in enumerate(layer)))
    return tuple(pruned)


def prune_dynamic_cache(cache, num_tokens_to_discard: int):
    """Prune a ``DynamicCache`` in place (``Cache.crop``) and return the same instance."""
    if cache is None:
        return None
    return prune_cache(cache, num_tokens_to_discard)
