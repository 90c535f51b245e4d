"""``drafting.assert_greedy_exact``, the helper a drafter's test calls, can fail: each drafter or loop
below breaks greedy exactness the way a real one could, and the helper must say so. A deterministic
drafter cannot break it by proposing bad tokens (the target's own token decides every position), so
what can break it is a drafter that touches what the loop owns (the sequence buffer, the tokens list)
or a loop that keeps what it should not."""
import pytest

from drafters import Drafter, RecyclingDrafter, write_drafts
from drafting import assert_greedy_exact


class LastMatch(Drafter):
    """Drafts what followed the latest earlier occurrence of the last token (issue 41's drafter)."""

    def propose(self, ids, tokens, k):
        for start in range(len(tokens) - 2, -1, -1):
            if tokens[start] == tokens[-1]:
                return write_drafts(ids, self.at(tokens), tokens[start + 1 : start + 1 + k]), None
        return 0, None

    def at(self, tokens):
        return len(tokens)


class OneEarly(LastMatch):
    """Writes its drafts one position early, over the last token (not yet in the target's cache)."""

    def at(self, tokens):
        return len(tokens) - 1


class RollsBackTheLoopsTokens(LastMatch):
    """Rolls back the rejected drafts from the loop's ``tokens`` (the output) instead of a copy of its own."""

    def accept(self, tokens, start, n_accepted, fetched):
        del tokens[start + n_accepted :]


RUN = r"cache \w+, gamma \d+, first_target (True|False): (new token \d+ is|the generation failed)"  # the helper's own failure


class Silent(Drafter):
    def propose(self, ids, tokens, k):
        return 0, None


def test_a_correct_drafter_passes_with_drafts_accepted_and_rejected():
    drafted, accepted = assert_greedy_exact(lambda prompt, config: LastMatch())
    assert 0 < accepted < drafted, "the drafts below must be partly rejected for the failures to show"


def test_a_drafter_that_writes_over_the_last_token_fails():
    with pytest.raises(AssertionError, match="target AR's is"):
        assert_greedy_exact(lambda prompt, config: OneEarly())


def test_a_drafter_that_rolls_back_the_loops_tokens_fails():
    """Here the loop may fail before the output differs (its cache and the shortened tokens disagree):
    the helper says which run, either way."""
    with pytest.raises(AssertionError, match=RUN):
        assert_greedy_exact(lambda prompt, config: RollsBackTheLoopsTokens())


def test_a_drafter_that_never_drafts_fails():
    with pytest.raises(AssertionError, match="never drafted"):
        assert_greedy_exact(lambda prompt, config: Silent(), models=("llama",), caches=("dynamic",), gammas=(2,))


def test_a_drafter_instance_is_refused():
    with pytest.raises(TypeError, match="fresh drafter"):
        assert_greedy_exact(LastMatch())


def test_a_loop_whose_rollback_keeps_a_rejected_draft_fails(monkeypatch):
    """The loop's side of a step: after a rejection the target's cache must drop the rejected drafts."""
    import sampling.entry
    from sampling.speculative_decoding import draft_and_verify

    def keeps_one_more(prompt, target, drafter, config):
        rollback = target.rollback
        target.rollback = lambda length: rollback(length + 1)  # keeps the first rejected draft's keys and values
        return draft_and_verify(prompt, target, drafter, config)

    monkeypatch.setattr(sampling.entry, "draft_and_verify", keeps_one_more)
    with pytest.raises(AssertionError, match=RUN):
        assert_greedy_exact(lambda prompt, config: LastMatch(), caches=("dynamic", "static"))


def test_tree_drafters_too():
    """``trees=True``: the tree loop, gamma the node budget; a tree drafter that rolls back the loop's tokens fails."""

    class Broken(RecyclingDrafter):
        def accept_tree(self, tokens, start, nodes, parents, path, fetched):
            super().accept_tree(tokens, start, nodes, parents, path, fetched)
            del tokens[start + len(path) :]  # the target's own token after the branch, gone

    drafted, accepted = assert_greedy_exact(lambda prompt, config: RecyclingDrafter(), trees=True, gammas=(4, 12),
                                            caches=("dynamic", "static"))
    assert 0 < accepted < drafted
    with pytest.raises(AssertionError, match=RUN):
        assert_greedy_exact(lambda prompt, config: Broken(), trees=True, gammas=(4, 12), caches=("dynamic", "static"))
