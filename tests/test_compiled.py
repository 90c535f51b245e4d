"""Compiled passes (utils.compiled) change nothing but speed: every strategy greedy exact and sampled
token for token as the eager runner in float64, rollbacks and padded buckets exact, and no graph
is ever built in steady state. Two buckets (1 and 4) keep the compile time of the suite short;
passes over 2-3 positions are padded to 4 and longer ones run eagerly, as prompts do; draft trees
are verified eagerly into the compiled runner's static cache, between compiled chain passes."""
import pytest
import torch
import torch._dynamo

import runners.compiled as compiled  # the module whose BUCKETS the runner reads
from conftest import EOS_NEVER, PROMPT, llama, perturbed_copy, t5
from drafters import ChainedSpec, DraftContext, NGramTreeSpec, PromptLookupSpec, RecyclingSpec, SuffixSpec
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
from sampling import autoregressive_generate, generate, speculative_generate
from runners import KVCacheModel
from runners import RunnerConfig
from runners import make_runner
from runners import prepackable
from runners.compiled import CompiledRunner, compile_events, compiled_label, prepare, why_not_compiled
from utils.logits_processor import NucleusProcessor

pytestmark = pytest.mark.needs_cxx  # inductor compiles C++ on CPU

LENGTH = 40
# the tests of one kernel route inside the graphs (quantized, prepacked, GEMM templates): one pass width, 4,
# that the 1- and 3-position passes are padded into, so one graph each; padding to a wider bucket and
# several buckets of one model are the ``models`` tests' (test_logits_match_the_eager_static_runner_...)
ONE_WIDTH = (4,)


@pytest.fixture(scope="module")
def models():
    """A target and a drafter, each compiled once for the whole module, with buckets 1 and 4."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled, "BUCKETS", (1, 4))
        patch.setattr(torch._dynamo.config, "fail_on_recompile_limit_hit", True)
        target = llama(layers=2, window=512)
        drafter = perturbed_copy(target, 0.2, seed=1)
        for model in (target, drafter):
            prepare(model, 200)
        yield target, drafter


def run_all(target, drafter, compile, processor=None, prompt=PROMPT):
    common = dict(max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=True, compile=compile)
    if processor is not None:
        common["logits_processor"] = processor
    vocab = target.config.vocab_size
    runs = {}
    for name, run in {
        "target": lambda: autoregressive_generate(prompt, target, **common),
        "speculative": lambda: speculative_generate(prompt, drafter, target, gamma=3, **common)[0],
        "ngram": lambda: ngram_assisted_speculative_generate(prompt, NGramStorage(2, vocab), target, gamma=3, **common)[0],
        "pld": lambda: generate(prompt, target, PromptLookupSpec(num_pred_tokens=5), common)[0],
        "chained": lambda: generate(prompt, target, ChainedSpec(), {**common, "gamma": 2},
                                    DraftContext(storage=NGramStorage(2, vocab), drafter=drafter))[0],
        "suffix": lambda: generate(prompt, target, SuffixSpec(max_spec_tokens=3), common)[0],
        "tree_ngram": lambda: generate(prompt, target, NGramTreeSpec(tree_size=6), common, DraftContext(storage=NGramStorage(2, vocab)))[0],
        "recycling": lambda: generate(prompt, target, RecyclingSpec(tree_size=6), common)[0],
        "tree_suffix": lambda: generate(prompt, target, SuffixSpec(max_spec_tokens=6, trees=True), common)[0],
    }.items():
        torch.manual_seed(7)
        runs[name] = run()
    return runs


def test_every_strategy_compiled_is_greedy_exact_and_equals_the_eager_runs(models):
    target, drafter = models
    compiled_runs = run_all(target, drafter, True)
    eager_runs = run_all(target, drafter, False)
    assert all(len(tokens) == LENGTH for tokens in compiled_runs.values())
    assert all(tokens == compiled_runs["target"] for tokens in compiled_runs.values()), compiled_runs
    assert compiled_runs == eager_runs


def test_sampled_runs_compiled_draw_the_same_tokens_as_eager_ones(models):
    """Same logits up to float64 rounding, same seed: the same samples, so the same distribution."""
    target, drafter = models
    processor = NucleusProcessor(temperature=1.0, top_p=0.9)
    assert run_all(target, drafter, True, processor) == run_all(target, drafter, False, processor)


def test_steady_state_builds_no_graph_across_prompts_strategies_and_runners(models):
    target, drafter = models
    run_all(target, drafter, True)
    built = len(compile_events)
    for prompt in (PROMPT[:3], PROMPT * 3, [9] * 30):
        run_all(target, drafter, True, prompt=prompt)
    assert len(compile_events) == built


def test_logits_match_the_eager_static_runner_through_padding_rollbacks_and_eager_prompts(models):
    target, _ = models
    ids = torch.randint(target.config.vocab_size, (1, 120), generator=torch.Generator().manual_seed(3))
    fast, slow = CompiledRunner(target), KVCacheModel(target, True, cache="static")
    cached = 0
    for length, keep in [(20, 20), (21, 21), (23, 22), (26, 24), (30, 30), (33, 31), (34, 34), (60, 41), (62, 62)]:
        rows = length - cached
        # float64 weights, but transformers computes the rotary angles in float32 whatever the dtype, and
        # inductor's vectorised cos/sin may differ from eager's by an ulp there: logits agree to ~1e-8, not
        # float64's 1e-15. A wrong position, mask or rollback moves them by far more than 1e-7.
        torch.testing.assert_close(fast(ids[:, :length], rows), slow(ids[:, :length], rows), rtol=1e-6, atol=1e-7)
        fast.rollback(keep)
        slow.rollback(keep)
        cached = keep


def test_a_dropped_runner_gives_its_cache_back_for_the_next(models):
    target, _ = models
    first = CompiledRunner(target)
    first(torch.tensor([PROMPT]), 1)
    cache = first.cache
    del first
    second = CompiledRunner(target)
    second(torch.tensor([PROMPT]), 1)
    assert second.cache is cache


def test_compile_is_off_by_default_and_follows_the_runner_config(models):
    target, _ = models
    compiled_config = RunnerConfig(compile=True)
    from runners import LeanRunner

    assert isinstance(make_runner(target), LeanRunner)  # eager: the lean forward of the Llama family
    assert isinstance(make_runner(target, config=RunnerConfig(forward="transformers")), KVCacheModel)
    assert isinstance(make_runner(target, config=compiled_config), CompiledRunner)
    assert isinstance(make_runner(target, use_cache=False, config=compiled_config), KVCacheModel)  # no cache: nothing to compile over
    assert not any(name.startswith("_specdec") for name in vars(target)), "no setting is stored on the model"


def test_models_that_cannot_compile_say_why_and_run_eagerly():
    model = t5()
    assert "encoder-decoder" in why_not_compiled(model)
    assert isinstance(make_runner(model, config=RunnerConfig(compile=True)), KVCacheModel)
    with pytest.raises(ValueError, match="encoder-decoder"):
        CompiledRunner(model)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_weight_only_quantized_layers_run_inside_the_compiled_graph_with_the_eager_logits(quantize):
    from utils.quantization import cpu_kernels_available, quantize_cpu

    if not cpu_kernels_available():
        pytest.skip("this torch build has no CPU weight-only kernels")
    model = llama(vocab=96, layers=1, window=256, seed=3).to(torch.float32)
    quantize_cpu(model, quantize)
    ids = torch.tensor([PROMPT * 3])
    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(compiled, "BUCKETS", ONE_WIDTH)
        fast, slow = CompiledRunner(model), KVCacheModel(model, True, cache="static")
        for length, rows in [(20, 1), (21, 1), (24, 3), (25, 1)]:
            torch.testing.assert_close(fast(ids[:, :length], rows), slow(ids[:, :length], rows), rtol=0.02, atol=0.02)


def test_two_runners_alive_at_once_each_get_their_own_cache_and_the_eager_logits(models):
    """A second cache object of the same capacity gets graphs of its own (guarded on its tensors), never
    the first cache's tensors. One-position passes only: a graph (bucket 1) for the second cache, not
    two; padded passes into a cache are test_logits_match_the_eager_static_runner_through_padding_...'s."""
    target, _ = models
    ids = torch.randint(target.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(5))
    first, second, eager = CompiledRunner(target), CompiledRunner(target), KVCacheModel(target, True, cache="static")
    first(ids[:, :30], 1)
    for runner in (second, eager):
        runner(ids[:, :20], 1)
    assert second.cache is not first.cache
    for length in (21, 22, 23):
        expected = eager(ids[:, :length], length - eager.cached)
        torch.testing.assert_close(second(ids[:, :length], length - second.cached), expected, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(first(ids[:, :31], 1), KVCacheModel(target, True)(ids[:, :31], 1), rtol=1e-6, atol=1e-8)


def test_freezing_applies_to_our_graphs_only(models):
    """Inductor's freezing is on while our graphs build and off around them: transformers' own
    compiled generate takes its static cache for a constant when it is left on."""
    import torch._inductor.config

    assert torch._inductor.config.freezing is False


def test_prepacked_linears_run_inside_the_compiled_graph_as_one_call_each_with_the_eager_logits():
    """The graphs call the kernels the eager runner runs (``set_prepack``): oneDNN's prepacked layers
    by number (``specdec::packed_linear``); same logits as the eager prepacked runner."""
    from runners import set_prepack

    model = llama(vocab=96, layers=1, window=256, seed=4).to(torch.float32)
    if not set_prepack(model, True):
        pytest.skip("no oneDNN prepacking in this torch build")
    ids = torch.tensor([PROMPT * 3])
    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(compiled, "BUCKETS", ONE_WIDTH)
        fast, slow = CompiledRunner(model), KVCacheModel(model, True, cache="static")
        assert "prepacked linears" in compiled.compiled_label(model)
        for length, rows in [(20, 1), (21, 1), (24, 3), (25, 1)]:
            torch.testing.assert_close(fast(ids[:, :length], rows), slow(ids[:, :length], rows), rtol=1e-5, atol=1e-6)


def test_our_graphs_share_key_value_heads_in_the_kernel_and_leave_the_model_on_transformers_sdpa(models):
    """A grouped-query model's compiled passes run ``runners.attention.sdpa_shared_kv`` (SDPA's own
    ``enable_gqa``, no copy of the cache per query head), the same attention as transformers' SDPA;
    outside our graphs the model is back on transformers' "sdpa" (eager passes and the peers)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from runners.attention import NAME, sdpa_shared_kv

    target, _ = models
    from transformers.masking_utils import AttentionMaskInterface

    # its mask too: for a name it does not know, transformers builds none and every cached slot is attended
    assert NAME in AttentionInterface._global_mapping and NAME in AttentionMaskInterface._global_mapping
    assert target.config._attn_implementation == "sdpa"
    layer = target.model.layers[0].self_attn
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(1, 4, 3, 8, dtype=torch.float64, generator=generator)
    key, value = (torch.randn(1, 2, 16, 8, dtype=torch.float64, generator=generator) for _ in range(2))
    mask = torch.ones(1, 1, 3, 16, dtype=torch.bool).tril(diagonal=12)
    ours, theirs = sdpa_shared_kv(layer, query, key, value, mask, scaling=0.3), sdpa_attention_forward(
        layer, query, key, value, mask, scaling=0.3)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-12, atol=1e-12)


def test_float32_graphs_on_gemm_templates_autotuned_against_mkl_give_the_eager_logits():
    """With ``--gemm templates`` the frozen float32 linears are built with inductor's C++ GEMM
    templates, autotuned against MKL's (``CPU_GEMM``); the logits stay the eager static runner's, to float32 rounding, and
    the autotuning options are off again outside our graphs' builds. Every linear of the model is 32 x 32
    (key/value heads as many as query heads, a vocabulary of 32): autotuning runs once per shape, and
    the route does not depend on the shapes."""
    import torch._inductor.config
    from transformers import LlamaConfig, LlamaForCausalLM

    from runners import set_prepack

    torch.manual_seed(5)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                                         tie_word_embeddings=False)).to(torch.float32).eval()
    set_prepack(model, False)
    ids = torch.tensor([[token % 32 for token in PROMPT * 3]])
    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(compiled, "BUCKETS", ONE_WIDTH)  # autotuning on one small shape (1- and 3-position passes padded into it)
        patch.setattr(compiled, "CPU_GEMM", "templates")  # --gemm templates
        fast, slow = CompiledRunner(model), KVCacheModel(model, True, cache="static")
        for length, rows in [(20, 1), (21, 1), (24, 3), (25, 1)]:
            torch.testing.assert_close(fast(ids[:, :length], rows), slow(ids[:, :length], rows), rtol=1e-4, atol=1e-5)
    assert torch._inductor.config.max_autotune is False and torch._inductor.config.freezing is False


def test_float32_graphs_calling_the_skinny_kernel_give_the_eager_logits_and_name_it():
    """With ``--gemm skinny`` the graphs call each linear as one opaque op that runs the skinny kernel
    up to 12 positions and MKL past them (``SKINNY_ROUTE``, no freezing): the logits stay the eager
    static runner's on the model's own layers, to float32 rounding, and the label names the route."""
    from kernels import skinny
    from runners import kernels

    if not skinny.available()[0] or not prepackable(llama(vocab=96, layers=1).to(torch.float32)):
        pytest.skip("the skinny kernel does not build here, or no oneDNN for routes")
    model = llama(vocab=96, layers=1, window=256, seed=5).to(torch.float32)
    ids = torch.tensor([PROMPT * 3])
    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(compiled, "BUCKETS", ONE_WIDTH)
        with kernels(model, False):
            slow = [KVCacheModel(model, True, cache="static")(ids[:, :length], rows) for length, rows in [(20, 1), (21, 1), (24, 3), (25, 1)]]
        with kernels(model, compiled.SKINNY_ROUTE):
            fast = CompiledRunner(model)
            for (length, rows), expected in zip([(20, 1), (21, 1), (24, 3), (25, 1)], slow):
                torch.testing.assert_close(fast(ids[:, :length], rows), expected, rtol=1e-4, atol=1e-5)
            assert "linears on skinny at 1-12, own at 13+ positions" in compiled_label(model)


def test_graphs_returning_hidden_states_build_on_a_model_never_asked_for_them_before():
    """transformers installs its output-capturing hooks on the first call asking for hidden states,
    under a lock dynamo cannot trace: the runner's eager cache pass makes that call, so a graph that
    returns hidden states builds on a fresh model (the benchmark with ``--compile`` and a head)."""
    model = llama(layers=2, seed=6)
    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(compiled, "BUCKETS", (1,))
        built = len(compile_events)
        prepare(model, 64, hidden_layers=(0, 2), plain=False)  # that graph alone: the first to ask for hidden states
        assert len(compile_events) == built + 1, "plain=False builds the hidden states' graph of each bucket, no plain one"
        runner = CompiledRunner(model)
        runner.hidden_layers = (0, 2)
        ids = torch.tensor([PROMPT])
        runner(ids[:, :-1])
        runner(ids, 1)
        full = model(input_ids=ids, output_hidden_states=True).hidden_states
        torch.testing.assert_close(runner.hidden, torch.cat([full[0][0, -1:], full[2][0, -1:]], -1), rtol=1e-6, atol=1e-8)


def test_the_gemm_choice_is_named_in_the_runner_label_and_unknown_kernels_are_refused():
    """``--gemm`` reaches the graphs through ``set_cpu_gemm``; the label says which kernels a graph
    gets (no templates exist for float64: MKL's), and a name it does not know changes nothing."""
    before = compiled.CPU_GEMM
    try:
        compiled.set_cpu_gemm("templates")
        assert compiled._how(False, False, torch.float32).endswith("frozen weights, GEMM templates autotuned against MKL")
        assert compiled._how(False, False, torch.float64).endswith("frozen weights, MKL")
        assert compiled._how(False, True, torch.float32) == "inductor, prepacked linears"
        compiled.set_cpu_gemm("mkl")
        assert compiled._how(False, False, torch.float32).endswith("frozen weights, MKL")
        with pytest.raises(ValueError, match="gemm must be one of mkl, templates, skinny, got 'fast'"):
            compiled.set_cpu_gemm("fast")
        assert compiled.CPU_GEMM == "mkl"
    finally:
        compiled.set_cpu_gemm(before)
