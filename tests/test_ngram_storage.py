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


def _drafts(drafter, tokens, k):
    ids = torch.zeros((1, len(tokens) + k), dtype=torch.long)
    ids[0, : len(tokens)] = torch.tensor(tokens)
    count, _ = drafter.propose(ids, list(tokens), k)
    return ids[0, len(tokens) : len(tokens) + count].tolist()


def test_a_fresh_storage_drafts_the_prompts_continuation_after_one_matching_token():
    from drafters.ngram import ngram_drafter

    prompt = [5, 11, 12, 13, 14, 6]
    drafter = ngram_drafter(NGramStorage(8, 50), prompt, stop_if_unknown=True)
    assert _drafts(drafter, prompt + [11], 4) == [12, 13, 14, 6]  # backs off to the one token it knows
    assert _drafts(drafter, prompt + [42], 4) == []  # unknown: the draft ends (stop_if_unknown)


def test_a_longer_context_keeps_a_copy_a_two_token_context_cuts_short():
    from drafters.ngram import ngram_drafter

    # "1 2" is followed by 3 twice and by 4 once; the copy after "7 1 2" goes on with 4
    prompt = [9, 1, 2, 3, 8, 1, 2, 3, 8, 7, 1, 2, 4, 5, 6, 0]
    tokens = prompt + [7, 1, 2]
    short = ngram_drafter(NGramStorage(3, 50), prompt, stop_if_unknown=True)
    long = ngram_drafter(NGramStorage(8, 50), prompt, stop_if_unknown=True)
    assert _drafts(short, tokens, 4)[0] == 3
    assert _drafts(long, tokens, 4) == [4, 5, 6, 0]
    assert long.evidence() == [3, 4, 5, 6]  # each draft's matched context: a copy, not a guess


def test_the_emitted_tokens_are_in_the_storage_before_the_next_draft():
    from drafters.ngram import ngram_drafter

    prompt = [1, 2, 3]
    drafter = ngram_drafter(NGramStorage(8, 50), prompt, filler_top_k=1, stop_if_unknown=True)
    tokens = prompt + [20, 21, 22]  # a step emitted 20 21 (accepted drafts) and 22 (the target's own)
    drafter.accept(tokens, len(prompt), 2, None)
    tokens += [3]
    assert _drafts(drafter, tokens, 4) == [20, 21, 22]  # then nothing is known after 22
    assert _drafts(drafter, prompt[:1] + [2, 3, 20], 2) == [21, 22]
