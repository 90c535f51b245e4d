"""The copy tree (strategy ``tree_copy``, ``drafters/copy_tree.py``): its shape on fixed sequences
(siblings from distinct occurrences, ranked by backward match, the best one continued), its index
against a plain scan, and its gate in the tree loop: each node estimated by its evidence, a tree cut
to no node probed after ``next_pause`` such steps, so that a gate cut to zero recovers when the copy
returns (and stays at zero without the probe). Greedy exactness and sampled losslessness: tests/test_trees.py
and tests/test_trees_sampled.py."""
import random

from drafters import CopyTreeDrafter, CopyTreeSpec, Drafter
from drafters.copy_tree import copy_tree, occurrences
from sampling import DraftPolicy
from sampling.tree_decoding import TreeRecord, _children, _proposal

# the last token 3 occurs at 2 (after 1 2: match 3), 6 and 9 (after 2: match 2 each; 9 the more recent)
SEQ = [1, 2, 3, 9, 5, 2, 3, 7, 2, 3, 8, 4, 1, 2, 3]
# the last token 3 occurs at 1 (after 4: match 2), 4 and 7 (match 1); 1's and 4's next tokens are both 9
SAME_NEXT = [4, 3, 9, 6, 3, 9, 7, 3, 8, 5, 4, 3]
COSTS = (1.0, 1.1, 1.15, 1.2, 1.3, 1.4, 1.6, 1.8)


def test_occurrences_rank_the_longest_backward_match_first_the_most_recent_on_a_tie():
    assert occurrences(SEQ) == [(3, 2), (2, 9), (2, 6)]
    assert occurrences(SEQ, cap=2) == [(2, 9), (2, 6), (2, 2)]  # capped: all tie, the most recent first
    assert occurrences([5, 6, 7]) == []


def test_siblings_are_the_best_occurrences_distinct_next_tokens_and_the_best_is_continued():
    nodes, parents, evidence = copy_tree(SEQ, occurrences(SEQ), width=3, depth=3)
    assert (nodes, parents, evidence) == ([9, 8, 7, 5, 2], [-1, -1, -1, 0, 3], [3, 2, 2, 3, 3])
    # an occurrence whose next token is taken already adds no sibling: the next distinct one does
    nodes, parents, evidence = copy_tree(SAME_NEXT, occurrences(SAME_NEXT), width=3, depth=3)
    assert (nodes, parents, evidence) == ([9, 8, 6, 3], [-1, -1, 0, 2], [2, 1, 2, 2])
    assert copy_tree(SEQ, occurrences(SEQ), width=1, depth=1) == ([9], [-1], [3])
    assert copy_tree([5, 6, 7], [], 3, 3) == ([], [], [])


def test_the_drafter_proposes_a_prefix_of_the_tree_within_its_budget_with_each_nodes_evidence():
    drafter = CopyTreeDrafter(SEQ[:6], width=3, depth=3)
    assert drafter.supports_trees and drafter.tree_evidence
    assert drafter.propose_tree(SEQ, 16) == ([9, 8, 7, 5, 2], [-1, -1, -1, 0, 3])
    assert drafter.evidence() == [3, 2, 2, 3, 3]
    assert drafter.propose_tree(SEQ, 4) == ([9, 8, 7, 5], [-1, -1, -1, 0]) and drafter.evidence() == [3, 2, 2, 3]
    assert CopyTreeSpec(tree_size=5).make(SEQ, None, None, None).depth == 3  # tree_size - width + 1


def test_the_index_finds_what_a_scan_of_the_whole_context_finds():
    rng = random.Random(7)
    tokens = [rng.randrange(4) for _ in range(30)]
    drafter = CopyTreeDrafter(tokens[:5], width=4, depth=5)
    for end in range(6, len(tokens) + 1):
        context = tokens[:end]
        drafter.propose_tree(context, 64)
        assert (drafter.propose_tree(context, 64), drafter.evidence()) == (
            copy_tree(context, occurrences(context), 4, 5)[:2], copy_tree(context, occurrences(context), 4, 5)[2])


class Fixed(Drafter):
    """The same three-node tree every step (two siblings, one continued), each node backed by a match of 4."""

    supports_trees = True
    tree_evidence = True

    def propose_tree(self, tokens, budget):
        return [7, 8, 9], [-1, -1, 0]

    def evidence(self):
        return [4, 4, 4]


def gated_policy() -> DraftPolicy:
    policy = DraftPolicy(row_costs=COSTS, min_gain=1.0)
    policy.start(16, cheap=True, evidence=True)
    assert policy.gated
    return policy


def steps_until_a_tree_pays(policy: DraftPolicy, record: TreeRecord, steps: int = 60) -> tuple:
    """Step the proposal with a target that accepts node 0 whenever it is verified (the copy is back):
    (steps cut to no node, probes, the first step whose tree the estimates chose, or None)."""
    empty = probes = 0
    drafter = Fixed()
    for step in range(steps):
        probing = policy.probes()
        nodes, parents, _, _, evidence, _ = _proposal(drafter, [1, 2, 3], 16, 64, policy, record, False)
        if not nodes:
            empty += 1
            continue
        if probing and nodes == [7]:
            probes += 1
        else:
            return empty, probes, step
        record.update(_children(parents), [0], evidence)  # node 0 (token 7) accepted, then the target's own token
    return empty, probes, None


def failed_record() -> TreeRecord:
    """A record whose trees of these shapes and evidence were all rejected at the root, many times."""
    record = TreeRecord()
    for _ in range(30):
        record.update(_children([-1, -1, 0]), [], [4, 4, 4])
    return record


def test_a_gate_cut_to_zero_probes_and_recovers_when_the_copy_returns():
    policy, record = gated_policy(), failed_record()
    before = record.rate(0, 1, 4)
    empty, probes, recovered = steps_until_a_tree_pays(policy, record)
    assert empty >= policy.pause_steps  # cut to nothing: the estimates say no node pays
    assert probes >= 1 and recovered is not None, (empty, probes, recovered)
    assert record.rate(0, 1, 4) > 10 * before  # the evidence's cell learned from the probes


def test_without_the_probe_a_gate_cut_to_zero_stays_there(monkeypatch):
    policy, record = gated_policy(), failed_record()
    monkeypatch.setattr(DraftPolicy, "probes", lambda self: False)
    assert steps_until_a_tree_pays(policy, record) == (60, 0, None)


def test_the_probe_is_every_next_pause_th_empty_step_and_only_for_a_gated_policy():
    policy, record = gated_policy(), failed_record()
    verified = [bool(_proposal(Fixed(), [1, 2, 3], 16, 64, policy, record, False)[0]) for _ in range(3 * (policy.pause_steps + 1))]
    assert [i for i, v in enumerate(verified) if v] == [policy.pause_steps, 2 * policy.pause_steps + 1, 3 * policy.pause_steps + 2]
    ungated = DraftPolicy(row_costs=COSTS, min_gain=1.0)
    ungated.start(16, cheap=True, evidence=False)
    assert not any(_proposal(Fixed(), [1, 2, 3], 16, 64, ungated, failed_record(), False)[0] for _ in range(20))


def test_evidence_keys_the_estimates_a_longer_match_never_below_a_shorter_one():
    record = TreeRecord()
    for hit in (True, True, True, False):  # matches of 8 accepted three times in four
        record.update(_children([-1]), [0] if hit else [], [8])
    for _ in range(4):  # matches of 1 never
        record.update(_children([-1]), [], [1])
    assert record.rate(0, 1, 8) > record.rate(0, 1) > record.rate(0, 1, 1)
    assert record.rate(0, 1, 16) >= record.rate(0, 1, 8)  # a bucket not seen yet starts from the shorter ones' best
