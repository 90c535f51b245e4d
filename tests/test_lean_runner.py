"""The lean runner (``runners.lean``, over ``models.llama``): the same logits as transformers' forward,
bit for bit, on the tiny Llama, Qwen2 and tied-embedding models; the ``Runner`` protocol (rollback,
tree passes, hidden states, regrowth) as ``KVCacheModel`` does it; which models take it, and the
default choice in ``make_runner``."""
import warnings

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

import kernels.ahead as ahead
from conftest import VOCAB, gpt2, llama
from kernels import skinny
from invariance import lean_equals_transformers
from runners import EAGER, KVCacheModel, LeanRunner, RunnerConfig, kernels, lean_unsupported, make_runner, set_prepack

warnings.filterwarnings("ignore", message=".*past_key_values.*")


def qwen2(seed=0, tied=False, window=256):
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=window, tie_word_embeddings=tied, rope_theta=5000.0)
    model = Qwen2ForCausalLM(config).to(torch.float64).eval()
    with torch.no_grad():  # biases that matter: transformers initialises them to zero
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


def tied_llama():
    model = llama(seed=3)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    return model


def mistral(sliding_window=None):
    """Mistral without a sliding window, with a head size other than hidden / heads (16, not 8)."""
    torch.manual_seed(4)
    config = MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=1, head_dim=16, sliding_window=sliding_window)
    return MistralForCausalLM(config).to(torch.float64).eval()


def yarn_llama():
    """RoPE scaled by YaRN: other frequencies and an attention scaling of the cos/sin (not 1)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(5)
    rope = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 64}
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, rope_parameters=rope)
    model = LlamaForCausalLM(config).to(torch.float64).eval()
    assert model.model.rotary_emb.attention_scaling != 1.0
    return model


MODELS = {"llama": llama, "qwen2": qwen2, "tied": tied_llama, "mistral": mistral, "yarn": yarn_llama}
PASSES = ((12, 12), (13, 1), (18, 5), (19, 1), (27, 8), (30, 3))  # (length of ids, new positions asked for)


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    return MODELS[request.param]()


def ids_for(length=64, seed=0):
    return torch.randint(VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_logits_equal_transformers_forward_bit_for_bit(model, dtype):
    """Prompt, one-position and several-position cached passes on the model's own linears (the torch
    forward; the C step is tests/test_c_step.py's): the logits of transformers' forward over its
    dynamic cache, exactly (float64 and float32)."""
    lean_equals_transformers(model, dtype, ids_for(), PASSES)


def test_qwen2_biases_and_tied_embeddings_are_read():
    """The q/k/v biases change the logits, and the tied output layer is the embeddings' weight."""
    with_bias, ids = qwen2(), ids_for()
    without = qwen2()
    for layer in without.model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            proj.bias.data.zero_()
    assert not torch.equal(LeanRunner(with_bias)(ids[:, :10], 3), LeanRunner(without)(ids[:, :10], 3))
    tied = tied_llama()
    assert LeanRunner(tied).forward.head.weight is tied.model.embed_tokens.weight


def greedy(runner, prompt, length):
    ids = prompt.clone()
    for _ in range(length):
        token = runner(ids)[-1].argmax()
        ids = torch.cat([ids, token.view(1, 1)], dim=1)
    return ids[0, prompt.shape[1] :].tolist()


def test_greedy_tokens_equal_kvcachemodel(model):
    prompt = ids_for(9, seed=1)
    assert greedy(LeanRunner(model), prompt, 30) == greedy(KVCacheModel(model, cache="dynamic"), prompt, 30)


def test_rollback_then_refeed_equals_a_fresh_run(model):
    ids, other = ids_for(40), ids_for(40, seed=5)
    runner = LeanRunner(model)
    runner(ids[:, :20], 1)
    runner(torch.cat([ids[:, :20], other[:, 20:26]], dim=1), 6)  # drafts, rejected
    runner.rollback(20)
    assert runner.cached == 20
    assert torch.equal(runner(ids[:, :26], 6), LeanRunner(model)(ids[:, :26], 6))


def test_the_cache_regrows_and_keeps_what_it_held():
    model = llama(window=1024)
    ids, lean, own = ids_for(700), LeanRunner(model), KVCacheModel(model, cache="dynamic")
    for length, n in ((10, 1), (11, 1), (400, 4), (401, 1), (700, 2)):
        assert torch.equal(lean(ids[:, :length], n), own(ids[:, :length], n)), length
    assert lean.capacity >= 700 and lean.capacity < 2048  # sized to need: 10 + slack, then doubled


TREE = dict(nodes=[7, 8, 9, 10, 11], parents=[-1, 0, 0, 1, -1])


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_tree_pass_and_keep_branch_equal_the_eager_runner(model, cache):
    ids = ids_for(30)
    lean, own = LeanRunner(model), KVCacheModel(model, cache=cache)
    for runner in (lean, own):
        runner(ids[:, :15], 1)
    a, b = lean.tree_pass(ids, 18, **TREE), own.tree_pass(ids, 18, **TREE)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)  # float64; dynamic: bit for bit
    if cache == "dynamic":
        assert torch.equal(a, b)
    path = [0, 1, 3]
    for runner in (lean, own):
        runner.keep_branch(18, path)
    assert lean.cached == own.cached == 21
    kept = torch.cat([ids[:, :18], torch.tensor([[7, 8, 10, 4, 5]])], dim=1)
    torch.testing.assert_close(lean(kept, 2), own(kept, 2), rtol=0, atol=1e-12)
    lean.rollback(22)  # the kept branch's keys and values are those a chain pass would have written
    torch.testing.assert_close(lean(kept, 1), LeanRunner(model)(kept, 1), rtol=0, atol=1e-12)


def test_hidden_states_equal_select_hidden(model):
    ids, lean, own = ids_for(30), LeanRunner(model), KVCacheModel(model, cache="dynamic")
    for runner in (lean, own):
        runner.hidden_layers = (0, 1)
    for length, n in ((12, 1), (13, 1), (17, 4)):
        lean(ids[:, :length], n), own(ids[:, :length], n)
        assert lean.hidden_start == own.hidden_start and torch.equal(lean.hidden, own.hidden), length
    lean.tree_pass(ids, 20, **TREE), own.tree_pass(ids, 20, **TREE)
    assert lean.hidden.shape == own.hidden.shape == (3 + 5, 2 * model.config.hidden_size)
    torch.testing.assert_close(lean.hidden, own.hidden, rtol=0, atol=1e-12)


def onednn_calls(run) -> int:
    """How many of oneDNN's prepacked linears (``mkldnn::_linear_pointwise``) ``run()`` called: observed
    by torch's profiler, not inferred from rounding (on some CPUs oneDNN and MKL agree bit for bit)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        run()
    return sum(event.count for event in profile.key_averages() if event.key == "mkldnn::_linear_pointwise")


def test_the_models_kernel_plan_applies():
    """The lean torch forward calls the model's own linear modules, so a plan is what both runners run:
    on the prepacked plan every linear layer runs oneDNN's prepacked kernel, once per pass (on its own
    plan, none does), and the passes equal transformers' on the same plan bit for bit; a skinny plan
    runs the C step, on the same blocked weights transformers' row then runs its linears on. Without
    gradients, as generation runs: with them, oneDNN's AVX2 kernels (AMD EPYC before Zen 4; here under
    ``ONEDNN_MAX_CPU_ISA=AVX2``) take a training primitive that rounds apart from the inference one."""
    from kernels import skinny
    from kernels.prepacking import PrepackedLinear

    if not skinny.available()[0]:
        pytest.skip("the skinny kernel is not built here")
    model, ids = llama().to(torch.float32).requires_grad_(False), ids_for()
    with kernels(model, False):
        assert onednn_calls(lambda: LeanRunner(model)(ids[:, :12], 3)) == 0
    try:
        set_prepack(model, True, ("prepacked",))
        layers = [m for m in model.modules() if type(m) is PrepackedLinear]
        assert len(layers) == 7 * model.config.num_hidden_layers + 1 and {layer.route for layer in layers} == {("prepacked",)}
        lean, own = LeanRunner(model), KVCacheModel(model, cache="dynamic")
        for length, n in ((12, 3), (13, 1), (18, 5)):
            assert torch.equal(lean(ids[:, :length], n), own(ids[:, :length], n))
        assert onednn_calls(lambda: LeanRunner(model)(ids[:, :12], 3)) == len(layers) and lean.step_passes == 0
        set_prepack(model, True, ("skinny",))
        lean, own = LeanRunner(model), KVCacheModel(model, cache="dynamic")
        for length, n in ((12, 3), (13, 1), (18, 5)):
            torch.testing.assert_close(lean(ids[:, :length], n), own(ids[:, :length], n), rtol=1e-4, atol=1e-5)
        assert lean.step_passes == 3
    finally:
        set_prepack(model, False)


def softcapped_gemma3():
    """Gemma 3 with its attention scores softcapped (Gemma 2's feature, off in Gemma 3's configs)."""
    from families import gemma3

    model = gemma3()
    model.config.attn_logit_softcapping = 50.0
    return model


def dynamic_rope_llama():
    model = llama()
    model.model.rotary_emb.rope_type = "dynamic"
    return model


@pytest.mark.parametrize("make, words", [(gpt2, "outside the Llama family"), (softcapped_gemma3, "softcaps its attention scores"),
                                         (dynamic_rope_llama, "recomputes its frequencies")])
def test_an_unsupported_model_keeps_transformers_forward_with_its_reason(make, words):
    model = make()
    reason = lean_unsupported(model)
    assert reason is not None and words in reason and "\n" not in reason
    assert type(make_runner(model)) is KVCacheModel
    assert "lean" not in EAGER.describe(model)
    with pytest.raises(ValueError, match=words):
        make_runner(model, config=RunnerConfig(forward="lean"))


def skinny_built() -> bool:
    from kernels import skinny

    return skinny.available()[0]


def test_make_runner_picks_the_lean_forward_by_default():
    model = llama()
    assert lean_unsupported(model) is None and lean_unsupported(qwen2()) is None
    assert type(make_runner(model)) is LeanRunner and type(make_runner(model, config=RunnerConfig(cache="static"))) is LeanRunner
    assert type(make_runner(model, config=RunnerConfig(forward="transformers"))) is KVCacheModel
    assert type(make_runner(model, config=RunnerConfig(cache="dynamic"))) is KVCacheModel  # a dynamic cache is transformers'
    assert type(make_runner(model, use_cache=False)) is KVCacheModel
    assert EAGER.describe(model) == "static KV cache · eager · lean Llama forward (attention: SDPA) (no C step: the step runs float32 or bfloat16 weights on CPU)"
    step = EAGER.describe(model.to(torch.float32)) if skinny_built() else "no C compiler"
    with kernels(model, False):  # the model's own linears said explicitly: the torch forward
        assert EAGER.describe(model) == "static KV cache · eager · lean Llama forward (attention: SDPA)"
    model.to(torch.float64)
    prefetch = ahead.words(skinny.library(), ahead.F32) if skinny_built() else ""  # as raced when the step was made
    assert step.endswith("lean Llama forward (attention: the step's own, row by row) on the C step (skinny linears "
                         f"on blocked weights, q/k/v and gate/up fused, row-invariant; {prefetch}; the layers' weights "
                         "held once, blocked)") or step == "no C compiler"
    assert make_runner(model).cache_kind == "static"
    with pytest.raises(ValueError, match="forward must be"):
        RunnerConfig(forward="fast")
    assert type(make_runner(mistral())) is LeanRunner and type(make_runner(yarn_llama())) is LeanRunner


def test_the_programs_forward_flag_reaches_the_runner_configs():
    """``--forward``: "transformers" is carried to each model's ``RunnerConfig``; "lean" refuses, at
    load, a model outside the family."""
    from types import SimpleNamespace

    from app.pair import LoadOptions, SetupError, _runners

    say = lambda text, style="": None  # noqa: E731
    runners = _runners(SimpleNamespace(target=llama(), drafter=qwen2()), LoadOptions(forward="transformers"), say)
    assert runners["target"].forward == runners["drafter"].forward == "transformers"
    assert type(make_runner(llama(), config=runners["target"])) is KVCacheModel
    with pytest.raises(SetupError, match="--forward lean: the target cannot take it: .*outside the Llama family"):
        _runners(SimpleNamespace(target=gpt2(), drafter=None), LoadOptions(forward="lean"), say)
