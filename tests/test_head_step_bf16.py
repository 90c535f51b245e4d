"""The C head step on a bfloat16 EAGLE-3 head (kernels/head_step.c on skinny_bf16.c's paths, each forced
in turn where this build has it): its widening paths are the float32 C head step on the widened weights
bit for bit, every path gives a row the same logits whatever the step's width or thread count, greedy
EAGLE rows on a bfloat16 target emit its target AR's tokens, and a hook after C steps turns the head
to its torch step over its cache cast to bfloat16."""
import copy

import pytest
import torch

import kernels.bf16 as bf16
from conftest import EOS_NEVER, PROMPT
from drafters.eagle import EagleDrafter
from eagle.head import Eagle3Head, HeadCache
from kernels.head_step import HeadStep
from kernels import skinny
from sampling import GenerationStats, autoregressive_generate, generate
from test_c_step_bf16 import WIDENING, path  # noqa: F401  (a fixture: each bfloat16 path, forced)
from test_eagle import trained  # noqa: F401  (a fixture: a head trained on a tiny target)
from test_head_step import random_head

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny library is not built here")]

GENERATOR = torch.Generator().manual_seed(4)
FEATURES, IDS = torch.randn(7, 144, generator=GENERATOR), torch.randint(100, (7,), generator=GENERATOR)


def steps(head, threads: int = 0) -> list:
    """Feed 4 positions, then 3 one at a time, then all 7 again in one step over a fresh cache, then a
    draft on the last output (``hidden``): the outputs and logits of each, on ``threads`` threads (0: as
    they are)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        cache = HeadCache(head, 8, "cpu", torch.float32)
        got = [head.draft_step(cache, IDS[:4], 0, features=FEATURES[:4], n_last=4)]
        got += [head.draft_step(cache, IDS[i : i + 1], i, features=FEATURES[i : i + 1]) for i in range(4, 7)]
        whole = HeadCache(head, 8, "cpu", torch.float32)
        got.append(head.draft_step(whole, IDS, 0, features=FEATURES, n_last=7))
        got.append(head.draft_step(whole, IDS[:1], 7, hidden=got[-1][0][-1:]))
    finally:
        torch.set_num_threads(before)
    return got


@torch.no_grad()
def test_the_widening_paths_are_the_float32_head_step_on_the_widened_weights(monkeypatch):
    head = random_head(seed=3).to(torch.bfloat16)
    expected = steps(copy.deepcopy(head).float())
    for forced in set(WIDENING) & set(bf16.paths(skinny.library())):
        monkeypatch.setattr(bf16, "FORCED", forced)
        assert head.step_kind().startswith(f"C head step (bfloat16 weights read by the {bf16.NAMES[forced]}")
        for (out, logits), (wide_out, wide_logits) in zip(steps(head), expected):
            assert torch.equal(out, wide_out) and torch.equal(logits, wide_logits), bf16.NAMES[forced]


@torch.no_grad()
def test_a_rows_logits_do_not_depend_on_the_steps_width_nor_the_thread_count(path):
    """Positions 0..6 in a step of 4 and three of one, and in one step of 7, on 1 and 2 threads: the
    same logits bit for bit (the avx512_bf16 dot too: within 1% of the float32 head's logits)."""
    head = random_head(seed=3).to(torch.bfloat16)
    wide = steps(copy.deepcopy(head).float())[4][1]  # copied before its C step is made (a ctypes struct: no copy)
    for threads in (1, 2):
        got = steps(head, threads)
        chained = torch.cat([got[0][1], *(logits for _, logits in got[1:4])])
        assert torch.equal(chained, got[4][1]), threads
    assert (got[4][1] - wide).abs().max() <= 0.01 * wide.abs().max()


@pytest.mark.parametrize("trees", [False, True])
@torch.no_grad()
def test_greedy_eagle_rows_on_a_bfloat16_target_and_head_emit_target_ar_tokens(trained, path, trees, monkeypatch):
    """test_eagle's trained head and its target, both in bfloat16: the head drafts on the C head step
    (every draft step, on the forced path), its drafts are accepted, and the output is bfloat16 target AR's."""
    target, head = (copy.deepcopy(x).to(torch.bfloat16) for x in trained[:2])
    calls, real = [], HeadStep.__call__
    monkeypatch.setattr(HeadStep, "__call__", lambda self, *a: calls.append(self.dims.weights) or real(self, *a))
    monkeypatch.setattr(Eagle3Head, "decode", lambda *a, **k: pytest.fail("a torch draft step"))
    assert head.step_kind().startswith("C head step (bfloat16 weights")
    expected = autoregressive_generate(PROMPT, target, max_gen_len=32, eos_tokens_id=EOS_NEVER)
    stats, shape = GenerationStats(), dict(top_k=3, depth=4) if trees else {}
    out, _ = generate(PROMPT, target, lambda p, config: EagleDrafter.of(head, config, **shape),
                      dict(max_gen_len=32, eos_tokens_id=EOS_NEVER, use_cache=True, stats=stats, trees=trees, gamma=8 if trees else 4))
    assert out == expected and stats.accepted > 0 and calls and set(calls) == {path}


@torch.no_grad()
def test_a_hook_after_c_steps_runs_the_torch_step_over_the_cache_cast_to_bfloat16():
    head = random_head(seed=3).to(torch.bfloat16)
    cache = HeadCache(head, 8, "cpu", torch.float32)
    out, _ = head.draft_step(cache, IDS[:4], 0, features=FEATURES[:4])
    assert out.dtype == torch.float32 and cache.keys.dtype == torch.float32  # the C head step's
    calls = []
    handle = head.lm_head.register_forward_hook(lambda *args: calls.append(1))
    try:
        out, logits = head.draft_step(cache, IDS[4:5], 4, hidden=out[-1:])
    finally:
        handle.remove()
    assert calls and cache.keys.dtype == torch.bfloat16 and logits.dtype == torch.bfloat16
    assert head.draft_step(cache, IDS[5:6], 5, hidden=out)[1].dtype == torch.bfloat16  # torch from then on
