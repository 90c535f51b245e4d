"""``utils.logits_processors``: the module name the reference's README imports from (its code has
``utils.logits_processor``); the same classes."""
from utils.logits_processor import (  # noqa: F401
    GreedyProcessor,
    LogitsProcessor,
    MultinomialProcessor,
    NucleusProcessor,
    TopKNucleusProcessor,
    TopKProcessor,
)
