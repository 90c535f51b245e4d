from ngram_assisted.ngram_assisted import NGramDrafter, ngram_assisted_speculative_generate
from ngram_assisted.ngram_storage import INgramStorage, NGramStorage, OneLevelNGramStorage

__all__ = [
    "INgramStorage",
    "NGramStorage",
    "OneLevelNGramStorage",
    "NGramDrafter",
    "ngram_assisted_speculative_generate",
]
