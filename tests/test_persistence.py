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


def test_save_never_replaces_a_file_it_did_not_write_unless_told(tmp_path):
    mine = tmp_path / "mine.json"
    mine.write_text('{"format": "speculative-decoding/ngram-storage", "mine": true}')  # JSON, but not written by save_storage
    with pytest.raises(ValueError, match="not an n-gram storage saved by this tool"):
        save_storage(filled(), mine)
    assert "mine" in mine.read_text()
    save_storage(filled(), mine, overwrite=True)
    save_storage(filled(n=4), mine)  # a saved storage is replaced without asking
    assert load_storage(mine).n == 4
    with pytest.raises(ValueError, match="not a regular file"):
        save_storage(filled(), tmp_path, overwrite=True)


def test_an_interrupted_save_leaves_the_old_file_whole_and_no_temporary_file(tmp_path, monkeypatch):
    import os

    path = tmp_path / "s.json"
    save_storage(filled(), path)
    before = path.read_bytes()
    real_fsync = os.fsync

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_storage(filled(n=5), path)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["s.json"]


def test_save_through_a_link_replaces_its_target_and_keeps_the_permissions(tmp_path):
    import os

    target = tmp_path / "real.json"
    save_storage(filled(), target)
    os.chmod(target, 0o640)
    (tmp_path / "link.json").symlink_to(target)
    save_storage(filled(n=4), tmp_path / "link.json")
    assert (tmp_path / "link.json").is_symlink() and load_storage(target).n == 4
    assert os.stat(target).st_mode & 0o777 == 0o640


HEADER = '{"format": "speculative-decoding/ngram-storage", "version": 1, "kind": "basic", '


@pytest.mark.parametrize(
    "content, reason",
    [
        ("[" * 100_000 + "]" * 100_000, "not a valid n-gram storage file"),  # nested past the parser's recursion limit
        ('{"a":' * 100_000 + "1" + "}" * 100_000, "not a valid n-gram storage file"),
        (HEADER + '"n": 1000000000, "vocab_size": 10, "tables": {}}', "bad value 1000000000"),  # would allocate n - 1 tables
        (HEADER + '"n": 3, "vocab_size": 1000000000000, "tables": {}}', "bad value"),
        (HEADER + '"n": 3, "vocab_size": 10, "tables": {"' + "1" * 5000 + '": []}}', "unexpected context length"),
        (HEADER + '"n": 3, "vocab_size": 10, "tables": {"1": [[[3], 3, [3], [' + "9" * 4000 + "]]]}}", "not a valid"),
        (HEADER + '"n": 3, "vocab_size": 10, "tables": {"1": [[[3], 3, [3], [1e999]]]}}', "bad value inf"),
        (HEADER + '"n": 3, "vocab_size": 10, "tables": {"1": [["ab", 3, [3], [1]]]}}', "malformed entry"),
        (HEADER + '"n": 3, "vocab_size": 10, "tables": []}', "not a valid"),
    ],
)
def test_hostile_storage_files_are_refused_in_one_line_before_allocating(tmp_path, content, reason):
    import tracemalloc

    path = tmp_path / "hostile.json"
    path.write_text(content)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=reason) as error:
            load_storage(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # refused before building anything the file asks for (a memory peak, not a clock: same on a busy machine)
    assert peak < 16 * 2**20 and "\n" not in str(error.value) and len(str(error.value)) < 400


def test_files_that_are_not_regular_or_too_large_are_refused_without_reading_them(tmp_path, monkeypatch):
    import os

    from ngram_assisted import persistence

    os.mkfifo(tmp_path / "fifo")  # reading would wait for a writer forever
    for path in (tmp_path / "fifo", tmp_path, "/dev/zero"):
        with pytest.raises(ValueError, match="not a regular file"):
            load_storage(path)
    save_storage(filled(), tmp_path / "s.json")
    monkeypatch.setattr(persistence, "MAX_STORAGE_BYTES", 100)
    with pytest.raises(ValueError, match="more than the 100 bytes accepted"):
        load_storage(tmp_path / "s.json")
