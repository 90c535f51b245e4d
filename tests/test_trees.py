"""Draft trees verified in one target pass: the tree pass scores each node as a chain pass over
its branch would, the kept branch leaves the cache a fresh one would be, and the tree loop is
greedy exact. Sampled losslessness (chi-square against exact enumeration, with a power check):
tests/test_trees_sampled.py."""
import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from transformers import Qwen2Config, Qwen2ForCausalLM

from conftest import examples, gpt2, llama
from ngram_assisted import NGramStorage
from sampling import DraftPolicy, GenerationStats, autoregressive_generate, generate
from sampling.config import GenerationConfig
from drafters import CopyTreeSpec, DraftContext, NGramDrafter, NGramTreeSpec, RecyclingSpec
from sampling.chain_decoding import draft_and_verify
from sampling.tree_decoding import draft_tree_and_verify
from runners import KVCacheModel, RunnerConfig, tree_depths
from utils.logits_processor import GreedyProcessor, MultinomialProcessor

PROMPT = [5, 17, 33, 5, 17, 40, 2, 9]
# (nodes, parents): a chain, a fan, a deep tree with siblings at every level
TREES = {
    "chain": ([3, 4, 5], [-1, 0, 1]),
    "fan": ([3, 4, 5, 6], [-1, -1, -1, -1]),
    "deep": ([3, 4, 7, 5, 8, 9, 1], [-1, -1, 0, 0, 1, 3, 5]),
}


def qwen2(vocab=96, seed=0):
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
    return Qwen2ForCausalLM(config).to(torch.float64).eval()


MODELS = {"llama": llama, "qwen2": qwen2, "gpt2": gpt2}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    return MODELS[request.param]()


def branch(nodes, parents, i):
    """Node indices from the root's child down to node ``i``."""
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


def fresh_logits(model, tokens, n_last=1):
    return KVCacheModel(model, use_cache=False)(torch.tensor([tokens]), n_last)


@pytest.mark.parametrize("cache", ["static", "dynamic", "off"])
@pytest.mark.parametrize("tree", sorted(TREES))
def test_a_tree_pass_scores_every_node_as_a_chain_pass_over_its_branch(model, tree, cache):
    nodes, parents = TREES[tree]
    runner = KVCacheModel(model, use_cache=cache != "off", cache=None if cache == "off" else cache)
    ids = torch.tensor([PROMPT])
    runner(ids[:, :5], 1)  # part of the prefix cached, the rest fed with the tree
    logits = runner.tree_pass(ids, len(PROMPT), nodes, parents)
    assert logits.shape == (1 + len(nodes), model.config.vocab_size)
    assert torch.allclose(logits[0], fresh_logits(model, PROMPT)[0], atol=1e-8)
    for i in range(len(nodes)):
        chain = PROMPT + [nodes[j] for j in branch(nodes, parents, i)]
        assert torch.allclose(logits[1 + i], fresh_logits(model, chain)[0], atol=1e-8), (tree, i)


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("tree", sorted(TREES))
def test_after_keep_branch_decoding_goes_on_as_from_a_fresh_cache(model, tree, cache):
    nodes, parents = TREES[tree]
    ids = torch.zeros((1, 40), dtype=torch.long)
    ids[0, : len(PROMPT)] = torch.tensor(PROMPT)
    for leaf in range(len(nodes)):
        runner = KVCacheModel(model, use_cache=True, cache=cache)
        runner.tree_pass(ids, len(PROMPT), nodes, parents)
        path = branch(nodes, parents, leaf)
        runner.keep_branch(len(PROMPT), path)
        assert runner.cached == len(PROMPT) + len(path)
        accepted = PROMPT + [nodes[j] for j in path] + [11, 12]
        ids[0, : len(accepted)] = torch.tensor(accepted)
        # two more positions after the kept branch, then a second tree on top
        assert torch.allclose(runner(ids[:, : len(accepted)], 2), fresh_logits(model, accepted, 2), atol=1e-8), (tree, leaf)
        again = runner.tree_pass(ids, len(accepted), nodes, parents)
        deepest = accepted + [nodes[j] for j in branch(nodes, parents, len(nodes) - 1)]
        assert torch.allclose(again[-1], fresh_logits(model, deepest)[0], atol=1e-8)
        ids[0, len(PROMPT) :] = 0


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_float32_tree_logits_match_chain_logits_to_rounding(attention):
    model = llama().to(torch.float32)
    model.set_attn_implementation(attention)
    nodes, parents = TREES["deep"]
    runner = KVCacheModel(model, use_cache=True, cache="dynamic")
    logits = runner.tree_pass(torch.tensor([PROMPT]), len(PROMPT), nodes, parents)
    for i in range(len(nodes)):
        chain = PROMPT + [nodes[j] for j in branch(nodes, parents, i)]
        assert torch.allclose(logits[1 + i], fresh_logits(model, chain)[0], atol=1e-4)


def test_bad_trees_and_models_are_refused_in_one_line():
    from conftest import t5
    from test_control_combinations import mistral

    with pytest.raises(ValueError, match="earlier node"):
        tree_depths([-1, 1])
    with pytest.raises(ValueError, match="sliding-window"):
        KVCacheModel(mistral(), use_cache=True).tree_pass(torch.tensor([PROMPT]), len(PROMPT), [1], [-1])
    with pytest.raises(ValueError, match="encoder-decoder"):
        KVCacheModel(t5(), use_cache=True, encoder_input_ids=PROMPT).tree_pass(torch.tensor([[0]]), 1, [1], [-1])


# ---- the tree loop: greedy exact --------------------------------------------------------------
GEN = 40
LONG_PROMPT = [5, 17, 33, 5, 17, 40, 2, 9, 5, 17, 33, 71]
COSTS = (1.0, 1.1, 1.15, 1.2, 1.3, 1.4, 1.6, 1.8)


@functools.lru_cache(maxsize=None)
def reference(name: str):
    return autoregressive_generate(LONG_PROMPT, MODELS[name](), max_gen_len=GEN, eos_tokens_id=[], use_cache=False)


@functools.lru_cache(maxsize=None)
def target_of(name: str):
    return MODELS[name]()


def run_tree_strategy(strategy, model, use_cache, policy=None, stats=None, processor=GreedyProcessor(), size=12, length=GEN, prompt=LONG_PROMPT,
                      cache=None):
    common = dict(logits_processor=processor, max_gen_len=length, eos_tokens_id=[], use_cache=use_cache, policy=policy, stats=stats,
                  runner=RunnerConfig(cache=cache))
    if strategy == "tree_ngram":
        context = DraftContext(storage=NGramStorage(3, model.config.vocab_size))
        return generate(list(prompt), model, NGramTreeSpec(tree_size=size), common, context)[0]
    if strategy == "tree_copy":  # gated by its nodes' evidence when the policy has costs
        return generate(list(prompt), model, CopyTreeSpec(tree_size=size), common)[0]
    return generate(list(prompt), model, RecyclingSpec(tree_size=size), common)[0]


@pytest.mark.parametrize("cache", ["static", "dynamic", "off"])
@pytest.mark.parametrize("strategy", ["tree_ngram", "recycling", "tree_copy"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_tree_strategies_are_greedy_exact(name, strategy, cache):
    model = target_of(name)
    accepted = 0
    for policy in (None, DraftPolicy(row_costs=COSTS, min_gain=1.0)):
        stats = GenerationStats()
        assert run_tree_strategy(strategy, model, cache != "off", policy, stats, cache=None if cache == "off" else cache) == reference(name), policy
        accepted += stats.accepted
    assert accepted > 0 or name != "llama", "some drafts must be accepted for the test to mean anything"


class OracleTree:
    """Proposes a given tree shape whose nodes are right (the greedy continuation at their depth)
    or wrong as told: exercises any shape, any place of the right branch among its siblings."""

    cheap = True

    def __init__(self, parents, right, continuation, vocab):
        self.parents, self.right, self.continuation, self.vocab = parents, right, continuation, vocab
        self.depths = tree_depths(parents)

    def propose_tree(self, tokens, budget):
        cur, nodes = len(tokens), []
        for i, (parent, good, depth) in enumerate(zip(self.parents, self.right, self.depths)):
            truth = self.continuation[cur + depth] if cur + depth < len(self.continuation) else 0
            nodes.append(truth if good else (truth + 1 + i) % self.vocab)
        return nodes[:budget], self.parents[:budget]

    def fetch(self, target_probs):
        return None

    def accept_tree(self, tokens, start, nodes, parents, path, fetched):
        pass


@st.composite
def trees(draw):
    size = draw(st.integers(1, 10))
    parents = [draw(st.integers(-1, i - 1)) for i in range(size)]
    return parents, [draw(st.booleans()) for _ in range(size)]


@settings(max_examples=examples(40), suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(tree=trees(), cache=st.sampled_from(["static", "dynamic", "off"]), costs=st.booleans())
def test_any_tree_shape_is_greedy_exact(tree, cache, costs):
    parents, right = tree
    model = target_of("llama")
    expected = reference("llama")
    drafter = OracleTree(parents, right, LONG_PROMPT + expected, model.config.vocab_size)
    policy = DraftPolicy(row_costs=COSTS) if costs else DraftPolicy()
    config = GenerationConfig(max_gen_len=GEN, gamma=len(parents), use_cache=cache != "off", policy=policy)
    runner = KVCacheModel(model, use_cache=cache != "off", cache=None if cache == "off" else cache)
    assert draft_tree_and_verify(list(LONG_PROMPT), runner, drafter, config) == expected


class ChainAsTree(NGramDrafter):
    """An n-gram drafter whose tree is its chain (each node the child of the one before)."""

    def propose_tree(self, tokens, budget):
        ids = torch.zeros((1, len(tokens) + budget), dtype=torch.long)
        count, _ = self.propose(ids, tokens, budget)
        return ids[0, len(tokens) : len(tokens) + count].tolist(), list(range(-1, count - 1))


@pytest.mark.parametrize("processor", [GreedyProcessor(), MultinomialProcessor(1.0)], ids=["greedy", "multinomial"])
def test_a_tree_that_is_a_chain_gives_the_chain_loops_tokens(processor):
    greedy = isinstance(processor, GreedyProcessor)
    model = target_of("llama") if greedy else llama(vocab=4, init=0.3, seed=3)  # sampled drafts accepted often
    outputs = []
    for loop, drafter_type in ((draft_and_verify, NGramDrafter), (draft_tree_and_verify, ChainAsTree)):
        storage = NGramStorage(3, model.config.vocab_size)
        storage.add_sequence([t % model.config.vocab_size for t in LONG_PROMPT])
        drafter = drafter_type(storage, filler_top_k=3 if greedy else 1, stop_if_unknown=True)
        stats = GenerationStats()
        config = GenerationConfig(processor=processor, max_gen_len=GEN, gamma=4, use_cache=True, stats=stats)
        torch.manual_seed(5)
        prompt = [t % model.config.vocab_size for t in LONG_PROMPT]
        outputs.append((loop(prompt, KVCacheModel(model, True), drafter, config), stats.accepted, stats.target_forward_passes))
    assert outputs[0] == outputs[1] and outputs[0][1] > 0


def test_tree_size_never_pays_less_than_its_pass():
    from sampling.tree_decoding import TreeRecord, tree_size

    policy, record = DraftPolicy(row_costs=COSTS), TreeRecord()
    fan = [-1] * 8
    assert tree_size(policy, record, fan) == 8  # no record yet: the whole proposal
    children = [list(range(8))] + [[] for _ in range(8)]
    for _ in range(20):  # no child ever accepted: no tree pays for its pass
        record.update(children, [])
    assert tree_size(policy, record, fan) == 0
    record = TreeRecord()
    chain_then_fan = [-1, 0, 1, 2, -1, -1, -1, -1]
    children = [[0, 4, 5, 6, 7], [1], [2], [3]] + [[] for _ in range(5)]
    for _ in range(20):  # the first child accepted at every level: the chain pays, its siblings do not
        record.update(children, [0, 1, 2, 3])
    assert tree_size(policy, record, chain_then_fan) == 4
    assert TreeRecord().rate(0) == 0.5 and record.rate(0) > 0.9 and record.rate(1) < 0.1


# ---- the benchmark and the refusal of models without full attention ---------------------------
def test_the_benchmark_runs_the_tree_strategies_greedy_exact(tiny_models, tmp_path):
    import json

    import bench

    out = tmp_path / "trees"
    bench.main(["--target", tiny_models["target"], "--device", "cpu", "--limit", "1", "--categories", "summarization",
                "--strategies", "target,tree_ngram,recycling,tree_copy", "--tree-size", "8", "--max-new-tokens", "8", "--out", str(out)])
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert {r["key"] for r in records} == {"target", "tree_ngram", "recycling", "tree_copy"}
    assert all(r["diverged_at"] is None for r in records)


def test_tree_strategies_refuse_a_sliding_window_model_on_transformers_forward_in_one_line():
    """transformers' forward keeps a sliding layer's window only (its trees refused); the lean forward,
    a sliding-window model's default runner, draws the window into the tree (tests/test_families.py)."""
    from runners import RunnerConfig
    from test_control_combinations import mistral

    own = dict(max_gen_len=4, use_cache=True, runner=RunnerConfig(forward="transformers"))
    with pytest.raises(ValueError, match="sliding-window"):
        generate(PROMPT, mistral(), RecyclingSpec(), own)
    with pytest.raises(ValueError, match="sliding-window"):
        generate(PROMPT, mistral(), NGramTreeSpec(), own, DraftContext(storage=NGramStorage(3, 24)))
    assert len(generate([t % 24 for t in PROMPT], mistral(), RecyclingSpec(), dict(max_gen_len=4, use_cache=True))[0]) == 4


def test_the_repl_toggles_the_tree_strategies_and_their_size(tiny_models):
    from repl_driver import run

    result = run("--target", tiny_models["target"], "--no-calibrate",
                 stdin="/tree_ngram\n/recycling\n/tree_size 8\n/tree_size 0\n/length 6\nHello there, hello there\n")
    assert result.returncode == 0, result.stderr
    for line in ("N-gram tree: on", "Token recycling: on", "tree_size: 8", "usage: /tree_size <n>"):
        assert line in result.stdout, line
    table = result.stdout[result.stdout.index("Target AR") :]
    assert "N-gram tree" in table and "Token recycling" in table


def test_ngram_trees_are_the_storages_top_branches_best_first():
    storage = NGramStorage(2, 10)
    for context, token, times in ((1, 2, 3), (1, 3, 1), (2, 4, 2), (3, 5, 1)):
        for _ in range(times):
            storage.add([context], (token,))
    drafter = NGramDrafter(storage)
    # 1 -> 2 (3/4) -> 4 (3/4), then 1 -> 3 (1/4) -> 5 (1/4)
    assert drafter.propose_tree([7, 1], 4) == ([2, 4, 3, 5], [-1, 0, -1, 2])
    assert drafter.propose_tree([7, 1], 2) == ([2, 4], [-1, 0])
    assert drafter.propose_tree([7, 9], 4) == ([], [])


def test_recycling_reads_its_table_into_the_static_tree_and_learns_every_row():
    from drafters.recycling import RecyclingDrafter, tree_template

    shape = tree_template(6, 3)
    assert shape == ((0,), (1,), (0, 0), (2,), (0, 1), (1, 0))  # best first: every prefix a tree
    drafter = RecyclingDrafter({1: [2, 3, 4], 2: [5, 6]}, top_k=3)
    nodes, parents = drafter.propose_tree([9, 1], 6)
    assert (nodes, parents) == ([2, 3, 5, 4, 6], [-1, -1, 0, -1, 0])  # 3 has no row: (1, 0) left out
    drafter.accept_tree([9, 1, 2, 7], 2, nodes, parents, [0], [[2, 8, 8], [7, 1, 1], [0, 0, 0], [1, 1, 1], [4, 4, 4], [6, 6, 6]])
    assert drafter.table[1] == [2, 8, 8] and drafter.table[2] == [7, 1, 1] and drafter.table[3] == [0, 0, 0]
    seeded = RecyclingDrafter({5: [6]})
    seeded.seed([5, 7, 1, 2, 1, 3])
    assert seeded.table == {5: [6], 7: [1], 1: [3, 2], 2: [1]}  # the target's row kept, latest first


def test_suffix_trees_are_greedy_exact_with_both_caches():
    """Suffix decoding proposing trees (its most frequent branches) verified in one pass: greedy
    output equals target AR with the dynamic and the static cache (its sampled output is lossless by
    the same argument as every deterministic tree: the target's own sample walks down the tree)."""
    from conftest import llama as tiny_llama
    from drafters import SuffixSpec
    from runners import RunnerConfig

    target = tiny_llama(layers=2, window=512)
    prompt = [5, 17, 33, 5, 17, 40, 2, 9, 5, 17, 33, 71] * 2
    for cache in ("dynamic", "static"):
        runner = RunnerConfig(cache=cache)
        reference = autoregressive_generate(prompt, target, max_gen_len=40, eos_tokens_id=[], use_cache=True, runner=runner)
        trees, _ = generate(prompt, target, SuffixSpec(max_spec_tokens=8, trees=True),
                            dict(max_gen_len=40, eos_tokens_id=[], use_cache=True, runner=runner))
        assert trees == reference
