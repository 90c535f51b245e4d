"""The merged draft tree (``drafters/merged.py``) and the tree-or-chain choice (``sampling/tree_shape.py``):
greedy exact against target AR, sampling lossless (chi-square with a power check), the merge keeps
one node per shared prefix within the budget, the step verifies its chain where the injected pass
costs make the tree not pay and the tree where it pays, and the per-source counts add up."""
import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import examples, llama, perturbed_copy
from drafters.base import Drafter
from drafters.merged import merge
from ngram_assisted import NGramStorage
from drafters import DraftContext, MergedSpec
from sampling import DraftPolicy, GenerationStats, autoregressive_generate, generate, tree_decoding
from sampling.config import GenerationConfig
from sampling.tree_decoding import draft_tree_and_verify
from sampling.tree_shape import best_chain, choose_nodes
from test_lossless_sampling import LENGTH, PROMPT as TINY_PROMPT
from test_trees_sampled import SAMPLING, accept_first_child_anyway, exact, pvalue
from runners import KVCacheModel, RunnerConfig

GEN = 30
COSTS = (1.0, 1.1, 1.15, 1.2, 1.3, 1.4, 1.6, 1.8)
STEEP = tuple(float(r) for r in range(1, 17))  # every position costs a whole pass: only a sure draft pays
FLAT = (1.0,) * 16  # extra positions are free: the widest tree pays most


@functools.lru_cache(maxsize=None)
def target():
    return llama(seed=0)


@functools.lru_cache(maxsize=None)
def drafter_model():
    return perturbed_copy(target(), 0.2, 1)


@functools.lru_cache(maxsize=None)
def reference(prompt: tuple, length: int = GEN):
    return autoregressive_generate(list(prompt), target(), max_gen_len=length, eos_tokens_id=[], use_cache=False)


def run_merged(prompt, with_model=False, use_cache=True, costs=None, size=12, stats=None, length=GEN, eos=(), cache=None):
    policy = DraftPolicy(row_costs=costs) if costs is not None else None
    context = DraftContext(storage=NGramStorage(3, target().config.vocab_size), drafter=drafter_model() if with_model else None)
    return generate(list(prompt), target(), MergedSpec(tree_size=size), dict(
        max_gen_len=length, eos_tokens_id=list(eos), use_cache=use_cache, stats=stats, policy=policy, runner=RunnerConfig(cache=cache)),
        context)[0]


prompts = st.lists(st.integers(0, 95), min_size=3, max_size=12).map(lambda p: p + p[:4])  # a repeat: the suffix and n-grams draft


@settings(max_examples=examples(8), suppress_health_check=[HealthCheck.too_slow])
@given(prompt=prompts, with_model=st.booleans(), cache=st.sampled_from(["static", "dynamic", "off"]),
       costs=st.sampled_from([None, COSTS, STEEP]), size=st.integers(1, 16))
def test_merged_is_greedy_exact(prompt, with_model, cache, costs, size):
    stats = GenerationStats()
    out = run_merged(prompt, with_model, use_cache=cache != "off", costs=costs, size=size, stats=stats,
                     cache=None if cache == "off" else cache)
    assert out == reference(tuple(prompt))
    assert sum(stats.accepted_by.values()) == stats.accepted


@pytest.mark.parametrize("with_model", [False, True])
def test_per_source_counts_add_up_to_the_accepted_total_also_when_a_stop_token_ends_a_branch(with_model):
    prompt = [5, 17, 33, 5, 17, 40, 2, 9, 5, 17, 33, 71]
    full = reference(tuple(prompt))
    eos = full[len(full) // 2]  # a token the greedy output reaches: the stop step skips accept_tree
    stats = GenerationStats()
    out = run_merged(prompt, with_model, stats=stats, eos=(eos,))
    assert out == full[: full.index(eos) + 1]
    assert stats.accepted > 0 and sum(stats.accepted_by.values()) == stats.accepted
    assert set(stats.accepted_by) <= {"suffix", "ngram", "recycling", "model"}
    if with_model:
        assert stats.accepted_by.get("model", 0) > 0  # a close drafter model pays for some of the tree


# ---- sampling: lossless by the tree loop's rule for deterministic drafts ------------------------
RUNS = 500  # the power check (a child accepted that the target did not sample) sees it at p 0, as at 1,000


def sampled_merged(tiny, runs=RUNS):
    target_model, model = tiny
    torch.manual_seed(1234)
    stats = GenerationStats()
    common = dict(logits_processor=SAMPLING["multinomial"], max_gen_len=LENGTH, eos_tokens_id=[], use_cache=True, stats=stats)
    samples = [tuple(generate(list(TINY_PROMPT), target_model, MergedSpec(tree_size=8), common,
                              DraftContext(storage=NGramStorage(2, 4), drafter=model))[0]) for _ in range(runs)]
    assert stats.accepted > runs // 4, "drafts must be accepted often for the test to mean anything"
    return samples


@pytest.fixture(scope="module")
def tiny():
    return llama(vocab=4, init=0.3, seed=3), llama(vocab=4, init=0.3, seed=4)


def test_sampled_merged_trees_follow_the_target(tiny):
    assert pvalue(sampled_merged(tiny), exact(tiny[0], "multinomial")) > 1e-3


def test_the_chi_square_test_rejects_a_merged_tree_that_accepts_a_child_the_target_did_not_sample(tiny, monkeypatch):
    monkeypatch.setattr(tree_decoding, "walk_by_tokens", accept_first_child_anyway)
    assert pvalue(sampled_merged(tiny), exact(tiny[0], "multinomial")) < 1e-6


# ---- the merge: shared prefixes once, the budget kept, best first --------------------------------
@st.composite
def source_trees(draw):
    """A source's branches: token paths over a 3-token alphabet (so sources share prefixes), parents first."""
    paths, out = [], []
    for _ in range(draw(st.integers(0, 10))):
        parent = draw(st.sampled_from([()] + paths))
        path = parent + (draw(st.integers(0, 2)),)
        if path not in paths:
            paths.append(path)
            out.append((path, draw(st.floats(0.0, 1.0))))
    return out


@settings(max_examples=examples(60))
@given(proposals=st.dictionaries(st.sampled_from(["suffix", "ngram", "recycling", "model"]), source_trees(), max_size=4),
       factors=st.lists(st.floats(0.1, 3.0), min_size=4, max_size=4), budget=st.integers(1, 20))
def test_the_merge_keeps_each_shared_prefix_once_within_the_budget_best_first(proposals, factors, budget):
    factor = dict(zip(["suffix", "ngram", "recycling", "model"], factors))
    nodes, parents, estimates, scores = merge(proposals, factor, budget)
    proposed = {path for branches in proposals.values() for path, _ in branches}
    paths = []
    for token, parent in zip(nodes, parents):
        assert parent < len(paths)  # parents before children: every prefix is a tree
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    assert len(nodes) <= budget and len(set(paths)) == len(paths)  # each shared prefix once
    assert set(paths) <= proposed and len(paths) == min(budget, len(proposed))
    assert estimates == sorted(estimates, reverse=True)
    for path, estimate in zip(paths, estimates):  # the best calibrated estimate of any source, times its parent's
        best = max(min(1.0, factor[s] * score) for s, score in scores[path].items())
        above = estimates[paths.index(path[:-1])] if len(path) > 1 else 1.0
        assert estimate == pytest.approx(best * above)


# ---- the tree or its chain, by the injected pass costs ------------------------------------------
FAN_THEN_CHAIN = ([1, 2, 3, 4, 5, 6], [-1, -1, -1, 0, 3, 4])
SURE_CHAIN = [0.95, 0.3, 0.3, 0.9, 0.85, 0.8]  # path estimates: node 0 then 3, 4, 5 are near sure


def test_the_chain_is_chosen_where_the_pass_cost_makes_the_tree_not_pay_and_the_tree_where_it_pays():
    parents = FAN_THEN_CHAIN[1]
    steep = DraftPolicy(row_costs=(1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4))
    assert choose_nodes(steep, SURE_CHAIN, parents) == [0, 3, 4, 5]  # the siblings cost more than they give
    assert best_chain(steep, SURE_CHAIN, parents)[0] == [0, 3, 4, 5]
    assert choose_nodes(DraftPolicy(row_costs=FLAT), SURE_CHAIN, parents) == list(range(6))  # free positions: the whole tree
    assert choose_nodes(DraftPolicy(row_costs=STEEP), [0.3] * 6, parents) == []  # nothing pays: a plain step
    assert choose_nodes(DraftPolicy(), SURE_CHAIN, parents) == list(range(6))  # no costs measured: the proposal


class FixedTree(Drafter):
    """A deterministic tree with its own estimates; records the shape of every verified tree."""

    supports_trees = True

    def __init__(self):
        self.verified = []

    def propose_tree(self, tokens, budget):
        return FAN_THEN_CHAIN[0][:budget], FAN_THEN_CHAIN[1][:budget]

    def estimates(self):
        return SURE_CHAIN

    def accept_tree(self, tokens, start, nodes, parents, path, fetched):
        self.verified.append(list(parents))


@pytest.mark.parametrize("costs, chains", [((1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4), True), (FLAT, False)])
def test_the_tree_loop_verifies_the_chain_form_when_the_tree_does_not_pay(costs, chains):
    drafter = FixedTree()
    config = GenerationConfig(max_gen_len=12, gamma=16, use_cache=True, first_target=False, policy=DraftPolicy(row_costs=costs))
    out = draft_tree_and_verify(list(TINY_PROMPT), KVCacheModel(llama(vocab=8, seed=5), True), drafter, config)
    assert out == autoregressive_generate(list(TINY_PROMPT), llama(vocab=8, seed=5), max_gen_len=12, eos_tokens_id=[])
    assert drafter.verified
    is_chain = [all(p == i - 1 for i, p in enumerate(parents)) for parents in drafter.verified]
    assert all(is_chain) if chains else not any(is_chain)


def test_the_merged_row_is_in_the_table_the_repl_and_the_benchmark(tiny_models, tmp_path):
    import json

    import bench
    from strategies import BY_KEY

    row = BY_KEY["merged"]
    assert row.trees and row.takes_storage and row.suffix
    out = tmp_path / "merged"
    bench.main(["--target", tiny_models["target"], "--device", "cpu", "--limit", "1", "--categories", "summarization",
                "--strategies", "target,merged", "--tree-size", "8", "--max-new-tokens", "8", "--out", str(out)])
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert {r["key"] for r in records} == {"target", "merged"}
    assert all(r["diverged_at"] is None for r in records)
    merged = [r for r in records if r["key"] == "merged"]
    assert all(sum((r["accepted_by"] or {}).values()) == r["accepted"] for r in merged)


def test_the_repl_toggles_the_merged_tree_and_shows_which_source_paid(tiny_models):
    from repl_driver import run

    result = run("--target", tiny_models["target"], "--no-calibrate",
                 stdin="/merged\n/length 12\nHello there, hello there, hello there\n/stats\n")
    assert result.returncode == 0, result.stderr
    assert "Merged tree (suffix, n-gram, recycling, drafter): on" in result.stdout
    table = result.stdout[result.stdout.index("Target AR") :]
    assert "Merged tree" in table


def test_a_merged_trees_drafts_are_its_models_passes_and_the_other_sources_are_host_work():
    """What the tree loop prices a draft each (``Drafter.tree_drafts``): the drafter model's passes for the tree
    (one a depth), whatever the suffix and n-gram sources add; none without a model (a cheap tree)."""
    prompt = [5, 17, 33, 5, 17, 40, 2, 9, 5, 17, 33]
    config = GenerationConfig(use_cache=True, trees=True, gamma=12)
    for model, passes in ((drafter_model(), 3), (None, 0)):
        context = DraftContext(storage=NGramStorage(3, target().config.vocab_size), drafter=model)
        drafter = MergedSpec(tree_size=12, model_depth=3).make(prompt, target(), config, context)
        before = drafter.model.runner.forward_passes if model is not None else 0
        nodes, parents = drafter.propose_tree(prompt, 12)
        assert nodes and drafter.cheap == (model is None)
        assert drafter.tree_drafts(parents) == passes == (drafter.model.runner.forward_passes - before if model is not None else 0)
