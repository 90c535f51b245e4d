"""What the compiled CUDA paths keep beside a model (issue 70): the step's state (``runners.step``), the
head's (``eagle.head_step``) and transformers' compiled forward's (``runners.compiled``) die with their
model (a value of a ``WeakKeyDictionary`` that refers to its key never lets it go); a captured pass is
keyed on every layer of its cache and goes with it (a fake CUDA graph on CPU); a cast or a load that moves
the weights makes a new state; a build that fails is one line and the passes run eagerly. Tiny models on
CPU (inductor's default mode; real CUDA graphs are not exercised here)."""
import contextlib
import gc
import weakref

import pytest
import torch

import runners.compiled as compiled_module
import runners.step as step_module
from conftest import llama
from eagle.head import HeadCache
from eagle.head_step import HeadStepCache, _STEPS
from models.llama import KVCache, KVLayer
from runners import StepRunner
from runners.step_graphs import CapturedPasses, weights_key
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


class FakeGraph:
    """A CUDA graph on CPU: ``replay`` runs the captured call again over the cache it was captured on (held
    weakly: a CUDA graph holds addresses, not the Python objects)."""

    capturing = None

    def __init__(self):
        self.call = None

    def replay(self):
        forward, (ids, positions, slots, mask, cache, n_last, layers) = self.call
        forward(ids, positions, slots, mask, cache(), n_last, layers)

    def pool(self):
        return None


@contextlib.contextmanager
def fake_capture(graph, pool=None):
    FakeGraph.capturing = graph
    try:
        yield
    finally:
        FakeGraph.capturing = None


def fake_cuda(monkeypatch):
    class Stream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", fake_capture)


def marking(ids, positions, slots, mask, cache, n_last, layers):
    """A pass that writes ``ids[0]`` into every layer's keys and values at slot 0 (and is captured as that)."""
    if FakeGraph.capturing is not None:
        FakeGraph.capturing.call = (marking, (ids, positions, slots, mask, weakref.ref(cache), n_last, layers))
    for layer in cache.layers:
        layer.keys[0, 0, 0].fill_(ids[0].item())
        layer.values[0, 0, 0].fill_(ids[0].item())
    return ids.clone(), None


def small_cache(layers=2, capacity=8):
    return KVCache([KVLayer(torch.zeros(1, 1, capacity, 2), torch.zeros(1, 1, capacity, 2)) for _ in range(layers)], capacity)


def test_a_captured_pass_is_keyed_on_every_layer_of_its_cache_and_goes_with_the_cache(monkeypatch):
    """A cache sharing layer 0 with one a graph was captured on, its other layers new: today's key (layer
    0's address) replayed the old graph, which wrote the old cache's layer 1 and left the new one's
    unwritten. Each cache gets its own graph, and a freed cache's graphs are dropped."""
    fake_cuda(monkeypatch)
    passes = CapturedPasses(marking, torch.device("cpu"))
    ids, positions, slots = (torch.zeros(1, dtype=torch.long) for _ in range(3))
    mask = torch.ones(1, 1, 1, 8, dtype=torch.bool)
    first = small_cache()
    ids.fill_(3)
    passes(ids, positions, slots, mask, first, 1, ())
    second = KVCache([first.layers[0], small_cache(1).layers[0]], 8)
    ids.fill_(5)
    passes(ids, positions, slots, mask, second, 1, ())
    assert second.layers[1].keys[0, 0, 0, 0] == 5 and second.layers[1].values[0, 0, 0, 0] == 5
    assert first.layers[1].keys[0, 0, 0, 0] == 3  # the first cache's own layer is not written by the second's pass
    assert len(passes.graphs) == 2
    del first
    gc.collect()
    assert len(passes.graphs) == 1


@pytest.mark.needs_cxx
def test_a_cast_or_a_load_that_moves_the_weights_makes_a_new_state_and_the_passes_follow_them():
    """After a pass on the step, a load of other weights (in place, then with ``assign=True``), then a cast to
    float32: a pass's logits are transformers' forward's on the weights the model holds now. The cast makes
    a new state; on CUDA (captured graphs read the weights' addresses) the load with ``assign=True`` does
    too, and the in-place one does not: what ``weights_key`` tells apart."""
    model, other, ids = llama(layers=1, window=512, seed=24), llama(layers=1, window=512, seed=25), ids_for(12)

    def state_after_a_pass(tolerance):
        runner = StepRunner(model)
        runner(ids[:, :10], 10)
        logits = runner(ids[:, :11], 1)  # lazy: a compiled pass
        with torch.no_grad():
            expected = model(ids[:, :11]).logits[0, -1:]
        torch.testing.assert_close(logits, expected, rtol=tolerance, atol=tolerance)
        return runner.state

    before, addresses = state_after_a_pass(1e-6), weights_key(model, True)
    model.load_state_dict(other.state_dict())
    assert weights_key(model, True) == addresses
    model.load_state_dict(other.state_dict(), assign=True)
    assert weights_key(model, True) != addresses and weights_key(model, False) == before.weights
    state_after_a_pass(1e-6)
    model.to(torch.float32)
    cast = state_after_a_pass(1e-4)
    assert cast is not before and cast.dtype == torch.float32


@pytest.mark.needs_cxx
def test_the_heads_step_follows_a_cast_of_the_head():
    target = llama(layers=2, init=0.1, seed=26)
    head = head_for(target)
    size = head.config.hidden_size
    generator = torch.Generator().manual_seed(2)
    embeds, hidden = (torch.randn(1, 1, size, generator=generator, dtype=torch.float64) for _ in range(2))
    HeadStepCache(head, 32).decode(embeds, hidden, 0)  # a compiled feed (lazy: built)
    head.to(torch.float32)
    embeds, hidden = embeds.float(), hidden.float()
    holder = HeadStepCache(head, 32)
    torch.testing.assert_close(holder.decode(embeds, hidden, 0), head.decode(HeadCache(head, 32, "cpu", torch.float32), embeds, hidden, 0),
                               rtol=1e-5, atol=1e-5)
    assert holder.cache.keys.dtype == torch.float32


def broken_compile(*args, **kwargs):
    raise RuntimeError("inductor: no working C++ compiler\n(a traceback's second line)")


def test_a_failed_compile_is_one_line_and_the_passes_run_the_steps_eager_forward(capsys):
    """The compiled layer raising at its first pass (as a failed compile or capture does): one line on
    stderr naming what failed and what runs instead, and every pass's logits are transformers' forward's."""
    model, ids = llama(layers=1, window=512, seed=27), ids_for(14)
    state = step_module.step_state(model)
    state.step.layer = broken_compile  # regional, on CPU: what the compiled passes call for each layer
    runner = StepRunner(model)
    got = [runner(ids[:, :10], 10)] + [runner(ids[:, :length], 1) for length in (11, 12, 14)]
    with torch.no_grad():
        expected = model(ids).logits[0]
    for logits, rows in zip(got, (slice(0, 10), slice(10, 11), slice(11, 12), slice(13, 14))):
        torch.testing.assert_close(logits, expected[rows], rtol=1e-6, atol=1e-6)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "RuntimeError: inductor: no working C++ compiler" in lines[0]
    assert "failed" in lines[0] and "the step's eager forward" in lines[0]
    assert "compile failed" in step_module.step_label(model)


def test_a_failed_compile_of_the_heads_step_is_one_line_and_its_feeds_run_eagerly(capsys):
    target = llama(layers=2, init=0.1, seed=28)
    head = head_for(target)
    holder, size = HeadStepCache(head, 32), head.config.hidden_size
    holder.steps.compiled = broken_compile
    generator = torch.Generator().manual_seed(3)
    embeds, hidden = (torch.randn(1, 6, size, generator=generator, dtype=torch.float64) for _ in range(2))
    eager = HeadCache(head, 32, "cpu", torch.float64)
    for start, m in ((0, 4), (4, 1), (5, 1)):
        torch.testing.assert_close(holder.decode(embeds[:, start:start + m], hidden[:, start:start + m], start),
                                   head.decode(eager, embeds[:, start:start + m], hidden[:, start:start + m], start))
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "RuntimeError: inductor: no working C++ compiler" in lines[0] and "eager" in lines[0]
