"""Generation loops and their public entry points: ``generate``, the one entry every drafter runs
through (a spec from ``drafters``), and the reference's functions, thin wrappers over it. Names load
on first use (PEP 562), so that a module of this package (``sampling.common``, ``sampling.config``) imports without the rest: the
drafters (``drafters``) build on those, and the entry points here build on the drafters."""
import importlib

_NAMES = {
    "autoregressive_generate": "sampling.base_decoding",
    "autoregressive_generate_encoder_decoder": "sampling.base_decoding",
    "beam_search_generate": "sampling.base_decoding",
    "calibrated_policy": "sampling.policy_settings",
    "measure_draft_cost": "measure.timing",  # the measurements live in measure/, re-exported here
    "measure_row_costs": "measure.timing",
    "plausible_row_costs": "measure.costs",
    "draft_and_verify": "sampling.chain_decoding",
    "GenerationConfig": "sampling.config",
    "Observer": "sampling.config",
    "Step": "sampling.config",
    "DraftPolicy": "sampling.draft_policy",
    "PolicySettings": "sampling.policy_settings",
    "generate": "sampling.entry",
    "speculative_generate": "sampling.speculative_decoding",
    "speculative_generate_encoder_decoder": "sampling.speculative_decoding",
    "GenerationStats": "sampling.stats",
    "SuffixDrafter": "drafters.suffix",
    "SuffixMemory": "drafters.suffix_memory",
    "draft_tree_and_verify": "sampling.tree_decoding",
}


def __getattr__(name: str):
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"sampling.{name}")  # a submodule: ``sampling.tree_decoding``
    except ModuleNotFoundError as error:
        if error.name != f"sampling.{name}":
            raise
        raise AttributeError(f"module 'sampling' has no attribute {name!r}") from None


def __dir__():
    return sorted(set(globals()) | set(_NAMES))


__all__ = list(_NAMES)
