"""A CPU model loaded tensor by tensor (``utils.tensor_load``, issue 71): bit for bit transformers' own load
(weights, buffers, config, generation config, tied tables), each weight in memory of its own, so that a weight
released later gives its bytes back, and a bfloat16 load of a float32 file never holds the float32 file
whole. Counted by torch's allocator (``utils.allocations``), never by a clock."""
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from conftest import save_tiny
from utils.allocations import counted, tensor_bytes
from utils.models import load_model
from utils.tensor_load import read_tensors


def saved(tmp_path, tied: bool) -> str:
    """A float32 Llama's folder (one safetensors file), its tables tied or two (as the pair's GGUF conversion)."""
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=tied)
    return save_tiny(tmp_path / "model", LlamaForCausalLM(config).eval())


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tied", [False, True])
def test_the_load_is_transformers_load_bit_for_bit(tmp_path, dtype, tied):
    """Every parameter and buffer the same bits and dtype, the same config, generation config and tying, eval mode."""
    folder = saved(tmp_path, tied)
    ours, _, _ = load_model(folder, "cpu", dtype)
    theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    mine, reference = ours.state_dict(), theirs.state_dict()
    assert mine.keys() == reference.keys()
    for name, tensor in reference.items():
        assert mine[name].dtype == tensor.dtype and torch.equal(bits(mine[name]), bits(tensor)), name
    assert ours.config.to_dict() == theirs.config.to_dict()
    assert ours.generation_config.to_dict() == theirs.generation_config.to_dict()
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == tied and not ours.training


def test_a_released_weight_gives_its_bytes_back(tmp_path):
    """What the C step relies on when it releases a layer's own weights into its blocks: each weight's memory is
    its own (a mapped file would keep every byte while any other weight of it lives)."""
    folder = saved(tmp_path, tied=False)
    with counted() as held:
        model, _, _ = load_model(folder, "cpu", "float32")
        weights = tensor_bytes(*model.parameters(), *model.buffers())
        released = model.model.layers[0].mlp.up_proj.weight
        size = released.untyped_storage().nbytes()
        released.data = torch.empty(0)
    assert held.peak <= weights * 1.001 and held.end <= weights - size + 1024


def test_a_bfloat16_load_holds_its_weights_and_one_float32_tensor(tmp_path):
    """Not the float32 file whole beside the bfloat16 weights (1.5x the float32 weights, 3x the bfloat16 ones)."""
    folder = saved(tmp_path, tied=False)
    largest = max(t.numel() * 4 for t in read_tensors(f"{folder}/model.safetensors").values())
    with counted() as held:
        model, _, _ = load_model(folder, "cpu", "bfloat16")
    weights = tensor_bytes(*model.parameters(), *model.buffers())
    assert model.dtype == torch.bfloat16 and held.peak <= weights + largest, f"{held.peak / weights:.2f}x the bfloat16 weights"


def test_a_file_whose_bytes_fall_short_of_its_header_is_refused(tmp_path):
    folder = saved(tmp_path, tied=True)
    file = tmp_path / "model" / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-16])
    with pytest.raises(ValueError, match="does not have the"):
        read_tensors(file)
