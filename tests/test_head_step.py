"""The C head step (kernels/head_step.c, kernels/head_step.py): an EAGLE-3 head's draft step in one
C call. Its draft logits are the torch step's up to rounding (a tiny random head, the shipped head),
a row's result is bit-identical whatever the step's width or thread count, greedy EAGLE rows on it
emit target AR's tokens, and a head it cannot run falls back to torch and says why."""
import pytest
import torch

import kernels.skinny as skinny
from conftest import EOS_NEVER, PROMPT
from drafters.eagle import EagleDrafter
from eagle.head import Eagle3Head, HeadCache, HeadConfig
from kernels.head_step import LABEL
from sampling import GenerationStats, autoregressive_generate, generate
from test_eagle import trained  # noqa: F401  (a fixture: a head trained on a tiny target)

pytestmark = pytest.mark.skipif(not skinny.available()[0], reason="the skinny library is not built here")


def random_head(seed: int = 0, draft_vocab: int = 40, norm_before_residual: bool = False) -> Eagle3Head:
    """A float32 head with random weights (a draft vocabulary not a multiple of 16: a padded block)."""
    torch.manual_seed(seed)
    config = HeadConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                        target_hidden_size=48, target_vocab_size=100, draft_vocab_size=draft_vocab, aux_layers=(0, 1, 2),
                        norm_before_residual=norm_before_residual)
    head = Eagle3Head(config, own_embedding=True).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 1.5 / p.shape[-1] ** 0.5) + (1.0 if p.dim() == 1 else 0.0))
    head.set_vocabulary(torch.arange(100 - draft_vocab, 100))
    return head


def torch_step(head, cache, ids, start, hidden=None, features=None, mask=None, positions=None, n_last=1):
    """The head's torch draft step (``decode``, then its logits): the reference."""
    if features is not None:
        hidden = head.fc(features)
    out = head.decode(cache, head.embed(ids.unsqueeze(0)), hidden.unsqueeze(0), start, mask, positions)[0]
    return out, head.logits(out[out.shape[0] - n_last :])


def steps_both_ways(head, features, ids, tolerance):
    """Feed 6 positions, draft a chain of 3, then a tree depth of 3 nodes, by the C step and by torch
    (each on its own cache); assert each step's logits agree within ``tolerance``, its outputs within
    ``tolerance`` of their largest."""
    c_cache, t_cache = HeadCache(head, 8, "cpu", torch.float32), HeadCache(head, 8, "cpu", torch.float32)  # grown by both
    pairs = [(head.draft_step(c_cache, ids[:6], 0, features=features[:6]), torch_step(head, t_cache, ids[:6], 0, features=features[:6]))]
    for i in range(3):
        (c_out, _), (t_out, _) = pairs[-1]
        pairs.append((head.draft_step(c_cache, ids[6 + i : 7 + i], 5 + i, hidden=c_out[-1:]),
                      torch_step(head, t_cache, ids[6 + i : 7 + i], 5 + i, hidden=t_out[-1:])))
    mask = torch.zeros((3, 12), dtype=torch.bool)
    mask[:, :6] = True
    mask[torch.arange(3), 9 + torch.arange(3)] = True
    positions = torch.full((3,), 9)
    (c_out, _), (t_out, _) = pairs[-1]
    pairs.append((head.draft_step(c_cache, ids[9:12], 9, hidden=c_out.expand(3, -1), mask=mask, positions=positions, n_last=3),
                  torch_step(head, t_cache, ids[9:12], 9, hidden=t_out.expand(3, -1), mask=mask, positions=positions, n_last=3)))
    for (c_out, c_logits), (t_out, t_logits) in pairs:
        torch.testing.assert_close(c_logits, t_logits, rtol=tolerance, atol=tolerance)
        # the layer's outputs carry the residual (up to ~50 on the shipped head): within tolerance of their scale
        assert (c_out - t_out).abs().max() <= tolerance * t_out.abs().max()


@pytest.mark.parametrize("norm_before_residual", [False, True])
@torch.no_grad()
def test_c_draft_logits_match_the_torch_step_on_a_tiny_random_head(norm_before_residual):
    head = random_head(norm_before_residual=norm_before_residual)
    assert head.step_kind() == LABEL
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(12, 144, generator=generator)
    ids = torch.randint(100, (12,), generator=generator)
    steps_both_ways(head, features, ids, 1e-5)


@torch.no_grad()
def test_c_draft_logits_match_the_torch_step_on_the_shipped_head():
    from app.heads import SHIPPED
    from eagle.format import load_head
    from utils.models import load_embedded

    if not (SHIPPED / "config.json").is_file():
        pytest.skip("no shipped head")
    target, tokenizer = load_embedded()
    head = load_head(SHIPPED, target)
    assert head.step_kind() == LABEL
    ids = torch.tensor(tokenizer("The quick brown fox jumps over the lazy dog because it was tired of running around the farm all day long.")["input_ids"][:13])
    assert len(ids) == 13
    hidden = target(input_ids=ids.unsqueeze(0), output_hidden_states=True).hidden_states
    features = torch.cat([hidden[k][0] for k in head.config.aux_layers], -1)  # the target's own, at real scale
    steps_both_ways(head, features, ids[1:], 1e-4)


@torch.no_grad()
def test_a_rows_logits_are_bit_identical_whatever_the_steps_width_and_thread_count():
    head = random_head(seed=2)
    generator = torch.Generator().manual_seed(3)
    features, ids = torch.randn(7, 144, generator=generator), torch.randint(100, (7,), generator=generator)
    whole = head.draft_step(HeadCache(head, 16, "cpu", torch.float32), ids, 0, features=features, n_last=7)[1]
    threads = torch.get_num_threads()
    try:
        for count in sorted({1, 2, threads}):
            torch.set_num_threads(count)
            cache = HeadCache(head, 16, "cpu", torch.float32)
            first = head.draft_step(cache, ids[:4], 0, features=features[:4], n_last=4)[1]
            rest = torch.cat([head.draft_step(cache, ids[i : i + 1], i, features=features[i : i + 1])[1] for i in range(4, 7)])
            assert torch.equal(torch.cat([first, rest]), whole)
    finally:
        torch.set_num_threads(threads)


@torch.no_grad()
def test_a_head_copied_after_its_c_step_ran_runs_its_own_step_on_its_own_weights():
    """``copy.deepcopy`` of a head whose C step has run works (the step lives outside the head's
    ``__dict__``), and the copy never shares or replays the original's step: with its own weights
    edited, its draft logits are its weights' (the torch step's), the original's stay as they were;
    the step goes with its head."""
    import copy
    import gc
    import weakref

    head = random_head(seed=4)
    generator = torch.Generator().manual_seed(5)
    features, ids = torch.randn(5, 144, generator=generator), torch.randint(100, (5,), generator=generator)

    def c_logits(h):
        return h.draft_step(HeadCache(h, 8, "cpu", torch.float32), ids, 0, features=features, n_last=5)[1]

    before = c_logits(head)
    twin = copy.deepcopy(head)  # raised where the step sat in the head's __dict__ (ctypes pointers do not copy)
    twin.lm_head.weight.mul_(-1.0)
    twin_logits = c_logits(twin)
    from eagle.head import _C_STEPS  # each head's step, by the head

    assert _C_STEPS[twin][1] is not _C_STEPS[head][1]
    expected = torch_step(twin, HeadCache(twin, 8, "cpu", torch.float32), ids, 0, features=features, n_last=5)[1]
    torch.testing.assert_close(twin_logits, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(twin_logits, before, rtol=1e-3, atol=1e-3), "the edit changes the copy's logits"
    assert torch.equal(c_logits(head), before)
    refs = [weakref.ref(x) for x in (twin, _C_STEPS[twin][1])]
    del twin
    gc.collect()
    assert [r for r in refs if r() is not None] == []


@pytest.mark.parametrize("trees", [False, True])
@torch.no_grad()
def test_greedy_eagle_rows_on_the_c_head_step_emit_target_ar_tokens(trained, trees):
    """test_eagle's trained head and its target, in float32: the head drafts on the C step, its
    drafts are accepted, and the output is target AR's."""
    target, head, _ = trained
    target, head = target.to(torch.float32), head.to(torch.float32)
    assert head.step_kind() == LABEL
    expected = autoregressive_generate(PROMPT, target, max_gen_len=32, eos_tokens_id=EOS_NEVER)
    stats = GenerationStats()
    shape = dict(top_k=3, depth=4) if trees else {}
    out, _ = generate(PROMPT, target, lambda p, config: EagleDrafter.of(head, config, **shape),
                      dict(max_gen_len=32, eos_tokens_id=EOS_NEVER, use_cache=True, stats=stats, trees=trees, gamma=8 if trees else 4))
    assert out == expected and stats.accepted > 0


def test_a_head_the_c_step_cannot_run_drafts_in_torch_and_says_why():
    head = random_head().to(torch.float64)
    assert head.step_kind().startswith("torch head step (") and "float32" in head.step_kind()
    assert head._c_step() is None
    cache = HeadCache(head, 8, "cpu", torch.float64)
    out, logits = head.draft_step(cache, torch.tensor([1, 2]), 0, features=torch.randn(2, 144, dtype=torch.float64))
    assert out.dtype == torch.float64 and logits.shape == (1, 40)


def test_the_head_line_names_the_target_pass_the_cost_was_measured_against():
    from app.heads import target_pass
    from conftest import llama
    from runners import EAGER

    assert target_pass(llama().to(torch.float32), EAGER) == "the C step"
    assert target_pass(llama(), EAGER) == "the eager forward"  # float64: the lean forward in torch
    assert target_pass(llama().to(torch.float32), EAGER.with_(forward="transformers")) == "the eager forward"


def test_a_reserved_head_scratch_is_not_grown_by_a_later_step_and_an_unreserved_one_is_named():
    """``app.steps.reserve_head_scratch`` grows the C head step's scratch before the timed runs to a whole prompt's
    step over the largest cache a run reaches, so no timed step grows it; a growth inside one is logged
    (``kernels.once``), which is how the REPL and the benchmark name it."""
    from app.steps import reserve_head_scratch
    from kernels import once

    head = random_head(seed=3)
    features, ids = torch.randn(48, 3 * 48), torch.randint(60, 100, (48,))
    head.draft_step(HeadCache(head, 256, "cpu", torch.float32), ids[:4], 0, features=features[:4])  # the warm-up's
    assert head.kept_c_step() is not None
    before = once.count()
    head.draft_step(HeadCache(head, 256, "cpu", torch.float32), ids[:40], 0, features=features[:40])  # a longer prompt
    assert [event.kind for event in once.since(before)] == ["scratch"]

    head = random_head(seed=3)
    head.draft_step(HeadCache(head, 256, "cpu", torch.float32), ids[:4], 0, features=features[:4])
    reserve_head_scratch(head, widest=5, last=44)
    before = once.count()
    head.draft_step(HeadCache(head, 256, "cpu", torch.float32), ids[:40], 0, features=features[:40])
    assert once.since(before) == ()
