"""The Llama family's kin on the lean forward and the C step (``models.layer_spec``): Qwen3, OLMo 2,
SmolLM3, Granite, Phi-3, Gemma 3 and a sliding-window Mistral and Qwen2, each a tiny random model of
transformers' own class with every feature of its family on (``families.py``). The lean torch forward
gives transformers' logits bit for bit (float64 and float32); the C step gives them to float32
rounding, a position's logits the same at every pass width and in a tree pass, so greedy drafting
rows on it emit target AR's tokens; the compiled step (inductor on CPU) follows the lean runner, one
compile a family."""
from pathlib import Path

import pytest
import torch

from conftest import EOS_NEVER, PROMPT, VOCAB
from invariance import lean_equals_transformers, widths_agree
from drafters import DraftContext, NGramTreeSpec, PromptLookupSpec
from families import FAMILY_MODELS, gemma3, phi3
from kernels import skinny
from kernels.c_step import step_unsupported
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
from runners import LeanRunner, kernels, lean_unsupported
from sampling import autoregressive_generate, generate, speculative_generate
from test_c_step import TorchForward
from test_lean_runner import PASSES, ids_for
from utils.models import truncated_drafter

ROOT = Path(__file__).resolve().parents[1]
NAMES = sorted(FAMILY_MODELS)
on_step = pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")


@pytest.fixture(scope="module", params=NAMES)
def model(request):
    return FAMILY_MODELS[request.param]()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_logits_equal_transformers_forward_bit_for_bit(model, dtype):
    """Prompt, decoding and verification passes past the sliding window, on the model's own linears:
    transformers' logits over its dynamic cache (its sliding layers keeping their window), exactly."""
    lean_equals_transformers(model, dtype, ids_for(), PASSES)


def float32(name: str):
    return FAMILY_MODELS[name]().to(torch.float32)


@on_step
@pytest.mark.parametrize("name", NAMES)
def test_step_logits_match_the_torch_forward(name):
    """Every pass on the C step: the torch forward's logits to float32 rounding (test_c_step's contract)."""
    model, ids = float32(name), ids_for()
    step, torch_forward = LeanRunner(model), TorchForward(model)
    for length, n in PASSES:
        torch.testing.assert_close(step(ids[:, :length], n), torch_forward(ids[:, :length], n), rtol=1e-4, atol=2e-5)
    assert step.step_passes == len(PASSES) and torch_forward.step_passes == 0


@on_step
@pytest.mark.parametrize("name", NAMES)
def test_a_positions_logits_do_not_depend_on_the_pass_width_nor_on_the_tree(name):
    """Positions 20..31 (past the window of 8) fed one at a time, in passes of 2..12, as the chain of a
    draft tree, and as the branches of a branching tree: the same logits bit for bit on the C step."""
    model, ids = float32(name), ids_for()
    runner = LeanRunner(model)
    alone = widths_agree(runner, ids)
    chain = ids[0, 20:26].tolist()
    assert torch.equal(runner.tree_pass(ids[:, :20], 20, chain, list(range(-1, 5)))[1:], alone[:6])
    # a branching tree: node 4's branch is nodes 0, 2, 4 (ids 20, 21, 22 of another sequence)
    other = ids_for(seed=9)
    other[0, :20] = ids[0, :20]
    nodes, parents = [other[0, 20].item(), 5, other[0, 21].item(), 7, other[0, 22].item()], [-1, 0, 0, 1, 2]
    runner.rollback(20)
    tree = runner.tree_pass(ids[:, :20], 20, nodes, parents)
    branch = LeanRunner(model)(other[:, :23], 3)
    assert torch.equal(tree[[1, 3, 5]], branch) and runner.step_passes == runner.forward_passes


@on_step
def test_a_long_prompt_in_chunks_gives_each_positions_logits_alone(monkeypatch):
    """Gemma 3, 100 positions (12 windows of 8) at once, in chunks of 24 (``c_step.CHUNK_ROWS``: a chunk's
    sliding layers read the keys the chunks before wrote), and one at a time: the same logits and
    hidden states bit for bit."""
    import kernels.c_step as c_step

    model, ids = gemma3().to(torch.float32), ids_for(100)
    at_once, chunked = LeanRunner(model), LeanRunner(model)
    at_once.hidden_layers = chunked.hidden_layers = (0, 2)
    whole = at_once(ids, 100)
    monkeypatch.setattr(c_step, "CHUNK_ROWS", 24)
    assert torch.equal(chunked(ids, 100), whole) and torch.equal(chunked.hidden, at_once.hidden)
    alone = LeanRunner(model)
    assert torch.equal(torch.cat([alone(ids[:, : i + 1], 1) for i in range(100)]), whole)


@on_step
@pytest.mark.parametrize("name", NAMES)
def test_greedy_drafting_rows_emit_target_ar_tokens_on_the_step(name):
    """A drafter model, NASD, prompt lookup and an n-gram tree verify on the C step what target AR
    decodes on it, token for token, past the sliding window."""
    target = float32(name)
    drafter = truncated_drafter(target, 1)
    common = dict(max_gen_len=30, eos_tokens_id=EOS_NEVER, use_cache=True)
    reference = autoregressive_generate(PROMPT, target, **common)
    runs = [speculative_generate(PROMPT, drafter, target, gamma=4, **common),
            ngram_assisted_speculative_generate(PROMPT, NGramStorage(2, VOCAB), target, gamma=4, **common),
            generate(PROMPT, target, PromptLookupSpec(), common),
            generate(PROMPT, target, NGramTreeSpec(tree_size=4), common, DraftContext(storage=NGramStorage(2, VOCAB)))]
    assert [out for out, _ in runs] == [reference] * 4
    assert max(rate for _, rate in runs) > 0.0  # drafts were accepted now and then: the rows verified them


def test_the_refusals_name_the_one_feature_missing():
    model = phi3()
    model.model.rotary_emb.rope_type = "longrope"
    assert "RoPE scaling 'longrope' recomputes its frequencies" in lean_unsupported(model)
    model = gemma3()
    model.config.hidden_activation = "relu"
    assert "activation 'relu'" in lean_unsupported(model)
    if skinny.available()[0]:
        model = gemma3().to(torch.float32)
        assert step_unsupported(model) is None
        model.model.layers[1].input_layernorm.eps = 1e-5  # the step takes one epsilon for every norm
        assert step_unsupported(model) == "its norms' epsilons differ: the step takes one"


# the families whose decoder layer the compiled step traces another way: Gemma 3 (both norm places,
# (1 + w), GELU-tanh, two RoPE tables, a softcap), Qwen3 (per-head q/k norms on w norms, q/k/v biases,
# sliding layers), OLMo 2 (norms after each block, scaled in float32, q/k norms over all heads),
# SmolLM3 (a layer without RoPE: a second graph), Granite (the residual and attention scales), Phi-3
# (fused linears, half the head rotated). Mistral's and Qwen2's windows are Qwen3's layer less its q/k
# norms, the same mask: a compile each would add cost and no path.
COMPILED = ["gemma3", "granite", "olmo2", "phi3", "qwen3", "smollm3"]


@pytest.mark.needs_cxx
@pytest.mark.parametrize("name", COMPILED)
def test_the_compiled_step_follows_the_lean_runner(name):
    """The compiled step (inductor on CPU, width 1 prepared, wider passes eager) through rollbacks, tree
    passes and kept branches past the sliding window: the lean runner's logits (float64: the lean
    runner's torch forward, as tests/test_step_runner.py compares), every 1-position pass on the graph.
    One width, one key bucket: inductor's compile is the cost (one graph a family, SmolLM3's two)."""
    from runners import StepRunner, prepare_step
    from runners.step import step_state
    from test_step_runner import close, passes

    model = FAMILY_MODELS[name]()
    prepare_step(model, 200, widths=(1,))
    ids = ids_for(80, seed=3)
    for step, lean in zip(passes(StepRunner(model), ids), passes(LeanRunner(model), ids)):
        assert step.shape == lean.shape
        close(step, lean)
    # the five passes of 3 to 7 rows after the prompt ran uncompiled, none of the four 1-position ones
    assert step_state(model).fallbacks == 5


@on_step
def test_the_family_table_rehearses_every_published_shape_with_greedy_rows_exact(monkeypatch, capsys):
    """``scripts/family_table.py`` (issue 72's CPU table) at ``--tiny``: a line for every published shape,
    each greedy row with 0 disagreements with target AR and some drafts accepted; and a model still held
    after its line (the next, at SmolLM3-3B's 12 GB, would not fit beside it) stops the run."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import family_table

    family_table.main(["--tiny", "--tokens", "8", "--repeats", "2"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "(tiny)" in line]
    assert [line.split(" | ")[0][2:].removesuffix(" (tiny)") for line in lines] == list(family_table.SHAPES)
    for line in lines:
        rows = [cell.strip(" |") for cell in line.split(" | ")[-len(family_table.ROWS):]]
        assert all(cell.startswith("0 (accept ") for cell in rows), line
        assert max(float(cell.split("accept ")[1].rstrip(")")) for cell in rows) > 0, line
    held, build = [], family_table.build

    def holding(*args):
        held.append(build(*args))
        return held[-1]

    monkeypatch.setattr(family_table, "build", holding)
    with pytest.raises(SystemExit, match="still held"):
        family_table.main(["--tiny", "--tokens", "2", "--shapes", "gemma3-270m"])
