"""Our compiled decoding pass is one graph on CPU: ``runners.explain`` (``torch._dynamo.explain``)
finds no graph break in it, and finds one where a layer has one. A file of its own: explain resets
dynamo, so every graph compiled before it in the process is built again at its next call."""
import torch
import torch._dynamo

from conftest import llama
from runners.explain import explain_pass


def test_our_compiled_one_position_pass_is_one_graph_without_a_break():
    """The decoding step as ``CompiledRunner`` runs it on CPU (the static cache, our shared-heads
    attention, a grouped-query model): one graph, no break, so no Python runs between its layers."""
    explained = explain_pass(llama(layers=2), 1)
    assert (explained.graphs, explained.breaks, explained.reasons) == (1, 0, ()), explained.lines()
    assert explained.layers == 2 and explained.ops > 0 and explained.guards > 0


def test_a_graph_break_in_a_layer_is_found_with_its_reason():
    model = llama(layers=2)
    layer = model.model.layers[1]
    forward = layer.forward

    def broken(*args, **kwargs):
        torch._dynamo.graph_break()
        return forward(*args, **kwargs)

    layer.forward = broken
    explained = explain_pass(model, 4)
    assert explained.graphs >= 2 and explained.breaks >= 1 and explained.reasons, explained.lines()
    assert all(reason.endswith(")") and ".py:" in reason for reason in explained.reasons), explained.reasons  # where, too
