"""Runners: a model and its KV cache behind one interface (``runners.base.Runner``), the thing every
decoding loop calls. ``make_runner`` is the one place that picks which runner a generation gets.

    base.py        the ``Runner`` protocol: ``__call__``, ``rollback``, ``tree_pass``, ``keep_branch``
    eager.py       ``KVCacheModel``: the model's own forward, dynamic or static cache, encoder-decoder too
    lean.py        ``LeanRunner``: the Llama family's forward (``models.llama``) over its own static cache;
                   the default eager runner of the models it covers (``lean_unsupported``)
    compiled.py    ``CompiledRunner``: ``torch.compile``d passes in buckets over a pooled static cache
    step.py        ``StepRunner``: the lean forward as compiled steps (``models.llama_step``), one graph per
                   pass width (CUDA graphs on CUDA): what ``--compile`` runs for the Llama family on CUDA;
                   step_prepare.py: ``prepare_step``, its graphs built before anything is timed
    beams.py       ``BeamRunner``: a batch of beams over one cache, for beam search (not a ``Runner``)
    static.py      the static cache's operations (allocate, regrow with copy, rollback), shared
    dynamic.py     the dynamic cache's operations and the reference-compatible ``prune_*``
    trees.py       draft trees: depths, the tree mask, a tree pass's inputs, the branch gather
    clock.py       ``timing_passes``: every runner made inside times its passes (``bench.py --overhead``)
    llama_cpp.py   ``LlamaCppRunner``: a GGUF target on llama.cpp's kernels (llama-cpp-python, optional)
    llama_model.py a GGUF file loaded by llama.cpp (``GGUFModel``: its config) and its one context
    hooks.py       ``HookWatch``: a model with forward hooks runs transformers' forward at that pass, on every runner
    config.py      ``RunnerConfig``: which cache, compiled or not, whose forward; carried in ``GenerationConfig``
    cache_kind.py  the cache names and the device's default
    device.py      ``model_device``, ``synchronize``

The kernels they run (the skinny kernel, prepacked layers, compile caches) are in ``kernels/``.
See docs/runners.md.
"""
from typing import Callable, List, Optional, Tuple

from torch.nn import Module

from runners.base import Runner
from runners.beams import BeamRunner
from runners.clock import timed_runner
from runners.cache_kind import CACHES, DEFAULT_CPU_CACHE, default_cache, runner_cache
import runners.compiled as _compiled
from runners.compiled import (
    BUCKETS, MIN_CAPACITY, CompiledRunner, NotReady, bucket, compile_events, compiled_graphs, compiled_label, why_not_compiled,
)
from runners.config import EAGER, RunnerConfig
from runners.device import model_device, synchronize
from runners.dynamic import prune_cache, prune_dynamic_cache, prune_tuple_cache
from runners.eager import KVCacheModel
from runners.lean import LeanRunner, lean_unsupported
from kernels.plans import kernels
from kernels.prepacking import PrepackedLinear, drop_prepacked, prepack_fits, prepackable, prepacked, set_prepack
from runners.step import StepRunner, step_label, step_source
from runners.step_prepare import prepare_step
from runners.trees import gather_branch, tree_depths, tree_mask, tree_unsupported


def make_runner(model: Module, use_cache: bool = True, encoder_input_ids: Optional[List[int]] = None,
                config: RunnerConfig = EAGER) -> Runner:
    """The runner the loops use for ``model`` under ``config``: llama.cpp's over ``config.gguf`` when it
    names a GGUF file, compiled passes when it asks for them and the model can take them with a cache,
    the lean forward as compiled steps (``StepRunner``: ``config.step_for``, CUDA's default for the Llama
    family and its kin) or transformers' compiled passes (``CompiledRunner``) when compiled passes are asked
    for or, on CUDA, by default for another model (``config.compiles_by_default``),
    the lean forward (``LeanRunner``) for an eager cached run of a Llama-family model (``config.lean_for``),
    else the eager ``KVCacheModel`` (transformers' forward) with its cache kind. Inside
    ``runners.clock.timing_passes`` its passes are timed (a ``TimedRunner``)."""
    return timed_runner(_make_runner(model, use_cache, encoder_input_ids, config))


def _make_runner(model: Module, use_cache: bool, encoder_input_ids: Optional[List[int]], config: RunnerConfig) -> Runner:
    if config.gguf is not None:
        if not use_cache or encoder_input_ids is not None:
            raise ValueError("llama.cpp's runner decodes decoder-only models with their KV cache (use_cache on)")
        from runners.llama_cpp import LlamaCppRunner  # llama-cpp-python is optional: imported when asked for

        return LlamaCppRunner(config.gguf, model)
    if use_cache and encoder_input_ids is None and config.step_for(model):
        return StepRunner(model, config.graphs)  # forward="step" for a model outside the family: refused here, with its reason
    if use_cache and encoder_input_ids is None and config.compiled_for(model):
        return CompiledRunner(model)
    if use_cache and encoder_input_ids is None and config.lean_for(model):
        return LeanRunner(model)  # forward="lean" for a model outside the family: refused here, with its reason
    return KVCacheModel(model, use_cache, encoder_input_ids=encoder_input_ids, cache=config.cache)


def prepare(model: Module, length: int = MIN_CAPACITY - BUCKETS[-1], say: Callable[[str], None] = lambda text: None,
            hidden_layers: Tuple[int, ...] = (), config: Optional[RunnerConfig] = None, limit: Optional[float] = None) -> float:
    """Build every graph the compiled runner of ``model`` under ``config`` will replay (None: ``--compile``'s
    choice, ``RunnerConfig(compile=True)``), before anything is timed: ``runners.step_prepare.prepare_step`` where
    ``config.step_for(model)``, else ``runners.compiled.prepare`` (``limit``: its seconds, past which it
    raises ``NotReady``). Returns the seconds spent building."""
    config = config or RunnerConfig(compile=True)
    if config.step_for(model):
        return prepare_step(model, length, say, hidden_layers, graphs=config.graphs)
    return _compiled.prepare(model, length, say, hidden_layers, limit)


def compile_source(model: Module) -> str:
    """Where the last ``prepare`` of ``model`` got its graphs: "cached", "fresh", "partly cached", or ""."""
    return step_source(model) or _compiled.compile_source(model)


__all__ = [
    "BUCKETS", "CACHES", "DEFAULT_CPU_CACHE", "EAGER", "RunnerConfig", "BeamRunner", "CompiledRunner", "KVCacheModel", "LeanRunner", "NotReady",
    "PrepackedLinear",
    "Runner", "StepRunner", "bucket", "compile_events", "compile_source", "compiled_graphs", "compiled_label", "default_cache",
    "drop_prepacked", "gather_branch", "kernels", "lean_unsupported", "make_runner", "model_device", "prepack_fits", "prepackable",
    "prepacked", "prepare", "prune_cache", "prune_dynamic_cache", "prune_tuple_cache", "runner_cache",
    "set_prepack", "step_label", "synchronize", "tree_depths", "tree_mask", "tree_unsupported", "why_not_compiled",
]
