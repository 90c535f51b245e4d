"""The C step (kernels/c_step.c, kernels/c_step.py): a whole float32 CPU pass in one C call. It
computes what the torch forward computes (to float32 rounding), a position's logits never depend on
the pass's width or the thread count, and so greedy drafting on it emits greedy decoding's tokens."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from conftest import EOS_NEVER, PROMPT, VOCAB, llama
from invariance import widths_agree
from models.llama import LlamaForward
from drafters import PromptLookupSpec
from kernels import skinny
from kernels.blocked import blocked
import kernels.c_step as c_step
from kernels.c_step import CStep, step_unsupported
from kernels.step_one import OnePass
from kernels.one_copy import held
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
from runners import LeanRunner, kernels
from runners.trees import tree_mask
from sampling import autoregressive_generate, generate, speculative_generate
from test_lean_runner import MODELS, PASSES, ids_for
from utils.models import truncated_drafter

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]


def float32(name: str):
    return MODELS[name]().to(torch.float32)


class TorchForward:
    """A lean runner whose every pass runs on the model's own linears (``kernels(model, False)``): the
    torch forward, never the step."""

    def __init__(self, model):
        self.model, self.runner = model, LeanRunner(model)

    def __getattr__(self, name):
        method = getattr(self.runner, name)
        if not callable(method):
            return method

        def on_own_linears(*args, **kwargs):
            with kernels(self.model, False):
                return method(*args, **kwargs)
        return on_own_linears

    def __call__(self, *args, **kwargs):
        with kernels(self.model, False):
            return self.runner(*args, **kwargs)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_step_logits_match_the_torch_forward(name):
    """Prompt, decoding and verification passes (Qwen2's biases, tied embeddings, Mistral's head size,
    YaRN's scaled cos/sin): the torch forward's logits to float32 rounding; the step ran them all."""
    model, ids = float32(name), ids_for()
    step = LeanRunner(model)
    torch_forward = TorchForward(model)
    for length, n in PASSES:
        torch.testing.assert_close(step(ids[:, :length], n), torch_forward(ids[:, :length], n), rtol=1e-4, atol=2e-5)
    assert step.step_passes == len(PASSES) and torch_forward.step_passes == 0


def test_a_positions_logits_do_not_depend_on_the_pass_width():
    """Positions 20..31 fed one at a time, in passes of 2..12, and as the chain of a draft tree: the
    same logits bit for bit (each row computed alone, in a fixed order)."""
    model, ids = float32("llama"), ids_for()
    runner = LeanRunner(model)
    alone = widths_agree(runner, ids)
    chain = ids[0, 20:26].tolist()
    tree = runner.tree_pass(ids[:, :20], 20, chain, list(range(-1, 5)))  # a chain as a tree: its mask is the causal one
    assert torch.equal(tree[1:], alone[:6])


def test_the_thread_count_does_not_change_the_logits():
    model, ids = float32("qwen2"), ids_for()
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(LeanRunner(model)(ids[:, :30], 5))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(r, results[0]) for r in results)


def test_greedy_drafting_rows_emit_target_ar_tokens_on_the_step():
    """Prompt lookup, NASD and a drafter model verify on the step what target AR decodes on it."""
    target = llama(layers=3).to(torch.float32)
    drafter = truncated_drafter(target, 1)
    calls = [0]
    real, one = CStep.__call__, OnePass.one  # a pass's whole call, and decoding's decided one (``runners.lean_lane``)

    def counting(self, *args, **kwargs):
        calls[0] += 1
        return real(self, *args, **kwargs)

    def counting_one(self, *args):
        calls[0] += 1
        return one(self, *args)

    CStep.__call__, OnePass.one = counting, counting_one
    try:
        reference = autoregressive_generate(PROMPT, target, 40, eos_tokens_id=EOS_NEVER, use_cache=True)
        decoded = calls[0]
        out, _ = speculative_generate(PROMPT, drafter, target, gamma=4, max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=True)
        nasd, _ = ngram_assisted_speculative_generate(PROMPT, NGramStorage(2, VOCAB), target, gamma=4, max_gen_len=40,
                                                      eos_tokens_id=EOS_NEVER, use_cache=True)
        pld, _ = generate(PROMPT, target, PromptLookupSpec(), dict(max_gen_len=40, eos_tokens_id=EOS_NEVER, use_cache=True))
    finally:
        CStep.__call__, OnePass.one = real, one
    assert decoded >= 39 and calls[0] > decoded  # every row ran on the step
    assert out == reference and nasd == reference and pld == reference


def test_a_long_prompt_runs_on_the_step_and_drafting_rows_emit_target_ar_tokens():
    """A prompt of 100 positions (past any measured width) runs on the step like every later pass, so
    prompt lookup and a drafter model verify what target AR decodes, exact by construction."""
    target = llama(layers=3).to(torch.float32)
    drafter = truncated_drafter(target, 1)
    prompt = torch.randint(VOCAB, (100,), generator=torch.Generator().manual_seed(3)).tolist()
    torch_passes = [0]
    real = LlamaForward.__call__

    def counting(self, *args, **kwargs):
        torch_passes[0] += 1
        return real(self, *args, **kwargs)

    LlamaForward.__call__ = counting
    try:
        reference = autoregressive_generate(prompt, target, 30, eos_tokens_id=EOS_NEVER, use_cache=True)
        out, _ = speculative_generate(prompt, drafter, target, gamma=4, max_gen_len=30, eos_tokens_id=EOS_NEVER, use_cache=True)
        pld, _ = generate(prompt, target, PromptLookupSpec(), dict(max_gen_len=30, eos_tokens_id=EOS_NEVER, use_cache=True))
    finally:
        LlamaForward.__call__ = real
    assert torch_passes[0] == 0  # the prompts too ran on the step
    assert out == reference and pld == reference


def wide_llama(head: int):
    """A float32 Llama with head size ``head`` (16-key attention tiles, 64 and 128 unrolled, a lane tail)."""
    return odd_llama(hidden_size=4 * head, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)


@pytest.mark.parametrize("head", [8, 24, 64])
def test_a_prompts_logits_are_the_same_at_once_in_chunks_and_position_by_position(head, monkeypatch):
    """A prompt of 200 positions fed in one pass, in chunks of 48 (c_step.CHUNK_ROWS), and one position
    at a time, on 1 and 2 threads: every position's logits the same bit for bit; the torch forward's to
    float32 rounding; the hidden states kept (an EAGLE-3 head's) the same in chunks."""
    model, ids = wide_llama(head), ids_for(200)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            at_once, chunked = LeanRunner(model), LeanRunner(model)
            at_once.hidden_layers = chunked.hidden_layers = (0, 1)
            results.append(at_once(ids, 200))
            with monkeypatch.context() as patch:
                patch.setattr(c_step, "CHUNK_ROWS", 48)
                results.append(chunked(ids, 200))
            assert torch.equal(chunked.hidden, at_once.hidden)
            alone = LeanRunner(model)
            results.append(torch.cat([alone(ids[:, : i + 1], 1) for i in range(200)]))
            assert alone.step_passes == 200
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(r, results[0]) for r in results[1:])
    torch.testing.assert_close(results[0], TorchForward(model)(ids, 200), rtol=1e-4, atol=2e-5)


def test_the_kernel_gives_each_row_alone_whatever_the_rows_with_it():
    """The skinny kernel on 1..300 rows (register tiles of 12 rows and a partial one; K and N no
    multiples of 16), on 1 and 2 threads: each row's outputs those of the row computed alone, bit for bit."""
    import ctypes

    from kernels.blocked import pack

    library = skinny.library()
    g = torch.Generator().manual_seed(2)
    w, x, b = torch.randn(40, 37, generator=g), torch.randn(300, 37, generator=g), torch.randn(40, generator=g)
    packed = pack(w)

    def run(rows: torch.Tensor, threads: int) -> torch.Tensor:
        y = torch.empty(rows.shape[0], 40)
        library.skinny_linear(ctypes.c_void_p(rows.data_ptr()), ctypes.c_void_p(packed.data_ptr()), ctypes.c_void_p(b.data_ptr()),
                              ctypes.c_void_p(y.data_ptr()), ctypes.c_int64(rows.shape[0]), ctypes.c_int64(40),
                              ctypes.c_int64(37), ctypes.c_int64(threads))
        return y

    alone = torch.cat([run(x[i: i + 1].contiguous(), 1) for i in range(300)])
    torch.testing.assert_close(alone, x @ w.T + b, rtol=1e-5, atol=1e-5)
    for threads in (1, 2):
        for m in range(1, 301):
            assert torch.equal(run(x[:m].contiguous(), threads), alone[:m]), (m, threads)


def test_hidden_states_match_the_torch_forward():
    """The residual stream entering the asked layers (what an EAGLE-3 head reads), to float32 rounding."""
    model, ids = float32("llama"), ids_for()
    step = LeanRunner(model)
    torch_forward = TorchForward(model)
    torch_forward.runner.hidden_layers = (0, 1)
    step.hidden_layers = (0, 1)
    for runner in (step, torch_forward):
        runner(ids[:, :16], 2)
        runner(ids[:, :19], 3)
    assert step.hidden.shape == (3, 2 * model.config.hidden_size) and step.hidden_start == 16
    torch.testing.assert_close(step.hidden, torch_forward.hidden, rtol=1e-4, atol=1e-5)


def test_a_tree_pass_on_the_step_matches_the_torch_forward():
    model, ids = float32("mistral"), ids_for()
    step = LeanRunner(model)
    torch_forward = TorchForward(model)
    nodes, parents = [5, 7, 9, 11, 13], [-1, 0, 0, 1, 2]
    for runner in (step, torch_forward):
        runner(ids[:, :24], 1)
    torch.testing.assert_close(step.tree_pass(ids[:, :26], 24, nodes, parents),
                               torch_forward.tree_pass(ids[:, :26], 24, nodes, parents), rtol=1e-4, atol=2e-5)
    assert tree_mask(24, 26, parents, 31, torch.float32, "cpu").shape[-2:] == (7, 31)


def odd_llama(**changes):
    torch.manual_seed(7)
    settings = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2)
    settings.update(changes)
    return LlamaForCausalLM(LlamaConfig(**settings)).to(torch.float32).eval()


def test_a_vocabulary_that_is_no_multiple_of_16_is_padded_and_cut():
    model, ids = odd_llama(), ids_for()
    step = LeanRunner(model)
    expected = TorchForward(model)(ids[:, :10], 4)
    got = step(ids[:, :10], 4)
    assert got.shape == (4, 100) and step.step_passes == 1
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=2e-5)


def test_step_unsupported_says_why_and_the_torch_forward_runs_instead():
    assert step_unsupported(llama()) == "the step runs float32 or bfloat16 weights on CPU"  # float64
    assert step_unsupported(odd_llama(mlp_bias=True)) == "its MLP has biases"
    assert step_unsupported(odd_llama(hidden_size=24, num_attention_heads=3, num_key_value_heads=3)) == \
        "its q/k/v or gate/up sizes are not multiples of 16"
    hooked = odd_llama()
    hooked.model.layers[0].mlp.up_proj.register_forward_hook(lambda *a: None)
    assert step_unsupported(hooked) == "a linear layer is quantized, hooked or not nn.Linear"
    runner = LeanRunner(hooked)  # a hooked model's passes run transformers' forward (runners.hooks): no step is made
    runner(ids_for()[:, :8], 1)
    assert runner.step is None and runner.step_passes == 0 and runner.hooked_passes == 1


def test_fused_weights_are_one_copy_that_the_layers_skinny_route_reads_too():
    """q/k/v fused: each layer's blocked weight (its one copy once the step binds, ``kernels.one_copy``)
    is a view of the fused one (no second copy); where the own weights are kept (``held``), a copy is
    remade when its weight changes in place."""
    model = odd_llama()
    attn, ids = model.model.layers[0].self_attn, ids_for()
    LeanRunner(model)(ids[:, :4], 1)
    q, k = attn.q_proj.blocks, attn.k_proj.blocks
    assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
    assert k.data_ptr() == q.data_ptr() + q.numel() * 4
    with held(model):
        assert blocked(attn.q_proj.weight) is not q  # the own weight given back, blocked anew
        with torch.no_grad():
            attn.k_proj.weight.mul_(2.0)
        expected = TorchForward(model)(ids[:, :10], 2)
        torch.testing.assert_close(LeanRunner(model)(ids[:, :10], 2), expected, rtol=1e-4, atol=2e-5)


def built(tmp_path, arch: str):
    """The library built for ``arch`` (``-march``), loaded as ``kernels.skinny`` loads its own; skipped
    where this machine cannot build and run all three (an x86-64 CPU with AVX2). Built once per run
    (``c_builds``: ``tmp_path`` is no longer where it lies)."""
    import ctypes

    from c_builds import load_for

    library = load_for(arch)
    library.skinny_linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4
    library.c_step.restype = ctypes.c_int
    library.c_step_scratch.restype = ctypes.c_int64
    return library


def test_the_kernel_rounds_alike_on_avx512_avx2_and_scalar_builds(tmp_path):
    """The processor changes between machines (AVX2 only, AVX-512, AMX): the skinny kernel built for
    AVX2 and for plain x86-64 gives this machine's build's result bit for bit (one FMA chain per
    output, whatever the vector width)."""
    from kernels.blocked import pack

    g = torch.Generator().manual_seed(1)
    w, x, b = torch.randn(200, 576, generator=g), torch.randn(7, 576, generator=g), torch.randn(200, generator=g)
    results, packed = [], pack(w)  # held: the C code reads it by address
    for arch in ("native", "haswell", "x86-64"):
        library = built(tmp_path, arch)
        y = torch.empty(7, 200)
        library.skinny_linear(x.data_ptr(), packed.data_ptr(), b.data_ptr(), y.data_ptr(), 7, 200, 576, 2)
        results.append(y)
    torch.testing.assert_close(results[0], x @ w.T + b, rtol=1e-5, atol=1e-4)
    assert torch.equal(results[1], results[0]) and torch.equal(results[2], results[0])


@pytest.mark.parametrize("head", [8, 24, 64])
def test_the_step_rounds_alike_on_avx512_avx2_and_scalar_builds(tmp_path, monkeypatch, head):
    """A prompt pass of 40 positions and a one-position pass on the step built for this CPU (its
    attention and SiLU on AVX-512 where it has it), for AVX2 and for plain x86-64: the same logits bit
    for bit (the vector paths compute every number by the plain loops' operations, in their order)."""
    model, ids = wide_llama(head), ids_for(41)
    results = []
    for arch in ("native", "haswell", "x86-64"):
        library = built(tmp_path, arch)
        with monkeypatch.context() as patch:
            patch.setattr(skinny, "library", lambda: library)
            runner = LeanRunner(model)
            results.append(torch.cat([runner(ids[:, :40], 40), runner(ids, 1)]))
            assert runner.step.library is library and runner.step_passes == 2
    assert torch.equal(results[1], results[0]) and torch.equal(results[2], results[0])


def attention_cases():
    """(queries [5, 4, D], keys, values [L, D], seen [5, L], lengths [5], D, L): head sizes with and without
    16-lane blocks, 1-300 slots (16-key blocks and a tail), five positions seeing the slots up to their
    own (a chain's staircase): every slot, a tree's scattered mask, a window's leading gap."""
    g = torch.Generator().manual_seed(5)
    cases = []
    for D in (8, 24, 64, 80, 128):
        for L in (1, 5, 16, 33, 300):
            keys, values = torch.randn(L, D, generator=g), torch.randn(L, D, generator=g)
            lengths = torch.tensor([max(1, L - 7 * (4 - p)) for p in range(5)], dtype=torch.int64)
            scattered = torch.rand(5, L, generator=g) < 0.6
            gap = (torch.arange(L) >= L // 3).expand(5, L)  # a window: the first third out of it
            for seen in (torch.ones(5, L, dtype=torch.bool), scattered, gap):
                seen = seen.clone()
                seen[torch.arange(5), lengths - 1] = True  # the position itself: always seen
                cases.append((torch.randn(5, 4, D, generator=g) * 2, keys, values, seen.to(torch.uint8), lengths, D, L))
    return cases


def test_attention_gives_each_query_the_bits_of_attention_one_query_at_a_time(tmp_path):
    """attend_positions (several positions' query heads of one key-value head at once, sharing key and
    value loads: the C step's long passes) against one query at a time (decoding's), on the build for
    this CPU (AVX-512 where it has it), for AVX2 and for plain x86-64: every output bit for bit, at 1-4
    heads and 1 or 5 positions, over attention_cases; the seen slots moved together (a tree's branch as
    its chain) the same bits; and the three builds alike."""
    import ctypes

    def attention(library, q, keys, values, seen, lengths, D, L, together):
        out = torch.empty(q.shape)
        assert 0 == library.c_attend(*(ctypes.c_void_p(x.data_ptr()) for x in (q,)), ctypes.c_int64(q.shape[0]),
                                     ctypes.c_int64(q.shape[1]), *(ctypes.c_void_p(x.data_ptr()) for x in (keys, values, seen, lengths)),
                                     ctypes.c_int64(L), ctypes.c_int64(D), ctypes.c_float(D ** -0.5), ctypes.c_void_p(out.data_ptr()),
                                     ctypes.c_int64(together))
        return out

    results = []
    for arch in ("native", "haswell", "x86-64"):
        library = built(tmp_path, arch)
        outputs = []
        for q, keys, values, seen, lengths, D, L in attention_cases():
            for positions, heads in ((1, 1), (1, 3), (5, 2), (5, 3), (5, 4)):
                queries = q[:positions, :heads].contiguous()
                alone = attention(library, queries, keys, values, seen, lengths, D, L, 0)
                together = attention(library, queries, keys, values, seen, lengths, D, L, 1)
                assert torch.equal(together, alone), (arch, D, L, positions, heads)
                visible = seen[:positions].bool() & (torch.arange(L) < lengths[:positions, None])
                weights = torch.softmax((queries @ keys.T * D ** -0.5).masked_fill(~visible[:, None], -float("inf")), -1)
                torch.testing.assert_close(alone, weights @ values, rtol=1e-4, atol=1e-5)
                outputs.append(alone)
            visible = (seen[0].bool() & (torch.arange(L) < lengths[0])).nonzero()[:, 0]  # the first position's slots
            branch = attention(library, q[:1, :2].contiguous(), keys[visible].contiguous(), values[visible].contiguous(),
                               torch.ones(1, len(visible), dtype=torch.uint8), torch.tensor([len(visible)]), D, len(visible), 1)
            assert torch.equal(branch, outputs[-4][:, :2]), (arch, D, L)  # (1, 3)'s first two heads: where the slots sit counts not
        results.append(outputs)
    assert all(torch.equal(a, b) for other in results[1:] for a, b in zip(results[0], other))
