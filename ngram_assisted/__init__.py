from ngram_assisted.chained import ChainedDrafter, chained_speculative_generate
from ngram_assisted.ngram_assisted import NGramDrafter, TensorStorageDrafter, ngram_assisted_speculative_generate, ngram_drafter
from ngram_assisted.ngram_storage import CountingNGramStorage, INgramStorage, NGramStorage, OneLevelNGramStorage
from ngram_assisted.persistence import TieredStorage, build_storage, load_storage, merge_storages, replay, save_storage

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
    "chained_speculative_generate",
    "TieredStorage",
    "build_storage",
    "load_storage",
    "merge_storages",
    "replay",
    "save_storage",
]
