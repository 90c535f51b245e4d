"""N-gram storages (loaded with the package) and the NASD entry points (loaded on first use: they
import ``sampling`` and ``drafters``, and ``drafters.ngram`` imports the storages from here, so the
package's import must not need them)."""
import importlib

from ngram_assisted.ngram_storage import CountingNGramStorage, INgramStorage, NGramStorage, OneLevelNGramStorage
from ngram_assisted.persistence import TieredStorage, build_storage, load_storage, merge_storages, replay, save_storage

_ENTRY_POINTS = {
    "NGramDrafter": "drafters.ngram",
    "TensorStorageDrafter": "drafters.ngram",
    "ngram_drafter": "drafters.ngram",
    "ngram_assisted_speculative_generate": "ngram_assisted.ngram_assisted",
    "ChainedDrafter": "drafters.chained",
}


def __getattr__(name: str):
    if name in _ENTRY_POINTS:
        return getattr(importlib.import_module(_ENTRY_POINTS[name]), name)
    raise AttributeError(f"module 'ngram_assisted' has no attribute {name!r}")


__all__ = [
    "INgramStorage",
    "CountingNGramStorage",
    "NGramStorage",
    "OneLevelNGramStorage",
    "NGramDrafter",
    "TensorStorageDrafter",
    "ngram_drafter",
    "ngram_assisted_speculative_generate",
    "ChainedDrafter",
    "TieredStorage",
    "build_storage",
    "load_storage",
    "merge_storages",
    "replay",
    "save_storage",
]
