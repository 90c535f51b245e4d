"""A CPU model loaded from its folder's one safetensors file tensor by tensor, each tensor in memory of its
own (torch's allocator), cast to the dtype asked as it is read (issue 71: a first start within memory).

Why not transformers' own load: it maps the whole file (safetensors' mmap backend: one mapping that every
weight is a view of, counted by torch's allocator as one block). A weight released later (the C step's
blocks replacing a layer's own weights, the dtype race's copy not chosen) gives nothing back while any
other tensor of the file lives, so a start held the mapped file beside the C step's blocks; and a load in
another dtype (bfloat16 from a float32 file) reads the whole float32 file into that mapping while it casts,
1.5x its bfloat16 weights beside them. Here the load holds its weights plus one tensor in the file's dtype.
Bit for bit transformers' load: the same cast (``Tensor.to``), the model built by its ``from_pretrained``
from the state dict (no copy: the tensors become the parameters), its folder's generation config and name."""
import json
from pathlib import Path
from typing import Dict, Optional

import torch
from torch.nn import Module

FILE = "model.safetensors"
# safetensors' dtype names (https://github.com/huggingface/safetensors, the format's header)
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
          "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def read_tensors(file: Path, dtype: Optional[torch.dtype] = None) -> Dict[str, torch.Tensor]:
    """Every tensor of a safetensors ``file``, read one at a time into a tensor of its own, each floating one cast
    to ``dtype`` (None: as stored) before the next is read. ValueError for a dtype or a file this does not read."""
    state: Dict[str, torch.Tensor] = {}
    with open(file, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
        header.pop("__metadata__", None)
        for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):  # in file order
            if entry["dtype"] not in DTYPES:
                raise ValueError(f"{file}: {name} is {entry['dtype']}, a dtype this reader does not take")
            begin, end = entry["data_offsets"]
            tensor = torch.empty(entry["shape"], dtype=DTYPES[entry["dtype"]])
            handle.seek(8 + size + begin)
            if tensor.numel() * tensor.element_size() != end - begin or handle.readinto(tensor.reshape(-1).view(torch.uint8).numpy()) != end - begin:
                raise ValueError(f"{file}: {name} does not have the {end - begin} bytes its header gives")
            state[name] = tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
    return state


PLAIN = {"dtype", "trust_remote_code", "local_files_only"}  # ``from_pretrained``'s arguments this load takes (no quantization, no device map)


def from_folder(auto, folder, cpu: bool, kwargs: dict) -> Module:
    """``auto.from_pretrained(folder, **kwargs)``, loaded ``tensor_by_tensor`` where that applies: on CPU (``cpu``), with
    only ``PLAIN`` arguments and no remote code."""
    model = None
    if cpu and set(kwargs) == PLAIN and not kwargs["trust_remote_code"]:
        model = tensor_by_tensor(auto, folder, kwargs["dtype"], kwargs["local_files_only"])
    return auto.from_pretrained(folder, **kwargs) if model is None else model


def tensor_by_tensor(auto, folder, dtype, local_files_only: bool) -> Optional[Module]:
    """The model in ``folder`` (``auto``: transformers' Auto class for it) loaded by ``read_tensors`` in ``dtype``
    (a torch dtype, or "auto": the config's); None where this load does not apply (no single safetensors file,
    a dtype the config does not give, a model keeping some modules in float32): the caller loads it as transformers does."""
    from transformers import AutoConfig, GenerationConfig
    from transformers.models.auto.auto_factory import _get_model_class

    file = Path(folder) / FILE
    if not file.is_file():
        return None
    config = AutoConfig.from_pretrained(folder, local_files_only=local_files_only)
    dtype = getattr(config, "dtype", None) if dtype == "auto" else dtype
    if not isinstance(dtype, torch.dtype) or type(config) not in auto._model_mapping:
        return None
    model_class = _get_model_class(config, auto._model_mapping)
    if getattr(model_class, "_keep_in_fp32_modules", None) or getattr(model_class, "_keep_in_fp32_modules_strict", None):
        return None  # transformers casts those back to float32 from the file's bits, not from ours
    model = model_class.from_pretrained(None, config=config, dtype=dtype, state_dict=read_tensors(file, dtype))
    model.config.name_or_path = str(folder)  # as a load from the folder names it (saved measurements' keys read it)
    if model.can_generate():
        try:
            model.generation_config = GenerationConfig.from_pretrained(folder, local_files_only=local_files_only)
        except OSError:  # none in the folder: transformers keeps the one made from the config, as here
            pass
    return model.eval()
