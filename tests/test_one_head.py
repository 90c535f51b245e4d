"""The output layer held once (kernels/one_head.py): where the C step releases a model whose output
layer is its embedding table (tied), the table's one copy is the step's blocked copy, made over the
weight's own memory; the embedding reads its rows from it, and every output, saved weight, copy and cast
is what the tied own weight gave, bit for bit. (An untied output layer is released alike:
tests/test_one_copy.py runs its paths on one.)"""
import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from conftest import EOS_NEVER, PROMPT
from drafters import PromptLookupSpec
import kernels.blocked as blocked
from kernels import skinny
from kernels.one_copy import held, parameter_count, released, weight_bytes
from kernels.blocked import DTYPES
from kernels.one_copy import STEP_ROUTE
from kernels import one_copy, one_head
from kernels.one_head import ReleasedEmbedding, release_head
from kernels.prepacking import set_prepack
from runners import LeanRunner
from sampling import autoregressive_generate, generate
from utils.allocations import counted, tensor_bytes
from utils.models import truncated_drafter

pytestmark = [pytest.mark.needs_cc, pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")]

LONG = torch.randint(96, (1, 100), generator=torch.Generator().manual_seed(1))  # past the step's 64 positions


def tied(dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """A small Llama whose output layer is its embedding table (96 rows: blocks of 16, blocked in place)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval().to(dtype)


def stepped(model: LlamaForCausalLM) -> LeanRunner:
    runner = LeanRunner(model)
    runner(LONG[:, :8], 1)
    return runner


def outputs(model) -> dict:
    """Target AR's and a drafting row's greedy tokens (the step), a long prompt's logits and transformers' forward."""
    target = autoregressive_generate(PROMPT, model, 30, eos_tokens_id=EOS_NEVER, use_cache=True)
    lookup, _ = generate(PROMPT, model, PromptLookupSpec(), dict(max_gen_len=30, eos_tokens_id=EOS_NEVER, use_cache=True))
    return dict(target=target, lookup=lookup, long=LeanRunner(model)(LONG, 5), transformers=model(LONG).logits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tied_output_layer_is_held_once_blocked_in_its_own_memory(dtype, monkeypatch):
    """Counted by storage: the model and the step's output layer come to the weights once (keeping the table
    beside its blocks: 1.11x here), the blocks lie in the weight's own memory, and releasing allocates no second table."""
    model = tied(dtype)
    weights, address = tensor_bytes(*model.parameters(), *model.buffers()), model.lm_head.weight.data_ptr()
    table = tensor_bytes(model.lm_head.weight)
    set_prepack(model, True, STEP_ROUTE, DTYPES)  # the step's route, as ``release`` gives it
    monkeypatch.setattr(blocked, "IN_PLACE_ROWS", 32)  # a third of the table at a time
    with counted() as seen:
        release_head(model)
    runner = stepped(model)
    head, embedding = model.lm_head, model.model.embed_tokens
    assert released(head) and type(embedding) is ReleasedEmbedding and head.blocks.data_ptr() == address
    assert embedding.blocks is head.blocks and runner.step.head is head.blocks
    assert weight_bytes(model, runner.step.head) <= weights  # parameters, buffers, released blocks and the step's head
    assert seen.peak < table / 2  # a chunk at a time, never the table again


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_tokens_logits_and_embeddings_are_unchanged_bit_for_bit(dtype):
    model = tied(dtype)
    table = model.model.embed_tokens.weight.detach().clone()
    with held(model):
        before = outputs(model)
    after = outputs(model)
    assert released(model.lm_head) and type(model.model.embed_tokens) is ReleasedEmbedding
    assert after["target"] == before["target"] and after["lookup"] == before["lookup"]
    assert torch.equal(after["long"], before["long"]) and torch.equal(after["transformers"], before["transformers"])
    assert torch.equal(model.model.embed_tokens(LONG), table[LONG])
    for n in (0, 15, 16, 95, -1):  # one id (decoding's: indexed by Python ints), block edges, a negative one
        for ids in (torch.tensor([n]), torch.tensor([[n]])):
            row = model.model.embed_tokens(ids)
            assert torch.equal(row, table[ids]) and row.is_contiguous()
            row.zero_()  # a copy: the blocks (the output layer's one copy) untouched
    assert torch.equal(model.model.embed_tokens(LONG), table[LONG])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_output_layers_blocks_are_asked_onto_huge_pages_with_the_layers(dtype, monkeypatch):
    """The release asks for 2 MB pages (``kernels.huge_pages``) over the output layer's blocks too, a fifth of
    SmolLM2's pass: the layers' and the output layer's spans in one call."""
    asked = []
    monkeypatch.setattr(one_copy, "collapse", lambda spans: asked.extend(spans) or 0)  # what it asks for, ON or not
    model = tied(dtype)
    stepped(model)
    blocks = model.lm_head.blocks
    assert released(model.lm_head) and (blocks.data_ptr(), blocks.numel() * blocks.element_size()) in asked
    assert len(asked) == 1 + 4 * model.config.num_hidden_layers  # q/k/v, o, gate/up, down a layer, and the output layer


def test_saving_copying_counting_and_casting_give_the_tied_table_back():
    """``state_dict`` writes the table under both names; a copy (a truncated drafter) and a cast get it
    back tied (one Parameter), the embedding a plain one; the parameter count is the tied model's."""
    fresh = tied()
    model = tied()
    stepped(model)
    saved = model.state_dict()
    assert all(torch.equal(saved[k], v) for k, v in fresh.state_dict().items()) and list(saved) == list(fresh.state_dict())
    assert parameter_count(model) == sum(p.numel() for p in fresh.parameters())
    for other in (copy.deepcopy(model), truncated_drafter(model, 1)):
        assert type(other.model.embed_tokens) is torch.nn.Embedding and other.lm_head.weight is other.model.embed_tokens.weight
        assert torch.equal(other.lm_head.weight, fresh.lm_head.weight)
    assert autoregressive_generate(PROMPT, model, 12, eos_tokens_id=EOS_NEVER, use_cache=True) == \
        autoregressive_generate(PROMPT, fresh, 12, eos_tokens_id=EOS_NEVER, use_cache=True)
    model.to(torch.float64)
    assert type(model.model.embed_tokens) is torch.nn.Embedding and model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, fresh.lm_head.weight.double())


def test_a_load_gives_the_table_back_tied_and_the_next_step_releases_it_again():
    model, other = tied(), tied()
    with torch.no_grad():
        other.model.embed_tokens.weight.mul_(2)
    stepped(model)
    model.load_state_dict(other.state_dict())
    assert model.lm_head.weight is model.model.embed_tokens.weight and torch.equal(model.lm_head.weight, other.lm_head.weight)
    stepped(model)
    assert released(model.lm_head) and torch.equal(model.model.embed_tokens(LONG), other.model.embed_tokens.weight[LONG])


def test_a_table_a_caller_holds_is_copied_never_overwritten():
    """A weight someone else holds (a name in a notebook) keeps its values: the blocks are a copy then."""
    model = tied()
    kept = model.lm_head.weight
    values = kept.detach().clone()
    stepped(model)
    assert released(model.lm_head) and model.lm_head.blocks.data_ptr() != kept.data_ptr() and torch.equal(kept, values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_restore_unblocks_the_output_layer_over_its_own_blocks_to_the_exact_weights(dtype, monkeypatch):
    """A switch away from the skinny kernel (``restore``, issue 71): the table comes back over its blocks'
    own memory, a chunk at a time (never a second table), bit for bit the original, tied to a plain
    embedding again; and the next release blocks it in place again."""
    model = tied(dtype)
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32  # -0.0 and NaN compare as written
    original, table = model.lm_head.weight.detach().clone(), tensor_bytes(model.lm_head.weight)
    set_prepack(model, True, STEP_ROUTE, DTYPES)
    release_head(model)
    address = model.lm_head.blocks.data_ptr()
    monkeypatch.setattr(blocked, "IN_PLACE_ROWS", 32)  # a third of the table at a time
    with counted() as seen:
        model.lm_head.restore()
    weight, embedding = model.lm_head.weight, model.model.embed_tokens
    assert not released(model.lm_head) and weight.data_ptr() == address and torch.equal(weight.view(bits), original.view(bits))
    assert type(embedding) is torch.nn.Embedding and embedding.weight is weight
    assert seen.peak < table / 2
    del weight, embedding  # a name held would make the next release copy (``_in_place``)
    release_head(model)
    assert released(model.lm_head) and model.lm_head.blocks.data_ptr() == address


@pytest.mark.parametrize("rows", [96, 100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unblocking_in_place_gives_unpacks_values_in_the_blocks_memory(dtype, rows):
    """``unpack_in_place`` equals ``unpack`` bit for bit, a padded last block (100 rows) too, in chunks smaller than the weight."""
    from kernels.blocked import pack, unpack, unpack_in_place

    weight = torch.randn(rows, 32, generator=torch.Generator().manual_seed(3)).to(dtype)
    blocks = pack(weight)
    address = blocks.data_ptr()
    back = unpack_in_place(blocks, rows, chunk_rows=32)
    assert back.data_ptr() == address and back.shape == weight.shape and torch.equal(back, weight)


def test_blocks_another_holds_are_never_unblocked_over():
    """A restore while someone else holds the blocks (a step not yet dropped, a name in a notebook): the
    weight is unblocked into new memory and the blocks keep their values."""
    model = tied()
    original = model.lm_head.weight.detach().clone()
    set_prepack(model, True, STEP_ROUTE, DTYPES)
    release_head(model)
    kept = model.lm_head.blocks
    values = kept.clone()
    model.lm_head.restore()
    assert model.lm_head.weight.data_ptr() != kept.data_ptr() and torch.equal(kept, values)
    assert torch.equal(model.lm_head.weight, original)
