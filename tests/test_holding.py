"""One kernel option's copy of the weights at a time (kernels/holding.py): every switch gives every
weight back bit for bit, and holds one copy (tests/test_startup_memory.py counts the bytes)."""
import pytest
import torch

from conftest import llama
from kernels import skinny
from kernels.holding import hold, parked
from kernels.prepacking import OWN, PREPACKED, SKINNY, plan, prepackable

pytestmark = [pytest.mark.needs_cc, pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]


def test_every_switch_of_options_gives_every_weight_back_bit_for_bit():
    """oneDNN's copy parks a weight (its storage freed) and the blocked copy releases it: switching back
    unpacks or unblocks the same values, the output layer's too (untied here, so parked as well)."""
    model = llama(layers=2).to(torch.float32)
    if not prepackable(model):
        pytest.skip("needs oneDNN (mkldnn)")
    before = {name: value.clone() for name, value in model.state_dict().items()}
    for option in (PREPACKED, SKINNY, PREPACKED, OWN, SKINNY, OWN):
        hold(model, option)
        assert plan(model) == (option,) and parked(model) == (option == PREPACKED)
        if option == PREPACKED:
            assert model.lm_head.weight.numel() == 0  # parked: its storage is freed
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[name], value) for name, value in before.items())


def test_a_tied_output_layer_keeps_its_weight_for_the_embedding_table_that_reads_it():
    model = llama(layers=2).to(torch.float32)
    if not prepackable(model):
        pytest.skip("needs oneDNN (mkldnn)")
    model.lm_head.weight = model.model.embed_tokens.weight  # tied
    table = model.model.embed_tokens.weight.clone()
    ids = torch.tensor([[1, 2, 3]])
    hold(model, PREPACKED)
    assert parked(model) and model.model.layers[0].mlp.down_proj.weight.numel() == 0
    assert torch.equal(model.model.embed_tokens(ids), table[ids])
    hold(model, OWN)
    assert torch.equal(model.lm_head.weight, table) and model.lm_head.weight is model.model.embed_tokens.weight
