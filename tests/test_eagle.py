"""The EAGLE-3 drafter: the runners' hidden states are the model's own, a head trained here on a tiny
target drafts tokens the target accepts, its output is the target's own (greedy exact under every
cache, the compiled runner and trees' chain fallback; sampling lossless by chi-square with a power
check), its cache rolls back with the target's, and training resumes where it stopped."""
import pytest
import torch

from conftest import EOS_NEVER, PROMPT, llama
from drafters.eagle import EagleDrafter
from eagle.features import ItemBatches, batch_tensors, length_groups, ordered_groups, sequence_features
from eagle.head import Eagle3Head, HeadCache, HeadConfig
from eagle.loop import Recipe, Run, initial_head, train
from runners import KVCacheModel, RunnerConfig
from sampling import GenerationStats, autoregressive_generate, generate
from test_lossless_sampling import PROCESSORS, chi_square_pvalue, exact_distribution, sample_many

LENGTH = 32


def greedy_sequences(target, count: int, length: int, seed: int):
    """``count`` random prompts of 6 tokens, each continued greedily by ``target`` to ``length`` tokens."""
    gen = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    rows = []
    for _ in range(count):
        prompt = torch.randint(2, vocab, (6,), generator=gen).tolist()
        out = autoregressive_generate(prompt, target, max_gen_len=length - 6, eos_tokens_id=EOS_NEVER, use_cache=True)
        rows.append({"ids": prompt + out, "prompt_length": 6})
    return rows


def training_items(target, rows, layers):
    items = []
    for row in rows:
        item = sequence_features(target, row["ids"], layers, top=8)
        item.update(ids=torch.tensor(row["ids"], dtype=torch.int32), prompt_length=row["prompt_length"])
        items.append(item)
    return items


def tiny_head(target, recipe: Recipe, checkpoint, draft_vocab: int = 64, stop_after=None, items=None):
    """A head for ``target`` trained on its own greedy continuations (fixed seeds, no clock)."""
    torch.manual_seed(0)
    config = HeadConfig.for_target(target, draft_vocab_size=draft_vocab)
    vocabulary = torch.arange(target.config.vocab_size - draft_vocab, target.config.vocab_size)
    items = items if items is not None else training_items(target, greedy_sequences(target, 96, 40, seed=1), config.aux_layers)
    index = torch.full((target.config.vocab_size,), -1, dtype=torch.long)
    index[vocabulary] = torch.arange(draft_vocab)
    head = initial_head(target, config, vocabulary)
    learn, held = items[:-8], items[-8:]
    batches = ItemBatches(learn, length_groups([len(i["ids"]) for i in learn], recipe.batch_sequences), index)
    held_out = ItemBatches(held, ordered_groups(len(held), recipe.batch_sequences), index)
    figures = train(head, batches, held_out, recipe, checkpoint, Run(say=lambda text: None, stop_after=stop_after))
    return head.to(torch.float64).eval(), figures


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    target = llama(layers=4, init=0.1, seed=5)
    recipe = Recipe(epochs=20, lr=3e-3, batch_sequences=8, top=8, ttt_steps=3)
    head, figures = tiny_head(target, recipe, tmp_path_factory.mktemp("eagle") / "checkpoint.pt")
    return target, head, figures


def run(target, head, gamma, processor=None, stats=None, **arguments):
    common = dict(max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=True, stats=stats)
    if processor is not None:
        common["logits_processor"] = processor
    common.update(arguments)
    return generate(PROMPT, target, lambda p, config: EagleDrafter.of(head, config), {**common, "gamma": gamma})[0]


def test_a_head_trained_here_learns_the_target_and_its_drafts_are_accepted(trained):
    target, head, figures = trained
    assert figures["accuracy"][0] > 0.25 and figures["tokens_per_pass"] > 1.5, figures
    stats = GenerationStats()
    run(target, head, 4, stats=stats)
    assert stats.accepted > 0.3 * stats.drafted > 0


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("first_target", [True, False])
def test_greedy_output_equals_target_autoregressive_under_every_cache(trained, cache, first_target):
    target, head, _ = trained
    expected = autoregressive_generate(PROMPT, target, max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER)
    for gamma in (1, 2, 5):
        stats = GenerationStats()
        out = run(target, head, gamma, stats=stats, runner=RunnerConfig(cache=cache), first_target=first_target)
        assert out == expected and stats.accepted > 0


def test_greedy_output_equals_target_autoregressive_without_a_cache(trained):
    """The head reads the hidden states of the positions a pass fed: without a cache every pass feeds
    everything, which still gives each position's state."""
    target, head, _ = trained
    expected = autoregressive_generate(PROMPT, target, max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER)
    assert run(target, head, 3, use_cache=False) == expected


def test_each_draft_is_what_the_head_drafts_from_scratch_on_the_accepted_sequence(trained):
    """The head's cache rolls back with the target's: every draft equals a fresh head's (new cache,
    features from one full target pass) on the same accepted tokens."""
    target, head, _ = trained
    seen = []

    class Spy(EagleDrafter):
        def propose(self, ids, tokens, k):
            count, q = super().propose(ids, tokens, k)
            seen.append((list(tokens), ids[0, len(tokens) : len(tokens) + count].tolist()))
            return count, q

    generate(PROMPT, target, lambda p, config: Spy.of(head, config),
             dict(max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=True, gamma=4))
    assert len(seen) > 5
    layers = head.config.aux_layers
    for tokens, drafts in seen:
        hidden = target(input_ids=torch.tensor([tokens]), output_hidden_states=True).hidden_states
        features = torch.cat([hidden[k][0] for k in layers], -1)
        cache = HeadCache(head, 128, "cpu", torch.float64)
        ids = torch.tensor([tokens])
        out = head.decode(cache, head.embed(ids[:, 1:]), head.fc(features[:-1]).unsqueeze(0), 0)[:, -1:]
        fresh = []
        for i in range(len(drafts)):
            token = int(head.target_ids()[head.logits(out[0]).argmax(-1)])
            fresh.append(token)
            out = head.decode(cache, head.embed(torch.tensor([[token]])), out, len(tokens) - 1 + i)
        assert fresh == drafts


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_runner_hidden_states_are_the_models_own_at_the_positions_fed(cache):
    model = llama(layers=4)
    runner = KVCacheModel(model, cache=cache)
    runner.hidden_layers = (1, 2, 3)
    ids = torch.tensor([PROMPT + [5, 6, 7, 8]])
    full = model(input_ids=ids, output_hidden_states=True).hidden_states
    expected = torch.cat([full[k][0] for k in (1, 2, 3)], -1)
    runner(ids[:, :6])
    assert runner.hidden_start == 0 and torch.allclose(runner.hidden, expected[:6], atol=1e-10)
    runner(ids, 3)
    assert runner.hidden_start == 6 and torch.allclose(runner.hidden, expected[6:], atol=1e-10)
    runner.rollback(7)
    logits = runner.tree_pass(ids, 8, [9, 10, 11], [-1, -1, 1])  # nodes at positions 8, 8, 9
    assert logits.shape[0] == 4 and runner.hidden_start == 7
    assert torch.allclose(runner.hidden[0], expected[7], atol=1e-10)
    branch = torch.tensor([ids[0, :8].tolist() + [10, 11]])
    along = torch.cat([h[0] for h in (model(input_ids=branch, output_hidden_states=True).hidden_states[k] for k in (1, 2, 3))], -1)
    assert torch.allclose(runner.hidden[2:4], along[8:10], atol=1e-10)


def test_a_head_asking_for_a_layer_the_target_lacks_is_refused_in_one_line():
    model = llama(layers=2)
    head = Eagle3Head(HeadConfig.for_target(model, 32, aux_layers=(0, 1, 5)), embed_tokens=model.get_input_embeddings())
    with pytest.raises(ValueError) as refused:
        generate(PROMPT, model, EagleDrafter(head.double(), PROCESSORS["multinomial"]), dict(max_gen_len=4, use_cache=True))
    assert "layer 5" in str(refused.value) and "\n" not in str(refused.value)


# ---- sampling: lossless, and the test can see a biased sampler ----------------------------------
VOCAB, SAMPLED = 4, 3


@pytest.fixture(scope="module")
def tiny_vocabulary():
    """A 4-token target and a random head over 3 of its tokens (one token it can never draft)."""
    target = llama(vocab=VOCAB, init=0.3, seed=3, layers=4)
    torch.manual_seed(11)
    head = Eagle3Head(HeadConfig.for_target(target, draft_vocab_size=3), embed_tokens=target.get_input_embeddings())
    for parameter in head.parameters():
        torch.nn.init.normal_(parameter, 0, 0.5)
    head.set_vocabulary(torch.tensor([0, 1, 3]))
    return target, head.double().eval()


@pytest.mark.parametrize("trees", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("name", sorted(PROCESSORS))
def test_sampled_output_follows_the_target_distribution(tiny_vocabulary, name, trees):
    target, head = tiny_vocabulary
    processor = PROCESSORS[name]
    stats = GenerationStats()
    samples = sample_many(lambda: generate([1, 2, 3, 1, 2], target, lambda p, c: EagleDrafter.of(head, c, top_k=2, depth=2), dict(
        logits_processor=processor, max_gen_len=SAMPLED, eos_tokens_id=[], use_cache=True, first_target=True, stats=stats,
        gamma=3 if trees else 2, trees=trees))[0])
    assert stats.accepted > 0
    assert chi_square_pvalue(samples, exact_distribution(target, processor, length=SAMPLED)) > 1e-3


def test_the_sampling_test_sees_a_head_whose_drafts_skip_the_residual(tiny_vocabulary):
    target, head = tiny_vocabulary
    processor = PROCESSORS["multinomial"]
    samples = sample_many(lambda: generate([1, 2, 3, 1, 2], target, lambda p, c: EagleDrafter.of(head, c), dict(
        logits_processor=processor, max_gen_len=SAMPLED, eos_tokens_id=[], use_cache=True, skip_sample_adjustment=True, gamma=2))[0])
    assert chi_square_pvalue(samples, exact_distribution(target, processor, length=SAMPLED)) < 1e-6


# ---- training ---------------------------------------------------------------------------------------
def test_training_stopped_anywhere_resumes_to_the_same_head(tmp_path):
    target = llama(layers=4, init=0.1, seed=5)
    recipe = Recipe(epochs=2, lr=3e-3, batch_sequences=8, top=8, ttt_steps=2)
    config = HeadConfig.for_target(target, draft_vocab_size=64)
    items = training_items(target, greedy_sequences(target, 24, 24, seed=2), config.aux_layers)
    with torch.no_grad():  # as the app's set-up leaves the process: training turns gradients on for itself
        whole, _ = tiny_head(target, recipe, tmp_path / "whole.pt", items=items)
    assert not torch.equal(whole.fc.weight, tiny_head(target, recipe, tmp_path / "none.pt", items=items, stop_after=0)[0].fc.weight)
    tiny_head(target, recipe, tmp_path / "stopped.pt", items=items, stop_after=3)
    resumed, figures = tiny_head(target, recipe, tmp_path / "stopped.pt", items=items)
    assert figures["steps"] == figures["of_steps"] == 4
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_ttt_step_zero_is_the_cached_decode_and_later_steps_are_chains():
    """Training and drafting compute the same thing: step ``i`` of the training-time test at index
    ``t`` equals the ``i``-th draft of a chain drafted from position ``t`` over the head's cache."""
    model = llama(layers=4)
    torch.manual_seed(2)
    head = Eagle3Head(HeadConfig.for_target(model, draft_vocab_size=64), embed_tokens=model.get_input_embeddings()).double()
    features, ids = torch.randn(1, 12, 96, dtype=torch.float64), torch.randint(0, 96, (1, 12))
    steps = list(head.ttt(features, ids, 3))
    g = head.fc(features)
    for base in (3, 7):
        cache = HeadCache(head, 64, "cpu", torch.float64)
        out = head.decode(cache, head.embed(ids[:, 1 : base + 2]), g[:, : base + 1], 0)[:, -1:]
        assert torch.allclose(head.logits(out)[0, 0], steps[0][0, base], atol=1e-10)
        for i in (1, 2):
            out = head.decode(cache, head.embed(ids[:, base + 1 + i : base + 2 + i]), out, base + i)
            assert torch.allclose(head.logits(out)[0, 0], steps[i][0, base], atol=1e-10)


def test_batches_label_only_answer_rows_with_the_draft_vocabulary():
    item = {"ids": torch.tensor([1, 2, 3, 4, 5], dtype=torch.int32), "prompt_length": 2,
            "features": torch.zeros(5, 6, dtype=torch.bfloat16),
            "top_ids": torch.tensor([[1, 2]] * 5, dtype=torch.int32), "top_probs": torch.tensor([[0.6, 0.4]] * 5).half()}
    index = torch.tensor([-1, -1, 0, 1, 2, 3])
    features, ids, labels, probs, mask = batch_tensors([item], index)
    assert mask[0].tolist() == [False, True, True, True, False]
    assert labels[0, 0].tolist() == [-1, 0] and torch.allclose(probs[0, 0], torch.tensor([0.0, 1.0]))


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_dynamic_trees_are_greedy_exact_and_accept_more_than_one_token_a_pass(trained, cache):
    target, head, _ = trained
    expected = autoregressive_generate(PROMPT, target, max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER)
    for budget, shape in ((1, dict(top_k=1, depth=1)), (8, dict(top_k=2, depth=4)), (16, dict(top_k=4, depth=5))):
        stats = GenerationStats()
        out, _ = generate(PROMPT, target, lambda p, config: EagleDrafter.of(head, config, **shape),
                          dict(max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=True, stats=stats,
                               runner=RunnerConfig(cache=cache), trees=True, gamma=budget))
        assert out == expected and stats.accepted > 0


def test_a_tree_holds_every_ancestor_and_ranks_by_path_probability(trained):
    target, head, _ = trained
    drafter = EagleDrafter(head, PROCESSORS["multinomial"], top_k=3, depth=4)
    runner = KVCacheModel(target)
    drafter.attach(runner)
    ids = torch.tensor([PROMPT])
    runner(ids, 1)
    drafter.accept(PROMPT + [7], len(PROMPT), 0, None)
    passes, step = [], drafter._draft_step
    drafter._draft_step = lambda *args, **rows: passes.append(1) or step(*args, **rows)
    nodes, parents = drafter.propose_tree(PROMPT + [7], 10)
    estimates = drafter.estimates()
    assert len(nodes) == len(parents) == len(estimates) == 10
    assert drafter.tree_drafts(parents) == len(passes) >= 2  # its drafts, as the tree loop prices them: the head's passes
    assert all(-1 <= p < i for i, p in enumerate(parents))
    assert estimates == sorted(estimates, reverse=True)
    assert all(estimates[i] <= estimates[p] for i, p in enumerate(parents) if p >= 0)


def test_the_merged_tree_with_the_head_as_a_source_is_greedy_exact_and_credits_it(trained):
    from drafters import DraftContext, MergedSpec

    target, head, _ = trained
    expected = autoregressive_generate(PROMPT, target, max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER)
    stats = GenerationStats()
    out, _ = generate(PROMPT, target, MergedSpec(tree_size=12), dict(max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=True,
                                                                     stats=stats), DraftContext(head=head))
    assert out == expected and stats.accepted_by.get("head", 0) > 0, stats.accepted_by


@pytest.mark.needs_cxx
def test_compiled_passes_give_the_eager_hidden_states_and_the_same_greedy_output(trained, monkeypatch):
    """The compiled runner's graphs that return hidden states are built by ``prepare`` (none after it),
    and a head drafting over them gives target AR's tokens."""
    import runners.compiled as compiled
    from torch._dynamo.utils import counters

    monkeypatch.setattr(compiled, "BUCKETS", (4,))  # one pass width (1-position passes padded into it)
    target, head, _ = trained
    layers = head.config.aux_layers
    # the graph returning hidden states alone (plain=False): a head's target asks for them at every pass;
    # a plain graph built here would go unused (the reference below runs eagerly), ~5 s of compiling
    compiled.prepare(target, 200, hidden_layers=layers, plain=False)
    built, graphs = len(compiled.compile_events), counters["stats"]["unique_graphs"]  # ours, and dynamo's own count
    runner = compiled.CompiledRunner(target)
    runner.hidden_layers = layers
    ids = torch.tensor([PROMPT + [5, 6, 7]])
    full = target(input_ids=ids, output_hidden_states=True).hidden_states
    expected_hidden = torch.cat([full[k][0] for k in layers], -1)
    runner(ids[:, : len(PROMPT)])
    runner(ids, 3)
    assert runner.hidden_start == len(PROMPT) and torch.allclose(runner.hidden, expected_hidden[len(PROMPT) :], atol=1e-7)
    del runner  # its cache goes back to the pool: the generation below takes it (a graph is built per cache)
    expected = autoregressive_generate(PROMPT, target, max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER)
    stats = GenerationStats()
    assert run(target, head, 3, stats=stats, compile=True) == expected and stats.accepted > 0
    assert len(compiled.compile_events) == built
    assert counters["stats"]["unique_graphs"] == graphs, "a graph was rebuilt after prepare (a guard failed, e.g. the grad mode)"
