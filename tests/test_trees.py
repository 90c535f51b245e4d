"""Draft trees verified in one target pass: the tree pass scores each node as a chain pass over
its branch would, the kept branch leaves the cache a fresh one would be, and the tree loop is
greedy exact and sampling lossless (chi-square against exact enumeration, with a power check)."""
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from conftest import llama
from utils.caching import KVCacheModel, tree_depths

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


MODELS = {"llama": llama, "qwen2": qwen2}


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
