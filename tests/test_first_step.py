"""The first step's seconds (``GenerationStats.first_step_seconds``): the prompt's pass, which no drafter shortens,
recorded apart by every loop (target AR, the chain loop, the tree loop) as that step's own clock readings and no
later step's. The loops' clock is replaced by a counter that ticks once a read: nothing here reads a real clock."""
import itertools

import pytest

import sampling.base_decoding as base_decoding
import sampling.chain_decoding as chain_decoding
import sampling.tree_decoding as tree_decoding
from drafters import CopyTreeSpec, PromptLookupSpec
from sampling import GenerationStats, autoregressive_generate, generate


class Ticks:
    """A ``time`` whose ``perf_counter`` is 0, 1, 2, ... (one tick a read)."""

    def __init__(self) -> None:
        self.reads = itertools.count()

    def perf_counter(self) -> float:
        return float(next(self.reads))


def _prompt(model) -> list:
    from conftest import PROMPT

    return list(PROMPT) * 3  # repeated: prompt lookup and the copy tree find drafts in it


@pytest.mark.parametrize("loop, spec", [(chain_decoding, PromptLookupSpec(4)), (tree_decoding, CopyTreeSpec())])
def test_the_first_step_seconds_are_the_first_steps_readings_alone(loop, spec, monkeypatch):
    from conftest import EOS_NEVER, llama

    monkeypatch.setattr(loop, "time", Ticks())
    model, stats = llama(), GenerationStats()
    out, _ = generate(_prompt(model), model, spec, dict(max_gen_len=24, eos_tokens_id=EOS_NEVER, use_cache=True, stats=stats))
    assert stats.target_forward_passes > 2 and len(out) == 24
    # three reads a step (start, drafted, verified): the first step spans two ticks, as each later one does
    assert stats.first_step_seconds == 2.0
    assert stats.draft_seconds + stats.verify_seconds == 2.0 * stats.target_forward_passes
    assert stats.as_dict()["first_step_seconds"] == 2.0


def test_target_ar_records_its_prompt_pass_once(monkeypatch):
    from conftest import EOS_NEVER, llama

    ticks = Ticks()
    monkeypatch.setattr(base_decoding, "time", ticks)
    model, stats = llama(), GenerationStats()
    out = autoregressive_generate(_prompt(model), model, max_gen_len=16, eos_tokens_id=EOS_NEVER, use_cache=True, stats=stats)
    assert len(out) == 16 and stats.first_step_seconds == 1.0  # the read before the loop, the one after its first pass
    assert next(ticks.reads) == 2  # no clock read in the later steps
