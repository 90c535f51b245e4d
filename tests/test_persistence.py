"""Persistent n-gram storages: built from a corpus, saved as data, loaded, merged, tiered."""
import json

import pytest

from ngram_assisted import (
    NGramStorage,
    OneLevelNGramStorage,
    TieredStorage,
    build_storage,
    load_storage,
    merge_storages,
    replay,
    save_storage,
)
from utils.models import embedded_model_dir


def filled(kind=NGramStorage, n=3):
    storage = kind(n, 100)
    storage.add_sequence([1, 2, 3, 1, 2, 4, 1, 2, 4, 7, 7, 1])
    storage.add([5], [9, 8, 8])
    storage.add([5], [9, 9])  # best of "5" moves 9 -> 8 -> 9: history a reload must keep
    return storage


@pytest.mark.parametrize("kind", [NGramStorage, OneLevelNGramStorage])
def test_saved_storage_loads_back_with_the_same_predictions_and_counts(tmp_path, kind):
    storage = filled(kind)
    save_storage(storage, tmp_path / "s.json")
    loaded = load_storage(tmp_path / "s.json")
    assert type(loaded) is kind and loaded.n == storage.n and loaded.vocab_size == 100
    contexts = [[1, 2], [2], [5], [7, 7], [9], [4, 1], [3, 3]]
    assert [loaded.predict(c) for c in contexts] == [storage.predict(c) for c in contexts]
    assert all(loaded.count(c, t) == storage.count(c, t) for c in contexts for t in range(10))


def test_saved_file_is_plain_json_data(tmp_path):
    save_storage(filled(), tmp_path / "s.json")
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["format"] == "speculative-decoding/ngram-storage" and data["kind"] == "basic"


@pytest.mark.parametrize(
    "content",
    [b"", b"not json", b'{"format": "something else"}', b"\x80\x03}q\x00.",  # a pickle header
     b'{"format": "speculative-decoding/ngram-storage", "version": 1, "kind": "basic", "n": 3, "vocab_size": 10, '
     b'"tables": {"1": [[[3], 99, [99], [1]]]}}',  # token outside the vocabulary
     b'{"format": "speculative-decoding/ngram-storage", "version": 1, "kind": "basic", "n": 3, "vocab_size": 10, '
     b'"tables": {"5": []}}'],
)
def test_corrupt_or_foreign_files_are_refused_clearly(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="not a valid n-gram storage file"):
        load_storage(path)


def test_missing_file_is_refused_clearly(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        load_storage(tmp_path / "nothing.json")


def test_merge_adds_counts_and_refuses_other_shapes():
    a, b = filled(), filled()
    merge_storages(a, b)
    assert a.count([5], 8) == 4 and a.count([1, 2], 4) == 4
    with pytest.raises(ValueError, match="cannot merge"):
        merge_storages(filled(), filled(OneLevelNGramStorage))
    with pytest.raises(ValueError, match="cannot merge"):
        merge_storages(filled(n=3), filled(n=4))


def test_storage_built_from_a_corpus_predicts_its_phrases(tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog.\n\nA lazy afternoon.\n")
    storage = build_storage(corpus, tokenizer, n=3)
    ids = tokenizer("The quick brown fox", add_special_tokens=False).input_ids
    assert storage.predict(ids[:2]) == ids[2]
    with pytest.raises(ValueError, match="cannot read the corpus"):
        build_storage(tmp_path / "missing.txt", tokenizer)


def test_tiered_lookup_prefers_the_generations_storage_and_falls_back_to_the_static_one():
    static = NGramStorage(3, 100)
    static.add_sequence([1, 2, 3, 4, 5])
    own = NGramStorage(3, 100)
    own.add_sequence([1, 2, 9])
    tiered = TieredStorage(own, static)
    assert tiered.predict([1, 2]) == 9  # the generation's own
    assert tiered.predict([3, 4]) == 5  # only the static tier knows
    tiered.add([3, 4], [6, 6])
    assert tiered.predict([3, 4]) == 6 and static.predict([3, 4]) == 5  # the static tier is not modified
    tiered.reset()
    assert tiered.predict([1, 2]) == 3 and own.predict([1, 2]) is None


def test_replay_reports_how_often_the_storage_would_have_predicted_the_next_token():
    tokens = [1, 2, 3] * 10
    positions, predicted, correct = replay(NGramStorage(2, 10), tokens)
    assert positions == 29 and predicted == 26 and correct == 26  # each context known after its first sighting
    static = filled()
    assert replay(static, [1, 2, 4], learn=False) == (2, 2, 2)
    assert static.count([1, 2], 4) == filled().count([1, 2], 4)  # not learning: unchanged
