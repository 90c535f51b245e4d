from ngram_assisted.chained import ChainedDrafter, chained_speculative_generate
from ngram_assisted.ngram_assisted import NGramDrafter, ngram_assisted_speculative_generate
from ngram_assisted.ngram_storage import INgramStorage, NGramStorage, OneLevelNGramStorage
from ngram_assisted.persistence import TieredStorage, build_storage, load_storage, merge_storages, replay, save_storage

__all__ = [
    "INgramStorage",
    "NGramStorage",
    "OneLevelNGramStorage",
    "NGramDrafter",
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
