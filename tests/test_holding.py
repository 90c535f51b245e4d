"""One kernel option's copy of the weights at a time (kernels/holding.py): every switch gives every
weight back bit for bit, and holds one copy (tests/test_startup_memory.py counts the bytes)."""
import copy

import pytest
import torch

from conftest import llama
from kernels import skinny
from kernels.holding import hold, parked
from kernels.prepacking import OWN, PREPACKED, SKINNY, plan, prepackable, set_prepack

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
            assert model.lm_head.linear[0].weight.numel() == 0  # parked: its storage is freed
            assert torch.equal(model.lm_head.weight, before["lm_head.weight"])  # read, it unpacks oneDNN's copy
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
    assert parked(model) and model.model.layers[0].mlp.down_proj.linear[0].weight.numel() == 0  # its storage freed
    assert torch.equal(model.model.embed_tokens(ids), table[ids])
    hold(model, OWN)
    assert torch.equal(model.lm_head.weight, table) and model.lm_head.weight is model.model.embed_tokens.weight


def test_a_tied_output_layer_gets_no_onednn_copy_beside_its_table_and_runs_its_own_kernel():
    """oneDNN's copy of the embedding table would be a second table (issue 71): the tied output layer makes
    none, where its route says prepacked it runs its own kernel on the table, bit for bit ``F.linear``'s."""
    model = llama(layers=2).to(torch.float32)
    if not prepackable(model):
        pytest.skip("needs oneDNN (mkldnn)")
    model.lm_head.weight = model.model.embed_tokens.weight  # tied
    table = model.model.embed_tokens.weight.detach().clone()
    hidden = torch.randn(3, table.shape[1], generator=torch.Generator().manual_seed(4))
    for switch in (lambda: hold(model, PREPACKED), lambda: set_prepack(model, True, (PREPACKED, OWN))):
        switch()
        head = model.lm_head
        assert head.shared and head.packed is None and not model.model.layers[0].mlp.down_proj.shared
        assert torch.equal(head(hidden), torch.nn.functional.linear(hidden, table)) and head.packed is None


def test_a_prepacked_plan_runs_on_onednns_copies_alone_and_every_path_reads_the_weights_back():
    """A plan with oneDNN's kernels at 1-2 positions and the own at 3+ (``apply_kernels``) parks the own
    weights: its tokens and a long pass's logits are those of the same plan with the own weights kept,
    bit for bit (the own width unpacks the same values); ``state_dict``, the parameter count, a copy and a
    cast read them back."""
    from conftest import EOS_NEVER, PROMPT
    from measure.budgets import parameter_count
    from measure.kernels import KernelChoice, apply_kernels
    from sampling import autoregressive_generate

    choice = KernelChoice({OWN: (2.0, 2.0), PREPACKED: (1.0, 3.0), SKINNY: (5.0, 5.0)})
    assert choice.route() == (PREPACKED, PREPACKED, OWN)
    model, kept = llama(layers=2).to(torch.float32), llama(layers=2).to(torch.float32)
    if not prepackable(model):
        pytest.skip("needs oneDNN (mkldnn)")
    before = {name: value.clone() for name, value in model.state_dict().items()}
    apply_kernels(model, choice)
    set_prepack(kept, True, choice.route())  # the same kernels, the own weights beside oneDNN's copies
    assert parked(model) and model.model.layers[0].self_attn.q_proj.linear[0].weight.numel() == 0 and not parked(kept)
    ids = torch.randint(96, (1, 40), generator=torch.Generator().manual_seed(2))
    assert torch.equal(model(ids).logits, kept(ids).logits)
    tokens = autoregressive_generate(PROMPT, model, 16, eos_tokens_id=EOS_NEVER, use_cache=True)
    assert tokens == autoregressive_generate(PROMPT, kept, 16, eos_tokens_id=EOS_NEVER, use_cache=True)
    assert all(torch.equal(model.state_dict()[name], value) for name, value in before.items())
    assert parameter_count(model) == sum(p.numel() for p in kept.parameters())  # a saved measurement's key reads it
    copied = copy.deepcopy(model)
    assert not parked(copied) and autoregressive_generate(PROMPT, copied, 16, eos_tokens_id=EOS_NEVER, use_cache=True) == tokens
    model.to(torch.float64)
    assert not parked(model) and all(torch.equal(model.state_dict()[name], value.double()) for name, value in before.items())
