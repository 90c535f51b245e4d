"""Draft trees' sampled output follows the target's distribution: a fixed deterministic tree, a
drafter model's tree with probabilities (SpecInfer's rule) and the tree strategies pass a chi-square
test against exact enumeration, and the same test rejects two biased rules (its power check).
Greedy exactness and the tree pass itself: tests/test_trees.py."""
import functools

import pytest
import torch

from conftest import llama
from sampling import GenerationStats, tree_decoding
from sampling.config import GenerationConfig
from sampling.tree_decoding import draft_tree_and_verify
from test_lossless_sampling import LENGTH, PROMPT as TINY_PROMPT, chi_square_pvalue, exact_distribution
from test_trees import run_tree_strategy
from runners import KVCacheModel
from utils.logits_processor import MultinomialProcessor, TopKProcessor

# ---- the tree loop: sampled output follows the target's distribution ------------------------
# the power checks below see their biased rules at p 0 (a child accepted that the target did not sample)
# and 6e-45 (no residuals) with 500 generations, where they must be under 1e-6 (0 and 1e-124 at 1,000); the
# same seed, so the 500 are the first 500 of 1,000
RUNS = 500
SAMPLING = {"multinomial": MultinomialProcessor(1.0), "topk": TopKProcessor(0.8, 3)}


@pytest.fixture(scope="module")
def tiny():
    """A 4-token target and drafter model with clearly different distributions (as the lossless tests')."""
    return llama(vocab=4, init=0.3, seed=3), llama(vocab=4, init=0.3, seed=4)


@functools.lru_cache(maxsize=None)
def exact(target, name):
    return exact_distribution(target, SAMPLING[name])


def pvalue(samples, distribution) -> float:
    """The smaller of the chi-square p-values of the whole continuation and of its first token."""
    first = {}
    for cell, mass in distribution.items():
        first[cell[:1]] = first.get(cell[:1], 0.0) + mass
    return min(chi_square_pvalue(samples, distribution), chi_square_pvalue([s[:1] for s in samples], first))


class FanTree:
    """A fixed deterministic tree over the 4-token vocabulary: three children of the root, two below each."""

    cheap = True
    nodes = [0, 1, 2, 1, 3, 2, 0, 3, 1]
    parents = [-1, -1, -1, 0, 0, 1, 1, 2, 2]

    def propose_tree(self, tokens, budget):
        return self.nodes[:budget], self.parents[:budget]

    def fetch(self, target_probs):
        return None

    def accept_tree(self, tokens, start, nodes, parents, path, fetched):
        pass


class SampledTree:
    """A drafter model's tree with probabilities: ``width`` children of the root and of each of
    them, every child drawn independently from its parent's draft distribution (siblings may repeat)."""

    cheap = False

    def __init__(self, model, processor, width=2):
        self.model, self.processor, self.width = model, processor, width

    def q(self, contexts):
        """Draft distributions after each of ``contexts`` (equal lengths) ``[len(contexts), V]``, one pass."""
        return self.processor(self.model(torch.tensor(contexts)).logits[:, -1])

    def propose_tree_with_probs(self, tokens, budget):
        root = self.q([tokens])
        nodes = [int(t) for t in self.processor.sample(root.expand(self.width, -1))[:, 0]]
        middle = self.q([tokens + [t] for t in nodes])
        parents = [-1] * self.width
        for parent in range(self.width):
            nodes += [int(t) for t in self.processor.sample(middle[parent].expand(self.width, -1))[:, 0]]
            parents += [parent] * self.width
        leaves = torch.zeros((self.width * self.width, root.shape[-1]), dtype=root.dtype)  # no children: never read
        rows = [root, middle, leaves]
        return nodes, parents, torch.cat(rows)

    def fetch(self, target_probs):
        return None

    def accept_tree(self, tokens, start, nodes, parents, path, fetched):
        pass


def sample_tree_runs(target, drafter_factory, processor, runs=RUNS):
    torch.manual_seed(1234)
    samples, stats = [], GenerationStats()
    for _ in range(runs):
        config = GenerationConfig(processor=processor, max_gen_len=LENGTH, gamma=16, use_cache=True, first_target=False, stats=stats)
        samples.append(tuple(draft_tree_and_verify(list(TINY_PROMPT), KVCacheModel(target, True), drafter_factory(), config)))
    assert stats.accepted > runs // 4, "drafts must be accepted often for the test to mean anything"
    return samples


@pytest.mark.parametrize("name", ["topk"])  # multinomial: the tree strategies' test below
def test_sampled_deterministic_trees_follow_the_target(tiny, name):
    samples = sample_tree_runs(tiny[0], FanTree, SAMPLING[name])
    assert pvalue(samples, exact(tiny[0], name)) > 1e-3


@pytest.mark.parametrize("name", ["multinomial"])  # top-k: the deterministic trees' test above
def test_sampled_trees_with_probabilities_follow_the_target(tiny, name):
    target, model = tiny
    samples = sample_tree_runs(target, lambda: SampledTree(model, SAMPLING[name]), SAMPLING[name])
    assert pvalue(samples, exact(target, name)) > 1e-3


@pytest.mark.parametrize("strategy", ["tree_ngram", "recycling", "tree_copy"])
def test_sampled_tree_strategies_follow_the_target(tiny, strategy):
    target = tiny[0]
    torch.manual_seed(1234)
    stats = GenerationStats()
    samples = [tuple(run_tree_strategy(strategy, target, True, stats=stats, processor=SAMPLING["multinomial"], size=8,
                                       length=LENGTH, prompt=TINY_PROMPT)) for _ in range(RUNS)]
    assert stats.accepted > 0
    assert pvalue(samples, exact(target, "multinomial")) > 1e-3


def accept_first_child_anyway(nodes, children, own):
    """A wrong rule: where the target's sample matches no child, the first child is accepted all the same."""
    path, row = [], 0
    while children[row]:
        match = next((c for c in children[row] if nodes[c] == own[row]), children[row][0])
        path.append(match)
        row = match + 1
    return path


def test_the_chi_square_test_rejects_accepting_a_child_the_target_did_not_sample(tiny, monkeypatch):
    monkeypatch.setattr(tree_decoding, "walk_by_tokens", accept_first_child_anyway)
    samples = sample_tree_runs(tiny[0], FanTree, SAMPLING["multinomial"])
    assert pvalue(samples, exact(tiny[0], "multinomial")) < 1e-6


def test_the_chi_square_test_rejects_the_multi_candidate_rule_without_residuals(tiny, monkeypatch):
    """Siblings tried against p itself and rejections corrected from p (no norm(max(0, r - q))): biased."""
    monkeypatch.setattr(tree_decoding, "_residual", lambda p, q: p)
    target, model = tiny
    samples = sample_tree_runs(target, lambda: SampledTree(model, SAMPLING["multinomial"]), SAMPLING["multinomial"])
    assert pvalue(samples, exact(target, "multinomial")) < 1e-6
