"""What the compiled CUDA paths keep beside a model (issue 70): the step's state (``runners.step``), the
head's (``eagle.head_step``) and transformers' compiled forward's (``runners.compiled``) die with their
model (a value of a ``WeakKeyDictionary`` that refers to its key never lets it go). Tiny models on CPU
(inductor's default mode; CUDA graphs are not exercised here)."""
import gc
import weakref

import pytest
import torch

import runners.compiled as compiled_module
import runners.step as step_module
from conftest import llama
from eagle.head_step import HeadStepCache, _STEPS
from runners import StepRunner
from test_eagle_row import head_for


def ids_for(length, seed=3):
    return torch.randint(96, (1, length), generator=torch.Generator().manual_seed(seed))


def dropped(ref: weakref.ref) -> bool:
    gc.collect()
    return ref() is None


@pytest.mark.needs_cxx
def test_the_step_state_dies_with_its_model():
    """A model that ran a prompt and a compiled pass (lazy: built) on the step, then dropped: the model,
    its state and the state's entry go."""
    model = llama(layers=1, window=512, seed=21)
    step_module.step_state(model).set_widths((1,))
    runner, ids = StepRunner(model), ids_for(10)
    runner(ids[:, :8], 8)
    runner(ids[:, :9], 1)
    model_ref, state_ref, entries = weakref.ref(model), weakref.ref(runner.state), len(step_module._STATES)
    del model, runner
    assert dropped(model_ref) and dropped(state_ref) and len(step_module._STATES) == entries - 1


@pytest.mark.needs_cxx
def test_the_heads_step_state_dies_with_its_head():
    target = llama(layers=2, init=0.1, seed=22)
    head = head_for(target)
    holder, size = HeadStepCache(head, 32), head.config.hidden_size
    zeros = torch.zeros((1, 1, size), dtype=torch.float64)
    holder.decode(zeros, zeros.clone(), 0)  # a compiled feed (lazy: built)
    head_ref, state_ref, entries = weakref.ref(head), weakref.ref(holder.steps), len(_STEPS)
    del head, holder
    assert dropped(head_ref) and dropped(state_ref) and len(_STEPS) == entries - 1


def test_the_compiled_forwards_state_dies_with_its_model():
    model = llama(layers=1, seed=23)
    state = compiled_module.compiled(model)
    model_ref, state_ref, entries = weakref.ref(model), weakref.ref(state), len(compiled_module._STATE)
    del model, state
    assert dropped(model_ref) and dropped(state_ref) and len(compiled_module._STATE) == entries - 1

