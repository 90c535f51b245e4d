"""N-gram storages: what they count and what they predict, with the reference's tensor API."""
import torch

from ngram_assisted import NGramStorage, OneLevelNGramStorage


def test_two_gram_storage_predicts_from_the_last_token():
    # the reference's NGramStorage(n=2) never predicts: its loop skips contexts of one token
    storage = NGramStorage(2, 50)
    storage.initialize(torch.tensor([[4, 7, 4, 7, 9]]))
    token, known = storage.next_token(torch.tensor([[1, 4]]))
    assert known.tolist() == [True] and token.tolist() == [7]


def test_longest_known_context_wins():
    storage = NGramStorage(3, 50)
    storage.add_sequence([1, 2, 3, 5, 2, 6, 5, 2, 6])  # after "2": 3 once, 6 twice; after "1 2": 3
    assert storage.predict([2]) == 6
    assert storage.predict([1, 2]) == 3
    assert storage.predict([9, 2]) == 6  # unknown 2-token context falls back to one token
    assert storage.predict([42]) is None


def test_one_level_storage_needs_the_full_context():
    storage = OneLevelNGramStorage(3, 50)
    storage.add_sequence([1, 2, 3, 1, 2, 3])
    assert storage.predict([1, 2]) == 3
    assert storage.predict([2]) is None
    assert storage.predict([8, 2]) is None


def test_most_frequent_continuation_is_predicted_and_first_seen_wins_ties():
    storage = NGramStorage(2, 50)
    storage.add([5], [1, 2])
    assert storage.predict([5]) == 1
    storage.add([5], [2])
    assert storage.predict([5]) == 2
    assert storage.count([5], 2) == 2 and storage.count([5], 1) == 1


def test_update_counts_every_given_token_for_every_context_length():
    storage = NGramStorage(3, 50)
    storage.update(torch.tensor([[1, 2]]), torch.tensor([[7, 8, 8]]))
    assert storage.predict([2]) == 8 and storage.predict([1, 2]) == 8
    assert storage.has_gram(torch.tensor([1, 2, 7]))
    assert not storage.has_gram(torch.tensor([1, 2, 9]))


def test_next_token_returns_a_token_and_known_flag_per_row():
    storage = NGramStorage(3, 50)
    storage.initialize(torch.tensor([[3, 4, 5]]))
    token, known = storage.next_token(torch.tensor([[3, 4], [9, 9]]))
    assert token.shape == (2,) and known.tolist() == [True, False] and token[0].item() == 5
    assert 0 <= token[1].item() < 50


def test_reset_forgets_everything():
    for storage in (NGramStorage(3, 50), OneLevelNGramStorage(3, 50)):
        storage.add_sequence([1, 2, 3])
        storage.reset()
        assert storage.predict([1, 2]) is None
