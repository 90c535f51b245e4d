"""The EAGLE-3 head's draft step on compiled steps (``eagle.head_step``), as it runs where the target runs
the compiled lean step (CUDA's default): the same outputs as the head's eager ``decode`` (a chain's
catch-up, one-row drafts, a tree depth with its own mask and positions, padded widths), the eagle rows
greedy exact on it with drafts made by it, and no graph built after ``prepare_head_step``. Tiny float32
models on CPU (inductor's default mode; CUDA graphs are not exercised here)."""
import pytest
import torch
from torch._dynamo.utils import counters

from conftest import EOS_NEVER, PROMPT, llama
from eagle.head import HeadCache
from eagle.head_step import HeadStepCache, head_steps, prepare_head_step
from runners import RunnerConfig, compile_events, prepare_step
from test_eagle_row import head_for

STEP = RunnerConfig(forward="step")


@pytest.fixture(scope="module")
def pair():
    """The target's step (widths 1 and 8, with the head's hidden states) and the head's, prepared."""
    # float64: target AR compared with runs the torch forward, not the C step, which would release the target's
    # own weights (kernels.one_copy) and give each layer a number the compiled layer is specialized on
    target = llama(layers=2, init=0.1, seed=5)
    head = head_for(target)
    prepare_step(target, 100, hidden_layers=tuple(head.config.aux_layers), widths=(1, 8))
    prepare_head_step(head, 1, 100)
    return target, head


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.needs_cxx
def test_the_compiled_decode_gives_the_eager_decodes_outputs(pair):
    _, head = pair
    size, steps = head.config.hidden_size, head_steps(head)
    generator = torch.Generator().manual_seed(1)
    embeds, hidden = (torch.randn(1, 40, size, generator=generator, dtype=torch.float64) for _ in range(2))
    eager, step = HeadCache(head, 64, "cpu", torch.float64), HeadStepCache(head, 64)
    count, fallbacks, graphs = len(compile_events), steps.fallbacks, counters["stats"]["unique_graphs"]
    for start, m in ((0, 20), (20, 5), (25, 1), (26, 1), (27, 3)):  # prompt (uncompiled), catch-ups (padded to 8), drafts
        close(step.decode(embeds[:, start:start + m], hidden[:, start:start + m], start),
              head.decode(eager, embeds[:, start:start + m], hidden[:, start:start + m], start))
    mask = torch.zeros((3, 33), dtype=torch.bool)  # a tree depth: 3 nodes at slots 30..32, each over the prefix and itself
    mask[:, :30] = True
    mask[torch.arange(3), 30 + torch.arange(3)] = True
    positions = torch.full((3,), 30)
    close(step.decode(embeds[:, 30:33], hidden[:, 30:33], 30, mask, positions),
          head.decode(eager, embeds[:, 30:33], hidden[:, 30:33], 30, mask, positions))
    # the prepared graphs ran, nothing was built (our count and dynamo's)
    assert (len(compile_events), steps.fallbacks, counters["stats"]["unique_graphs"]) == (count, fallbacks, graphs)


@pytest.mark.needs_cxx
@pytest.mark.parametrize("key", ["eagle", "eagle_tree"])
def test_the_eagle_rows_on_the_step_are_greedy_exact_draft_with_the_compiled_head_and_build_nothing(pair, key, monkeypatch):
    from drafters.eagle import EagleDrafter
    from strategies import BY_KEY, RunConfig, RunContext, run_strategy

    target, head = pair
    kinds, steps = [], head_steps(head)
    method = EagleDrafter._draft_step
    monkeypatch.setattr(EagleDrafter, "_draft_step",
                        lambda self, *a, **k: kinds.append(type(self.cache).__name__) or method(self, *a, **k))
    config = RunConfig(max_gen_len=24, eos_tokens_id=EOS_NEVER, runner=STEP).with_(tree_size=7)
    context = RunContext(target=target, tokenizer=None, head=head)
    expected = run_strategy(BY_KEY["target"], PROMPT, config.with_(runner=RunnerConfig()), context).tokens
    count, fallbacks, graphs = len(compile_events), steps.fallbacks, counters["stats"]["unique_graphs"]
    result = run_strategy(BY_KEY[key], PROMPT, config, context)
    assert result.tokens == expected and result.stats.drafted > 0
    assert kinds and set(kinds) == {"HeadStepCache"}
    assert (len(compile_events), steps.fallbacks, counters["stats"]["unique_graphs"]) == (count, fallbacks, graphs)
