"""Suffix-tree drafting (SuffixDecoding): the trie's counts and drafts by brute force, the budget and
the probability cut, tree proposals, the global memory's files, greedy exactness and lossless sampling."""
import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import EOS_NEVER, PROMPT, examples
from drafters import DraftContext, SuffixSpec
from sampling import GenerationStats, autoregressive_generate, generate
from drafters.suffix import SuffixDrafter
from drafters.suffix_memory import SuffixMemory
from drafters.suffix_tree import ROOT, SuffixTrie, best_match_path, best_match_tree, budget_for
from test_lossless_sampling import LENGTH, PROCESSORS, chi_square_pvalue, exact_distribution, sample_many, tiny_pair  # noqa: F401
from test_lossless_sampling import PROMPT as TINY_PROMPT
from test_hostile_input import NUMBERISH, repl, snapshot  # noqa: F401 (repl: the in-process REPL fixture)
from test_control_combinations import CONTROLS, GEN, PROCESSORS as COMBINED, PROMPTS, VOCAB, pair as combined_pair, policy_of, reference
from runners import RunnerConfig

texts = st.lists(st.integers(0, 4), min_size=1, max_size=60)  # a small alphabet: many repeats
depths = st.integers(1, 8)


def occurrences(text, depth):
    """Every substring of at most ``depth`` tokens with its number of occurrences."""
    return Counter(tuple(text[i:j]) for i in range(len(text)) for j in range(i + 1, min(len(text), i + depth) + 1))


def trie_counts(trie: SuffixTrie):
    out, stack = {}, [(ROOT, ())]
    while stack:
        node, path = stack.pop()
        for child in trie.children(node):
            out[path + (trie.token[child],)] = trie.count[child]
            stack.append((child, path + (trie.token[child],)))
    return out


def contains(text, part):
    return any(text[i : i + len(part)] == part for i in range(len(text) - len(part) + 1))


@settings(max_examples=examples(150))
@given(texts, depths, st.integers(1, 59))
def test_counts_are_occurrences_and_growing_in_pieces_equals_building_at_once(text, depth, cut):
    whole, pieces = SuffixTrie(depth), SuffixTrie(depth)
    whole.extend(text)
    pieces.extend(text[:cut])
    pieces.extend(text[cut:])
    assert trie_counts(whole) == trie_counts(pieces) == dict(occurrences(text, depth))
    assert len(whole.active) == min(len(text), depth) + 1
    assert all(whole.active[j] == whole.find(text[len(text) - j :]) for j in range(len(whole.active)))


@settings(max_examples=examples(150))
@given(texts, depths, st.integers(1, 12), st.sampled_from([0.5, 1.0, 2.0]), st.sampled_from([0.0, 1.0]),
       st.sampled_from([0.0, 0.1, 0.3, 0.6]))
def test_a_draft_occurs_after_its_match_within_its_budget_and_above_the_probability_cut(text, depth, most, factor, offset, cut):
    trie = SuffixTrie(depth)
    trie.extend(text)
    counts = occurrences(text, depth)
    draft, score, match = best_match_path(trie, trie.active, most, factor, offset, cut)
    if not draft:
        return
    context = text[len(text) - match :]
    assert contains(text, context + draft)  # the continuation actually occurs after the match
    assert len(draft) <= budget_for(match, most, factor, offset)
    probs = [counts[tuple(context + draft[: i + 1])] / counts[tuple(context)] for i in range(len(draft))]
    assert all(p >= cut for p in probs) and score == pytest.approx(sum(probs))
    for j in range(1, len(trie.active)):  # no other match length scores higher; ties go to the longer match
        _, other = trie.path(trie.active[j], budget_for(j, most, factor, offset), cut)
        assert other <= score + 1e-12 and (other < score - 1e-12 or j <= match or not trie.path(trie.active[j], most, cut)[0])


def test_the_most_frequent_continuation_is_drafted_and_stops_below_min_token_prob():
    trie = SuffixTrie(8)
    trie.extend([1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 4, 1, 2])
    draft, score, match = best_match_path(trie, trie.active, 8, 1.0, 2.0, 0.1)
    assert draft[:2] == [3, 9] and match == 2  # "1 2" is followed by 3 twice, by 4 once
    assert budget_for(2, 24, 1.0, 0.0) == 2 and budget_for(5, 3, 1.0, 0.0) == 3 and budget_for(3, 24, 0.5, 1.0) == 2
    assert best_match_path(trie, trie.active, 8, 1.0, 0.0, 0.9)[0] == []  # 3 follows "1 2" with 2/4 < 0.9


def best_tree_score(text, depth, match, budget, cut) -> float:
    """By brute force, the score of the best tree of ``budget`` nodes after the last ``match`` tokens:
    path probabilities never grow along a branch, so the greedy best-first tree holds the ``budget``
    most probable continuations (those >= ``cut``, within the depth) and scores their sum."""
    counts = occurrences(text, depth)
    context = tuple(text[len(text) - match :])
    probs = sorted((n / counts[context] for s, n in counts.items() if len(s) > match and s[:match] == context), reverse=True)
    return sum(p for p in probs[:budget] if p >= cut)


TREE_FACTOR = 4.0


@settings(max_examples=examples(100))
@given(texts, depths, st.integers(1, 16), st.sampled_from([0.0, 0.1, 0.3]))
@example(text=[2, 2, 0, 2, 2, 2, 0, 2, 2], depth=3, budget=1, cut=0.3)  # a shorter match ("2") outscores a longer one
@example(text=[0, 1, 0, 1, 2, 0, 1], depth=3, budget=3, cut=0.0)  # the best tree ("1": 3 x 1/3) is wider than deep
def test_a_proposed_tree_is_topological_within_budget_best_first_and_from_the_best_scoring_match(text, depth, budget, cut):
    drafter = SuffixDrafter(text, max_tree_depth=depth, max_spec_factor=TREE_FACTOR, min_token_prob=cut)
    nodes, parents = drafter.propose_tree(text, budget)
    assert len(nodes) == len(parents) <= budget
    assert all(-1 <= p < i for i, p in enumerate(parents))
    longest = min(len(text), depth)
    scores = {j: best_tree_score(text, depth, j, budget_for(j, budget, TREE_FACTOR, 0.0), cut) for j in range(1, longest + 1)}
    if not nodes:
        assert max(scores.values()) == 0
        return
    counts = occurrences(text, depth)

    def branch(i):
        return branch(parents[i]) + [nodes[i]] if i >= 0 else []

    # as the authors' speculate: the match length whose tree scores best (ties: the longer match here)
    match = drafter.last_match
    context = text[len(text) - match :]
    assert all(tuple(context + branch(i)) in counts for i in range(len(nodes)))
    probs = [counts[tuple(context + branch(i))] / counts[tuple(context)] for i in range(len(nodes))]
    assert all(p >= cut for p in probs)
    assert all(a >= b - 1e-12 for a, b in zip(probs, probs[1:]))  # greedy by estimated path probability
    assert len({tuple(branch(i)) for i in range(len(nodes))}) == len(nodes)  # no node twice
    assert len(nodes) <= budget_for(match, budget, TREE_FACTOR, 0.0)
    assert sum(probs) == pytest.approx(scores[match])
    assert all(score <= scores[match] + 1e-9 for score in scores.values())
    assert all(scores[j] < scores[match] - 1e-9 for j in range(match + 1, longest + 1))


def test_a_tree_takes_the_top_branches_by_count():
    text = [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2]
    nodes, parents = SuffixDrafter(text, max_tree_depth=8, min_token_prob=0.1).propose_tree(text, 3)
    assert nodes == [3, 1, 4] or nodes[:2] == [3, 1]  # 3 (2/5) first, then its child 1 (2/5), then 4 or 5 (1/5)
    assert parents[:2] == [-1, 0]


@settings(max_examples=examples(80))
@given(texts, st.integers(1, 12), st.sampled_from([0.0, 0.1, 0.4]))
def test_path_drafts_equal_the_authors_implementation(text, most, cut):
    cache_module = pytest.importorskip("arctic_inference.suffix_decoding")
    depth = 8
    cache = cache_module.SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=0)
    cache.start_request("r", text)
    theirs = cache.speculate("r", text, max_spec_tokens=most, max_spec_factor=1.0, max_spec_offset=0.0, min_token_prob=cut)
    cache.stop_request("r")
    trie = SuffixTrie(depth)
    trie.extend(text)
    draft, score, match = best_match_path(trie, trie.active[:depth], most, 1.0, 0.0, cut)  # they match at most depth - 1
    other = list(theirs.token_ids)
    assert score == pytest.approx(theirs.score, rel=1e-5)  # siblings tie as theirs do (tests/test_suffix_authors.py)
    if draft != other:  # only an exact tie across match lengths that their float32 sums break toward the shorter
        assert match > theirs.match_len
    else:
        assert match == theirs.match_len or not draft  # (an empty draft: they name the last length tried)


def test_the_authors_implementation_agrees_on_a_text_without_ties():
    cache_module = pytest.importorskip("arctic_inference.suffix_decoding")
    text = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    cache = cache_module.SuffixDecodingCache(max_tree_depth=8, max_cached_requests=0)
    cache.start_request("r", text)
    theirs = cache.speculate("r", text, max_spec_tokens=6, max_spec_factor=1.0, max_spec_offset=0.0, min_token_prob=0.1)
    trie = SuffixTrie(8)
    trie.extend(text)
    draft, score, match = best_match_path(trie, trie.active[:8], 6, 1.0, 0.0, 0.1)
    assert (draft, match) == (list(theirs.token_ids), theirs.match_len) and draft[:4] == [4, 1, 2, 3]


# ---- the global memory ---------------------------------------------------------------------
def test_the_memory_drafts_what_followed_in_earlier_outputs_and_the_better_score_wins():
    memory = SuffixMemory(8)
    memory.add([7, 8, 9, 10, 11, 12])
    drafter = SuffixDrafter([5, 6, 7, 8, 9], max_tree_depth=8, memory=memory)
    assert drafter.draft([5, 6, 7, 8, 9], 8) == [10, 11, 12] and drafter.last_match == 3
    assert SuffixDrafter([5, 6, 7, 8, 9], max_tree_depth=8).draft([5, 6, 7, 8, 9], 8) == []
    memory.add([1, 2])  # outputs are separate sequences: nothing spans 12 -> 1
    assert memory.trie.find([12, 1]) == -1 and memory.trie.find([1, 2]) > 0
    memory.reset()
    assert len(memory.trie) == 1 and memory.outputs == []


def test_a_full_memory_forgets_its_older_half():
    memory = SuffixMemory(4, max_tokens=20)
    for i in range(10):
        memory.add([i, i + 1, i + 2, i + 3])
    assert memory.tokens <= 20 and memory.outputs[-1] == [9, 10, 11, 12] and [0, 1, 2, 3] not in memory.outputs
    rebuilt = SuffixMemory(4)
    for output in memory.outputs:
        rebuilt.add(output)
    assert trie_counts(rebuilt.trie) == trie_counts(memory.trie)


def test_memory_save_and_load_round_trip(tmp_path):
    memory = SuffixMemory(6, vocab_size=100)
    memory.add([1, 2, 3, 1, 2, 4])
    memory.add([5, 6])
    path = tmp_path / "memory.json"
    memory.save(path)
    loaded = SuffixMemory(24, vocab_size=100)
    loaded.load(path)
    assert loaded.outputs == memory.outputs and loaded.max_depth == 6 and trie_counts(loaded.trie) == trie_counts(memory.trie)
    memory.save(path)  # our own file: replaced


@pytest.mark.parametrize("content", [
    b"", b"{", b"[]", b'{"format":"speculative-decoding/ngram-storage"}',
    b'{"format":"speculative-decoding/suffix-memory","version":1,"max_depth":0,"vocab_size":null,"outputs":[]}',
    b'{"format":"speculative-decoding/suffix-memory","version":1,"max_depth":6,"vocab_size":100,"outputs":[[1,100]]}',
    b'{"format":"speculative-decoding/suffix-memory","version":1,"max_depth":6,"vocab_size":100,"outputs":[[1,-2]]}',
    b'{"format":"speculative-decoding/suffix-memory","version":1,"max_depth":6,"vocab_size":100,"outputs":[[]]}',
    b'{"format":"speculative-decoding/suffix-memory","version":1,"max_depth":6,"vocab_size":50,"outputs":[[1]]}',
    b'{"format":"speculative-decoding/suffix-memory","version":1,"max_depth":6,"vocab_size":100,"outputs":[[true]]}',
    b'{"format":"speculative-decoding/suffix-memory","version":2}', b"\xff\xfe", b"[" * 100000,
])
def test_a_bad_memory_file_is_refused_in_one_line_and_nothing_changes(tmp_path, content):
    memory = SuffixMemory(6, vocab_size=100)
    memory.add([1, 2, 3, 1, 2])
    before = (memory.outputs, trie_counts(memory.trie), memory.max_depth)
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ValueError) as error:
        memory.load(path)
    assert "\n" not in str(error.value) and str(path) in str(error.value)
    assert (memory.outputs, trie_counts(memory.trie), memory.max_depth) == before


def test_saving_over_a_foreign_file_is_refused_and_the_file_kept(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("keep me")
    with pytest.raises(ValueError, match="left as it is"):
        SuffixMemory().save(path)
    assert path.read_text() == "keep me"
    SuffixMemory().save(path, overwrite=True)
    assert json.loads(path.read_text())["format"] == "speculative-decoding/suffix-memory"


# ---- through the verification loop ---------------------------------------------------------------
@pytest.mark.parametrize("cache", ["off", "dynamic", "static"])
def test_greedy_suffix_decoding_equals_autoregressive(pair, cache):
    target, _ = pair
    use_cache = cache != "off"
    expected = autoregressive_generate(PROMPT, target, max_gen_len=60, eos_tokens_id=EOS_NEVER, use_cache=False)
    runner = RunnerConfig(cache=cache if use_cache else None)
    common = dict(max_gen_len=60, eos_tokens_id=EOS_NEVER, use_cache=use_cache, runner=runner)
    for settings_ in (dict(), dict(max_spec_tokens=6, max_tree_depth=4, max_spec_offset=2.0, min_token_prob=0.0)):
        out, _ = generate(PROMPT, target, SuffixSpec(**settings_), common)
        assert out == expected, settings_
    memory = SuffixMemory(24)
    for _ in range(2):  # the second run drafts from the first's output
        out, rate = generate(PROMPT, target, SuffixSpec(), common, DraftContext(memory=memory))
        assert out == expected
    assert rate > 0 and memory.outputs == [expected, expected]


def test_bad_suffix_settings_are_refused_in_one_line(pair):
    target, _ = pair
    for bad in (dict(max_spec_tokens=0), dict(max_tree_depth=0), dict(max_tree_depth=65), dict(min_token_prob=1.5),
                dict(max_spec_factor=-1.0), dict(memory=SuffixMemory(8))):
        with pytest.raises(ValueError) as error:
            memory = bad.pop("memory", None)
            generate(PROMPT, target, SuffixSpec(**bad), dict(max_gen_len=5), DraftContext(memory=memory))
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("use_cache", [False, True], ids=["no_cache", "cache"])
@pytest.mark.parametrize("name", ["multinomial", "topk"])
def test_sampled_suffix_decoding_follows_target_distribution(tiny_pair, name, use_cache):  # noqa: F811
    target, _ = tiny_pair
    processor = PROCESSORS[name]
    rates = []

    def run():
        out, rate = generate(TINY_PROMPT, target, SuffixSpec(min_token_prob=0.0), dict(
            max_gen_len=LENGTH, eos_tokens_id=[], logits_processor=processor, use_cache=use_cache, first_target=False))
        rates.append(rate)
        return out

    samples = sample_many(run)
    assert sum(rates) > 0, "some drafts must be accepted for the test to mean anything"
    assert chi_square_pvalue(samples, exact_distribution(target, processor)) > 1e-3


# ---- the benchmark and the REPL --------------------------------------------------------------
def test_the_benchmark_runs_suffix_its_global_memory_and_the_authors_peer(tiny_models, tmp_path):
    import importlib.util

    import bench

    out = tmp_path / "results"
    bench.main(["--target", tiny_models["target"], "--device", "cpu", "--categories", "repeated_task", "--limit", "2",
                "--strategies", "target,suffix,suffix_global,arctic,arctic_global", "--max-new-tokens", "8", "--no-calibrate",
                "--out", str(out)])
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    peers = {"arctic", "arctic_global"} if importlib.util.find_spec("arctic_inference") else set()
    assert {r["key"] for r in records} == {"target", "suffix", "suffix_global"} | peers
    assert len(records) == 2 * (3 + len(peers)) and [r for r in records if r["diverged_at"] is not None] == []
    assert "suffix: depth 24, <= min(24, 1 x match + 0) drafts, min prob 0.1, global memory" in (out / "results.md").read_text()


def test_the_repl_toggles_suffix_and_its_global_memory_saves_loads_and_refuses_a_bad_file(tiny_models, tmp_path):
    from repl_driver import command, spawn

    saved, bad = tmp_path / "memory.json", tmp_path / "bad.json"
    bad.write_text('{"format":"speculative-decoding/suffix-memory","version":1,"max_depth":6,"vocab_size":null,"outputs":[[-1]]}')
    repl = spawn("--target", tiny_models["target"])
    try:
        command(repl, "/length 6", "length: 6")
        command(repl, "/suffix", "Suffix tree: on")
        command(repl, "/suffix_global", "suffix global memory: on")
        command(repl, "Name three colors.", "suffix global memory: on, 1 outputs")  # the table's caption
        command(repl, "/stats", "suffix: depth 24.*suffix global memory: on, 1 outputs")
        command(repl, f"/suffix_save {saved}", "saved to")
        command(repl, "/suffix_reset", "emptied \\(0 outputs")
        command(repl, f"/suffix_load {saved}", "loaded from .*1 outputs")
        command(repl, f"/suffix_load {bad}", "not a valid suffix memory file \\(token ids must be")
        command(repl, "/stats", "suffix global memory: on, 1 outputs")  # the bad file changed nothing
        command(repl, "/suffix_params 8 10 1.5 1 0.2", "suffix: depth 8, <= min\\(10, 1.5 x match \\+ 1\\) drafts, min prob 0.2")
        command(repl, "/suffix_params 0 10 1 0 0.1", "depth must be")
        command(repl, "/suffix_global", "suffix global memory: off")
    finally:
        repl.close(force=True)


def test_the_authors_drafter_is_greedy_exact_through_our_loop_and_proposes_trees(pair):
    pytest.importorskip("arctic_inference.suffix_decoding")
    from drafters.arctic import ArcticSpec, ArcticSuffixDrafter, arctic_cache
    from drafters.suffix import SuffixSettings

    target, _ = pair
    expected = autoregressive_generate(PROMPT, target, max_gen_len=60, eos_tokens_id=EOS_NEVER, use_cache=True)
    cache = arctic_cache(24, global_memory=True)
    for _ in range(2):
        out, rate = generate(PROMPT, target, ArcticSpec(), dict(max_gen_len=60, eos_tokens_id=EOS_NEVER, use_cache=True),
                             DraftContext(memory=cache))
        assert out == expected
    assert rate > 0 and not cache.active_requests
    text = [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2]
    drafter = ArcticSuffixDrafter(arctic_cache(8), text, SuffixSettings(8, 8, 4.0, 0.0, 0.1))
    nodes, parents = drafter.propose_tree(text, 4)
    drafter.stop()
    assert 0 < len(nodes) <= 4 and all(-1 <= p < i for i, p in enumerate(parents))
    trie = SuffixDrafter(text, 8, 8, 4.0, 0.0, 0.1).trie
    ours = best_match_tree(trie, trie.active[:8], 4, 4.0, 0.0, 0.1)
    cache = arctic_cache(8)
    cache.start_request("t", text)
    theirs = cache.speculate("t", text, max_spec_tokens=4, max_spec_factor=4.0, max_spec_offset=0.0, min_token_prob=0.1,
                             use_tree_spec=True)
    # equal-probability nodes at the budget's edge come in std::priority_queue's order there: compare the worth
    assert len(ours[0]) == len(theirs.token_ids) and ours[2] == pytest.approx(theirs.score, rel=1e-5)


@settings(max_examples=examples(40), suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["llama", "sliding", "hybrid"]), processor=st.sampled_from(["greedy", "multinomial", "topk"]),
       controls=st.sets(st.sampled_from(["adaptive", "min_draft", "pause", "min_gain", "row_costs", "auto"]), max_size=3),
       cache=st.sampled_from(["off", "dynamic", "static"]), most=st.integers(1, 8), prompt=st.integers(0, 1),
       remembered=st.booleans())
def test_suffix_under_every_combination_of_controls_runs_and_greedy_is_exact(kind, processor, controls, cache, most, prompt,
                                                                             remembered):
    target, _ = combined_pair(kind)
    controls = {c for c in controls if c in CONTROLS}
    policy, stats = policy_of(controls), GenerationStats()
    memory = SuffixMemory(24)
    if remembered:
        memory.add(reference(kind, 1 - prompt))  # the other prompt's output: what the global tree would hold
    torch_seed(0)
    out, _ = generate(list(PROMPTS[prompt]), target, SuffixSpec(max_spec_tokens=most), dict(
        logits_processor=COMBINED[processor], max_gen_len=GEN, eos_tokens_id=[], use_cache=cache != "off", policy=policy, stats=stats,
        runner=RunnerConfig(cache=None if cache == "off" else cache)), DraftContext(memory=memory))
    assert len(out) == GEN and all(0 <= t < VOCAB for t in out)
    if processor == "greedy":
        assert out == reference(kind, prompt)
    if not policy.auto:
        assert len(stats.drafted_at) <= most


def torch_seed(seed: int) -> None:
    import torch

    torch.manual_seed(seed)


@given(name=st.sampled_from(["/suffix", "/suffix_params", "/suffix_global", "/suffix_reset", "/suffix_load"]),
       words=st.lists(NUMBERISH, max_size=6))
@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_suffix_command_is_done_or_refused_in_one_line_with_every_setting_unchanged(repl, name, words):  # noqa: F811
    import infer

    line = " ".join([name, *words])
    before = snapshot(repl), repl.config.suffix, repl.context.suffix_memory, repl.suffix_memory.outputs
    try:
        repl.handle(line)
    except infer.UsageError as error:
        assert "\n" not in str(error).strip() and str(error)
        assert (snapshot(repl), repl.config.suffix, repl.context.suffix_memory, repl.suffix_memory.outputs) == before, line
        return
    s = repl.config.suffix
    assert 1 <= s.max_tree_depth <= 64 and 1 <= s.max_spec_tokens <= 128 and 0 <= s.min_token_prob <= 1
    assert repl.suffix_memory.max_depth == s.max_tree_depth
