"""llama.cpp's runner (``runners.llama_cpp``) on the embedded GGUF file (SmolLM2-135M-Instruct, Q4_1):
a position's logits do not depend on how passes split the sequence (flash attention off), so greedy
speculative decoding on it is target AR on it, token for token; a rollback forgets what it drops, a
draft tree's rows are the chain's, and what it cannot do it refuses in one line. Skipped where
llama-cpp-python is not installed (``make llama-cpp`` builds it)."""
import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (make llama-cpp; docs/llama-cpp.md)")

from conftest import llama  # noqa: E402
from drafters import PromptLookupSpec, RecyclingSpec  # noqa: E402
from runners import RunnerConfig, make_runner  # noqa: E402
from runners.llama_cpp import NO_HIDDEN, LlamaCppRunner  # noqa: E402
from runners.llama_model import gguf_model  # noqa: E402
from sampling import GenerationConfig, generate  # noqa: E402
from sampling.base_decoding import generate_with  # noqa: E402
from sampling.divergence import PassRecorder, classify_divergence  # noqa: E402
from utils.models import embedded_gguf  # noqa: E402

TEXT = ("<|im_start|>user\nFix the typo in this Python code and return the whole code:\ndef total(prices, tax):\n"
        "    subtotal = sum(prices)\n    retrun subtotal * (1 + tax)\n\nprint(total([3, 4, 5], 0.2))<|im_end|>\n"
        "<|im_start|>assistant\n")  # input-grounded: the answer copies the prompt, so lookup and trees draft


@pytest.fixture(scope="module")
def gguf():
    return gguf_model(embedded_gguf())


def runner() -> LlamaCppRunner:
    return LlamaCppRunner(embedded_gguf())


def ids_of(tokens) -> torch.Tensor:
    return torch.tensor([list(tokens)], dtype=torch.long)


def same_as_target_ar(gguf, prompt, ar, tokens, passes):
    """A strategy's greedy tokens are target AR's on the same runner; where not, the failure names the
    first divergence and its margins (``sampling.divergence``: a near-tie would mean the passes round
    differently by their split, which flash attention off rules out here)."""
    if tokens != ar:
        found = classify_divergence(gguf, prompt, ar, tokens, passes, runner_factory=lambda _: runner())
        pytest.fail(found.line())


def test_prompt_lookup_on_llama_cpp_is_target_ar_on_it(gguf):
    """Greedy prompt lookup verified by llama.cpp emits target AR's tokens on llama.cpp, and drafts."""
    prompt, ends = gguf.tokenize(TEXT), gguf.end_tokens()
    ar = generate_with(prompt, runner(), GenerationConfig(max_gen_len=48, stop_tokens=frozenset(ends)))
    recorder, config = PassRecorder(), dict(max_gen_len=48, eos_tokens_id=ends, use_cache=True)
    target = runner()
    tokens, acceptance = generate(prompt, target, PromptLookupSpec(num_pred_tokens=8),
                                  dict(config, streamer=recorder))
    assert len(ar) >= 30 and "print(total([3, 4, 5], 0.2))" in gguf.detokenize(ar)
    assert acceptance > 0 and target.forward_passes < len(tokens)  # it drafted, and some drafts were kept
    same_as_target_ar(gguf, prompt, ar, tokens, recorder.passes)


def test_token_recycling_trees_on_llama_cpp_are_target_ar_on_it(gguf):
    """Draft trees verified by llama.cpp (sequence ids per leaf) keep greedy output target AR's."""
    prompt, ends = gguf.tokenize(TEXT), gguf.end_tokens()
    ar = generate_with(prompt, runner(), GenerationConfig(max_gen_len=48, stop_tokens=frozenset(ends)))
    target = runner()
    tokens, acceptance = generate(prompt, target, RecyclingSpec(tree_size=12, top_k=4),
                                  dict(max_gen_len=48, eos_tokens_id=ends, use_cache=True))
    assert acceptance > 0 and target.forward_passes < len(tokens)
    assert tokens == ar  # (classify_divergence replays chains, not trees)


def test_logits_do_not_depend_on_how_passes_split_the_sequence(gguf):
    """The logits of each of the prompt's last 16 positions are the same bits from one pass over it,
    from one-position passes, and from passes of three. Two llama.cpp defaults break this, by up to 1.0
    in a logit here: its CPU flash attention (the runner turns it off) and llamafile's kernels for
    passes of two positions or more (``make llama-cpp`` builds without them; docs/llama-cpp.md)."""
    prompt = gguf.tokenize(TEXT)
    whole, first = len(prompt), len(prompt) - 16
    one_pass = runner()(ids_of(prompt), 16)
    for width in (1, 3):
        target = runner()
        target(ids_of(prompt[:first]), 1)
        ends = list(range(first + width, whole, width)) + [whole]
        rows = torch.cat([target(ids_of(prompt[:end]), end - start) for start, end in zip([first] + ends, ends)])
        different = [first + i for i in range(16) if not torch.equal(rows[i], one_pass[i])]
        assert not different, (f"passes of {width} give other logits than one pass at positions {different} "
                               f"(built with llamafile's kernels: {not gguf.exact})")


def test_rollback_then_refeeding_is_a_fresh_pass(gguf):
    """After a pass over drafts and a rollback into them, new tokens see only what was kept: the
    logits equal those of a runner that never saw the dropped drafts, over the same pass."""
    prompt = gguf.tokenize(TEXT)
    generator = torch.Generator().manual_seed(0)
    drafts = torch.randint(100, 40000, (5,), generator=generator).tolist()
    others = torch.randint(100, 40000, (3,), generator=generator).tolist()
    kept = prompt + drafts[:2]
    used = runner()
    used(ids_of(prompt), 1)
    used(ids_of(prompt + drafts), 5)
    used.rollback(len(kept))
    assert used.cached == len(kept)
    after = used(ids_of(kept + others), 3)
    fresh = runner()
    fresh(ids_of(kept), 1)
    expected = fresh(ids_of(kept + others), 3)
    assert after.shape == (3, gguf.n_vocab) and after.dtype == torch.float32
    assert torch.equal(after, expected)


def test_a_tree_pass_scores_each_branch_as_a_chain_would(gguf):
    """Row 0 and each node's row of a tree pass are the logits a chain pass along its branch gives;
    after keep_branch the cache holds exactly the kept branch (the next pass is the chain's)."""
    prompt = gguf.tokenize(TEXT)
    a, b, c, d = gguf.tokenize("def total(prices")[:4]
    nodes, parents = [a, c, b, d], [-1, -1, 0, 0]  # two roots; node 0 has two children
    chain, expected = runner(), {}  # runners of one file share its context: the chains run first
    for branch in ([a, b], [a, d], [c], [a, d, b]):
        chain.rollback(0)
        expected[tuple(branch)] = chain(ids_of(prompt + branch), 1 + len(branch))
    tree = runner()
    tree(ids_of(prompt), 1)
    cur = len(prompt)
    rows = tree.tree_pass(ids_of(prompt), cur, nodes, parents)
    close = torch.equal
    assert rows.shape == (5, gguf.n_vocab) and close(rows[0], expected[(a, b)][0])
    assert close(rows[1], expected[(a, b)][1]) and close(rows[2], expected[(c,)][1])
    assert close(rows[3], expected[(a, b)][2]) and close(rows[4], expected[(a, d)][2])
    tree.keep_branch(cur, [0, 3])  # a, d
    assert tree.cached == cur + 2
    assert close(tree(ids_of(prompt + [a, d, b]), 1)[0], expected[(a, d, b)][3])


def test_hidden_states_are_refused_in_one_line():
    """llama.cpp gives no hidden states: asking a runner for them (what an EAGLE head does) fails at once."""
    target = runner()
    target.hidden_layers = ()  # keeping none is fine
    with pytest.raises(ValueError) as error:
        target.hidden_layers = (1, 15, 28)
    assert str(error.value) == NO_HIDDEN and "\n" not in NO_HIDDEN


def test_bad_input_is_one_line(gguf):
    """A token outside the vocabulary, a sequence longer than the context, a missing file: one line each,
    and a refused pass leaves the runner usable."""
    target = runner()
    with pytest.raises(RuntimeError, match=r"^llama\.cpp could not decode a pass of 2 positions \(code -1\): .*invalid token") as error:
        target(ids_of([1, gguf.n_vocab + 5]), 1)
    assert "\n" not in str(error.value)
    target(ids_of([1, 2]), 1)  # the refused pass left nothing behind: the runner goes on
    assert target.cached == 2
    with pytest.raises(RuntimeError, match=r"do not fit llama\.cpp's context of 8192"):
        target(torch.ones((1, gguf.n_ctx + 1), dtype=torch.long), 1)
    with pytest.raises(FileNotFoundError, match="no GGUF file at"):
        LlamaCppRunner("/nonexistent/model.gguf")


def test_runner_config_picks_llama_cpp_and_names_it(gguf):
    """``RunnerConfig(gguf=...)`` is how a generation asks for llama.cpp: make_runner gives its runner,
    describe names the kernels, and a model given beside it must be the same vocabulary."""
    config = RunnerConfig(gguf=str(embedded_gguf()))
    made = make_runner(gguf, config=config)
    assert isinstance(made, LlamaCppRunner) and made.model is gguf
    assert gguf.exact and config.describe(gguf) == "llama.cpp (Q4_1 GGUF kernels)" and not config.compiled_for(gguf)
    with pytest.raises(ValueError, match="KV cache"):
        make_runner(gguf, use_cache=False, config=config)
    with pytest.raises(ValueError, match="not the same model"):
        LlamaCppRunner(embedded_gguf(), llama())
