"""Compatibility shim: the runners and their caches live in the ``runners`` package now.

    KVCacheModel                                   runners/eager.py
    prune_cache, prune_tuple_cache,
    prune_dynamic_cache                            runners/dynamic.py (reference-compatible names, kept here)
    static cache operations                        runners/static.py
    RunnerConfig                                   runners/config.py
    default_cache, runner_cache,
    CACHES, DEFAULT_CPU_CACHE                      runners/cache_kind.py
    PrepackedLinear, set_prepack, prepackable,
    prepacked, kernels, drop_prepacked,
    prepack_fits                                   runners/prepacking.py
    gather_branch, tree_depths, tree_mask,
    tree_unsupported                               runners/trees.py
    model_device, synchronize                      runners/device.py

New code imports from ``runners``; these names stay importable from here.
"""
from runners.cache_kind import CACHES, DEFAULT_CPU_CACHE, default_cache, runner_cache
from runners.config import RunnerConfig
from runners.device import model_device, synchronize
from runners.dynamic import prune_cache, prune_dynamic_cache, prune_tuple_cache
from runners.eager import KVCacheModel
from runners.prepacking import PrepackedLinear, drop_prepacked, kernels, prepack_fits, prepackable, prepacked, set_prepack
from runners.trees import gather_branch, tree_depths, tree_mask, tree_unsupported

__all__ = [
    "CACHES", "DEFAULT_CPU_CACHE", "KVCacheModel", "PrepackedLinear", "default_cache", "drop_prepacked",
    "gather_branch", "kernels", "model_device", "prepack_fits", "prepackable", "prepacked", "prune_cache",
    "prune_dynamic_cache", "prune_tuple_cache", "runner_cache", "RunnerConfig", "set_prepack", "synchronize",
    "tree_depths", "tree_mask", "tree_unsupported",
]
