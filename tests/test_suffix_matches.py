"""The suffix drafter's match lengths asked by bisection (``suffix_tree.continued``, issue 71: a step's lookup no longer
asks each of the depth's lengths). Property: the lengths whose node has a child are exactly ``1..continued``, and the
draft (path or tree) is the one asking every length gives, on the trie's own suffixes and on a global memory's."""
from typing import List

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from drafters.suffix_tree import SuffixTrie, best_match_path, best_match_tree, continued

texts = st.lists(st.integers(0, 5), min_size=1, max_size=80)  # a small alphabet: many repeats


def memory_matches(memory: SuffixTrie, context: List[int]) -> List[int]:
    matches = [0]
    for token in context:
        memory.follow(matches, token)
    return matches


@settings(max_examples=examples(200))
@given(texts, texts, st.integers(1, 10), st.integers(1, 12), st.sampled_from([0.5, 1.0, 2.0]), st.sampled_from([0.0, 1.0]),
       st.sampled_from([0.0, 0.1, 0.4]))
def test_bisected_match_lengths_draft_what_every_length_drafts(text, other, depth, most, factor, offset, cut):
    trie, memory = SuffixTrie(depth), SuffixTrie(depth)
    trie.extend(text)
    memory.extend(other)
    memory.start()
    memory.extend(text[: len(text) // 2])
    for tried, matches in ((trie, trie.active), (memory, memory_matches(memory, text))):
        top = continued(tried, matches)
        assert [tried.best[matches[j]] >= 0 for j in range(1, len(matches))] == [j <= top for j in range(1, len(matches))]
        every = len(matches) - 1  # the rule before the bisection: every length asked, longest first
        assert best_match_path(tried, matches, most, factor, offset, cut) == best_match_path(tried, matches, most, factor, offset, cut, every)
        assert best_match_tree(tried, matches, most, factor, offset, cut) == best_match_tree(tried, matches, most, factor, offset, cut, every)


def test_open_text_asks_few_lengths():
    """Distinct tokens after a short repeat: of the depth's 24 suffix nodes only the repeat's have a child."""
    trie = SuffixTrie(24)
    trie.extend(list(range(100, 130)) + [7, 8, 9] + list(range(200, 230)) + [7, 8])
    assert continued(trie, trie.active) == 2 and len(trie.active) == 25
    # "7 8" seen twice, once followed by "9 200": each of the two at 1/2, within the match's budget of 2
    assert best_match_path(trie, trie.active, 4, 1.0, 0.0, 0.1) == ([9, 200], 1.0, 2)
