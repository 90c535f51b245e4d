"""Module-level state kept beside models and tokenizers goes with them, or stays bounded (issue 70's
soak, item 4): what a notebook that loads pair after pair keeps is what it holds, not every pair it
ever loaded."""
import gc
import weakref

from drafters import cross_tokenizer
from test_cross_tokenizer import tokenizer


def test_translations_keep_a_bounded_number_of_tokenizer_pairs_and_let_older_ones_go():
    """``translation`` keeps each pair's tokenizers (so their ids stay theirs while it is kept), but only
    the last ``TRANSLATIONS_KEPT`` pairs (fewer than 8): a dropped pair's tokenizers are freed once newer ones replaced it."""
    first = tokenizer(["a", "b", "ab"], [("a", "b")]), tokenizer(["b", "a"])
    spelling = cross_tokenizer.translation(*first)
    assert cross_tokenizer.translation(*first) is spelling  # built once per pair
    gone = [weakref.ref(t) for t in first]
    del first, spelling
    for _ in range(8):  # a notebook loading pair after pair
        cross_tokenizer.translation(tokenizer(["a", "b"]), tokenizer(["b", "a"]))
    gc.collect()
    assert [ref() for ref in gone] == [None, None]
    assert len(cross_tokenizer._TRANSLATIONS) <= cross_tokenizer.TRANSLATIONS_KEPT < 8
