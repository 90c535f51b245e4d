"""The C step's keys in blocks of 16 slots (``attention.h``'s ``key_blocks``), kept beside a KV cache
(``models.llama.KVCache.kept_keys``) so that a pass transposes only the blocks its own positions touch
(the last, partial block and the new ones), not every block of the cache again. A layout only: the
keys moved, never computed (float32, or a bfloat16 cache's bfloat16), so attention's bits are those of a
fresh transposition.

Never replayed stale: ``KeptKeys.upto`` counts the slots ``[0, upto)`` whose blocks hold the cache's keys
as they are, and is lowered wherever the keys below it change:

* a C step pass writes slots ``start..end - 1``: it transposes from the block of ``min(upto, start)``
  (``c_step.c``, ``Dims.kept``), then ``upto = end`` (``passed``): a rollback (a pass starting below
  ``upto``: rejected drafts, a tree's pass after its root) lowers it by its start alone;
* any write through torch (the torch forward, transformers' own with hooks, a tree's accepted branch
  moved into place, a copy into the cache) bumps the keys' version counter, and the next pass finds a
  version, or a layer's tensor, changed: ``upto = 0`` (``kept``); a writer that says where it starts
  (``moving``: ``runners.trees.gather_branch``) keeps the blocks before that;
* a C step write bumps the versions itself (``passed``), so that another cache sharing these tensors
  finds them changed too; a new cache (a new prompt's runner, a regrown one) starts with none.

The state lives on its cache and holds no reference to it (nor to its tensors: weak references), so it
goes with the cache. Inference tensors (made under ``torch.inference_mode``) count no versions: a cache
of them keeps no blocks (the step makes them in its scratch each pass, as before). ``KEEP = False``:
no cache keeps any (the A/B of the same bits).
"""
import weakref
from contextlib import contextmanager
from typing import Iterator, Optional, Tuple

import torch
from torch.autograd.graph import increment_version

import kernels.huge_pages as huge_pages
from models.llama import layout

BLOCK = 16  # slots a block holds (attention.h's BLOCK)
KEEP = True  # False: no kept blocks, every pass transposes every block it reads into its scratch
DTYPES = (torch.float32, torch.bfloat16)  # the caches the C step reads (``c_step.c``'s ``Dims.kv``)


def _keys(cache) -> list:
    return [layer.keys for layer in cache.layers]


def _shared(keys: list) -> Optional[torch.Tensor]:
    """The one tensor every layer's keys are views of (``models.llama.new_cache``: they share its version
    counter, so a write to any of them moves its ``_version``), else None."""
    base = keys[0]._base if keys else None
    return base if base is not None and all(t._base is base for t in keys) else None


class KeptKeys:
    """One cache's blocks ``[layers, Hkv, ceil(capacity / 16) 16, D]`` in its keys' dtype (layer ``l``, head ``kv``, slot
    ``16 b + s``, dimension ``d`` at ``blocks[l, kv, (b D + d) 16 + s]`` read flat), the slots ``[0, upto)``
    current, for the keys tensors (by weak reference), at the addresses and versions it last saw.

    Per pass it reads one integer and one version where it can: ``walked`` is the ``models.llama.layout`` count
    at the last walk that found the cache holding this state's tensors; while no cache's tensors were assigned
    since, the cache still holds them, and where they are views of one tensor (``base``, weakly), that tensor's
    version counts every write to them (``seen``). Else (a layout moved, keys apart) it walks every layer."""

    def __init__(self, cache, shape: Tuple[int, ...], addresses: tuple):
        # pages touched only as blocks are written (2 MB ones: huge_pages.CACHE)
        self.blocks = huge_pages.empty(shape, cache.layers[0].keys.dtype)
        self.upto, self.addresses = 0, addresses
        self.refs = tuple(weakref.ref(t) for t in _keys(cache))
        self.walked, self.base = -1, None
        self.versions = self.seen(cache)

    def current(self) -> bool:
        """Whether no cache's tensors were assigned since the walk that found this state's in its cache."""
        return self.walked == layout()

    def seen(self, cache) -> Tuple[int, ...]:
        """The keys' versions: their shared base's alone where they are its views, else each layer's."""
        if self.base is not None and self.current():
            base = self.base()  # alive: the cache's keys, still these views, hold it
            if base is not None:
                return (base._version,)
        keys = _keys(cache)
        base = _shared(keys)
        if self.holds(keys):  # a walk of this state's own tensors: the next passes may read the base alone
            self.walked, self.base = layout(), None if base is None else weakref.ref(base)
        return (base._version,) if base is not None else tuple(t._version for t in keys)

    def holds(self, keys: list) -> bool:
        """Whether ``keys`` are the tensors this state was made for (the same objects, alive)."""
        return len(keys) == len(self.refs) and all(r() is t for r, t in zip(self.refs, keys))

    def same(self, cache) -> bool:
        """Whether the cache holds the tensors this state was made for, at the versions it last saw."""
        return self.holds(_keys(cache)) and self.seen(cache) == self.versions


def kept(cache, heads: int, dim: int, addresses: tuple) -> Optional[KeptKeys]:
    """``cache``'s kept blocks for a step of ``heads`` key-value heads of ``dim``, its tensors' data at
    ``addresses`` now (made where it has none, or they are no longer its tensors' or no longer fit);
    ``upto`` lowered to 0 where its keys changed since (a version, an address: ``.data`` replaced); None where
    blocks are not kept (``KEEP``; inference tensors; a cache that is not float32 or bfloat16 on CPU). Where no cache's
    tensors were assigned since its state last walked them (``KeptKeys.current``), one version read."""
    if not KEEP:  # and none kept on: the passes from now on would not lower it
        if getattr(cache, "kept_keys", None) is not None:
            cache.kept_keys = None
        return None
    state = getattr(cache, "kept_keys", None)
    if state is not None and state.current() and state.addresses == addresses and state.blocks.shape[1] == heads \
            and state.blocks.shape[3] == dim:  # its tensors (and so their dtype), capacity and layers as it last walked them
        if state.seen(cache) != state.versions:
            state.upto, state.versions = 0, state.seen(cache)
        return state
    keys = _keys(cache)
    shape = (len(keys), heads, -(-cache.capacity // BLOCK) * BLOCK, dim)
    if state is None or tuple(state.blocks.shape) != shape or not state.holds(keys) or state.blocks.dtype != keys[0].dtype:
        if not keys or any(t.is_inference() or t.dtype not in DTYPES or t.dtype != keys[0].dtype or t.device.type != "cpu" for t in keys):
            return None
        state = cache.kept_keys = KeptKeys(cache, shape, addresses)
    elif state.seen(cache) != state.versions or state.addresses != addresses:
        state.upto, state.versions, state.addresses = 0, state.seen(cache), addresses
    return state


def point(structs, state: Optional[KeptKeys], bound: Optional[Tuple[int, int]]) -> Optional[Tuple[int, int]]:
    """Each layer's struct (``c_step.c``'s ``Layer.kept_blocks``) at its blocks in ``state`` (None: NULL, the
    scratch), unless already at ``bound``; returns what they point at: (address, a layer's bytes), the
    bytes following the capacity."""
    at = None if state is None else (state.blocks.data_ptr(), state.blocks.stride(0) * state.blocks.element_size())
    if at != bound:
        for i, struct in enumerate(structs):
            struct.kept_blocks = None if at is None else at[0] + i * at[1]
    return at


def passed(cache, state: Optional[KeptKeys], end: int) -> None:
    """After a C step pass that wrote the slots before ``end`` and transposed their blocks: ``upto = end``,
    the keys' versions bumped (they were written) and seen; nothing where no blocks are kept."""
    if state is not None:
        base = state.base() if state.base is not None and state.current() else None
        increment_version(_keys(cache) if base is None else base)  # the base: every layer's keys at once
        state.upto, state.versions = end, state.seen(cache)


@contextmanager
def moving(cache, first: int) -> Iterator[None]:
    """Around a torch write of ``cache``'s keys at slots ``first`` and after: the kept blocks before
    ``first`` stay current (where nothing else changed the keys since the state last saw them)."""
    state = getattr(cache, "kept_keys", None)
    before = state is not None and state.same(cache)
    try:
        yield
    finally:
        if state is not None:
            state.upto = min(state.upto, first) if before else 0
            state.versions = state.seen(cache)


__all__ = ["KEEP", "KeptKeys", "kept", "moving", "passed", "point"]
