"""The C step made for the first time inside ``torch.inference_mode`` (a notebook's ``with
torch.inference_mode(): generate(...)`` on a fresh model): the same greedy tokens as without it, the
model's weights unchanged, later calls in or out of the mode working, and the model freed with what
the step kept beside it. Inference tensors keep no view's ``_base``, count no versions, and cannot be
written in place outside the mode: the copies kept beside a model are made as normal tensors
(``kernels.blocked.lasting``)."""
import gc
import weakref

import pytest
import torch

from conftest import PROMPT, llama, perturbed_copy
from kernels import skinny
from kernels.one_copy import held, released
from kernels.prepacking import prepackable
from kernels.step_pool import kept_step
from sampling import autoregressive_generate, speculative_generate

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here"),
              pytest.mark.skipif(not prepackable(llama().to(torch.float32)), reason="needs oneDNN (mkldnn)")]

DTYPES = [torch.float32, torch.bfloat16]
TOKENS = 12


def _pair(dtype: torch.dtype):
    """A fresh tiny target and a noisy drafter of it, in ``dtype``."""
    target = llama(layers=2)
    return target.to(dtype), perturbed_copy(target, 0.2, seed=1).to(dtype)


def _ar(target, drafter) -> list:
    return autoregressive_generate(PROMPT, target, max_gen_len=TOKENS, eos_tokens_id=[], use_cache=True)


def _speculative(target, drafter) -> list:
    return speculative_generate(PROMPT, drafter, target, gamma=3, max_gen_len=TOKENS, eos_tokens_id=[], use_cache=True)[0]


RUNS = {"autoregressive": _ar, "speculative": _speculative}


def _bits(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("run", sorted(RUNS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_first_call_inside_inference_mode_gives_what_one_outside_gives(dtype, run):
    """The first call on a fresh model inside ``inference_mode`` takes the C step (its layers released)
    and returns the tokens a fresh model's first call outside it returns; a second call, outside and
    then inside, returns them again; the weights (as ``state_dict`` reads them) never change."""
    outside = RUNS[run](*_pair(dtype))
    target, drafter = _pair(dtype)
    before = _bits(target)
    with torch.inference_mode():
        inside = RUNS[run](target, drafter)
    assert kept_step(target) is not None and released(target.model.layers[0].self_attn.q_proj)
    assert inside == outside and len(inside) == TOKENS
    assert RUNS[run](target, drafter) == outside
    with torch.inference_mode():
        assert RUNS[run](target, drafter) == outside
    after = _bits(target)
    assert all(torch.equal(after[k], v) for k, v in before.items())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_step_made_inside_inference_mode_restores_and_is_made_again_outside_it(dtype):
    """The layers released inside the mode give their weights back outside it (a cast unblocks them in
    place where it can: an inference tensor would refuse), bit for bit; a ``held`` block inside the mode
    gives back normal weights (they count versions, which the step's ``read`` compares); each next
    first call makes a new step, with the same tokens."""
    target, drafter = _pair(dtype)
    before = _bits(target)
    with torch.inference_mode():
        expected = _ar(target, drafter)
    target.to(torch.float64).to(dtype)  # a restore outside the mode, then a cast back
    assert kept_step(target) is None and not released(target.model.layers[0].self_attn.q_proj)
    assert all(torch.equal(target.state_dict()[k], v) for k, v in before.items())
    assert _ar(target, drafter) == expected
    with torch.inference_mode():
        with held(target):  # restored inside the mode
            assert not any(p.is_inference() for p in target.parameters())
        assert _ar(target, drafter) == expected  # released again, inside the mode
    assert _ar(target, drafter) == expected


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_model_whose_step_was_made_inside_inference_mode_is_freed_with_it(dtype):
    """What the step made inside the mode (its blocks, its step) holds nothing of the model: all go with it."""
    target, drafter = _pair(dtype)
    with torch.inference_mode():
        _ar(target, drafter)
    step = kept_step(target)
    refs = [weakref.ref(x) for x in (target, step, step.head, *step.keep)]
    del target, drafter, step
    gc.collect()
    assert [r for r in refs if r() is not None] == []


def test_the_start_ups_skinny_hold_inside_inference_mode_gives_the_weights_back_outside_it():
    """``hold(model, SKINNY)`` (the start-up measurement's) releases the layers without a C step: its output
    layer's blocks, a copy where they cannot be made in place (100 rows: not a multiple of 16), are a normal
    tensor, which a cast outside the mode unblocks in place, bit for bit."""
    from kernels.holding import hold
    from kernels.prepacking import SKINNY

    model = llama(vocab=100, layers=2).to(torch.float32)
    before = _bits(model)
    with torch.inference_mode():
        assert hold(model, SKINNY)
    assert released(model.lm_head) and not model.lm_head.blocks.is_inference()
    model.to(torch.float64).to(torch.float32)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_own_weights_given_back_from_prepacked_copies_inside_inference_mode_are_normal_tensors():
    """``hold(model, OWN)`` after ``hold(model, PREPACKED)``, both inside the mode (a start-up's measurement
    in a notebook's block): the weights unparked from oneDNN's copies are normal tensors, bit for bit the
    originals, which a cast outside the mode changes in place and back."""
    from kernels.holding import hold
    from kernels.prepacking import OWN, PREPACKED

    model = llama(layers=2).to(torch.float32)
    before = _bits(model)
    with torch.inference_mode():
        assert hold(model, PREPACKED)
        hold(model, OWN)
    weights = [p for p in model.parameters()]
    assert weights and not any(p.is_inference() for p in weights)
    model.to(torch.float64).to(torch.float32)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
