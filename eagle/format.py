"""The EAGLE-3 head on disk.

``save_head`` writes the speculators format (vllm-project/speculators, what vLLM serves): a folder with
``config.json`` in ``Eagle3SpeculatorConfig``'s layout and ``model.safetensors`` holding
``Eagle3Head.state_dict()``. ``load_head`` reads that format and the original EAGLE-3 / SpecForge one
(a llama-like ``config.json``, the decoder layer under ``midlayer.``, ``model.safetensors`` or
``pytorch_model.bin``), and refuses with one line a head that does not fit its target.

Aux layers are transformers' ``hidden_states`` indices (the residual stream entering that layer), as in
the speculators format and vLLM; SpecForge's ids name the layer whose output is read, one less.
"""
import ctypes
import errno
import hashlib
import io
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
from safetensors.torch import load as safetensors_load, save as safetensors_save
from torch import Tensor, nn

from eagle.head import Eagle3Head, HeadConfig

CONFIG, WEIGHTS, BIN = "config.json", "model.safetensors", "pytorch_model.bin"
SPECULATORS_VERSION = "0.9.0"  # the speculators release whose Eagle3SpeculatorConfig this layout follows
# speculators options this head does not implement: a head using one is refused, not run wrongly
UNSUPPORTED = ("norm_before_fc", "fc_norm", "norm_output")
REQUIRED = ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
PathLike = Union[str, os.PathLike]


def save_head(head: Eagle3Head, path: PathLike, *, target_name: str = "", dtype: torch.dtype = torch.bfloat16,
              extra: Optional[dict] = None, verifier_architectures: Sequence[str] = ()) -> str:
    """Write the folder ``path`` (``config.json``, ``model.safetensors``) in the speculators EAGLE-3
    format; returns the sha256 hex of ``model.safetensors``, which ``config.json`` also records
    (``specdec.sha256``; ``load_head`` checks it). Floating tensors are cast to ``dtype``, ``d2t`` is
    int64, ``t2d`` bool. ``extra`` (JSON data: training command, data...) is kept under ``specdec``.
    ``target_name`` and ``verifier_architectures`` describe the verifier. Atomic: the folder is written
    beside ``path``, synced, and swapped in whole, so a reader finds the old folder or the new one, and
    of concurrent saves the last to finish wins. Nothing is written when ``extra`` is not JSON."""
    weights = safetensors_save(_tensors(head, dtype), metadata={"format": "pt"})
    sha = hashlib.sha256(weights).hexdigest()
    config = _speculators_config(head.config, target_name, dtype, verifier_architectures)
    config["specdec"] = {**(extra or {}), "sha256": sha}
    try:
        text = json.dumps(config, indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError) as error:
        raise _refusal(f"cannot save the head to {path}: extra is not JSON data ({error})") from None
    _write_folder(Path(path), {CONFIG: text.encode(), WEIGHTS: weights})
    return sha


def load_head(path: PathLike, target: nn.Module) -> Eagle3Head:
    """The head saved at ``path`` (its folder, or a file in it) in either format, in the dtype and on the
    device of ``target``'s embedding, which it borrows unless the file ships ``embed_tokens.weight``.
    A head that does not fit ``target``, or a folder that is not a whole head, raises ValueError with
    one line; nothing is changed then."""
    where, config, tensors = _read(Path(path))
    head_config, tensors = _parse(where, config, tensors, target)
    own = "embed_tokens.weight" in tensors
    _check_fit(where, head_config, target, own)
    _check_tensors(where, head_config, tensors, own)
    embedding = target.get_input_embeddings()
    with torch.device(embedding.weight.device):
        head = Eagle3Head(head_config, embed_tokens=None if own else embedding, own_embedding=own)
    head.to(embedding.weight.dtype)  # before loading: each tensor is rounded once, file -> target dtype
    head.load_state_dict(tensors)
    return head


# ---- saving -------------------------------------------------------------------------------------
def _tensors(head: Eagle3Head, dtype: torch.dtype) -> Dict[str, Tensor]:
    out = {}
    for name, tensor in head.state_dict().items():
        if name in ("d2t", "t2d"):
            kind = torch.int64 if name == "d2t" else torch.bool
        else:
            kind = dtype if tensor.is_floating_point() else tensor.dtype
        out[name] = tensor.detach().to("cpu", kind).contiguous()
    return out


def _speculators_config(c: HeadConfig, target_name: str, dtype: torch.dtype, architectures: Sequence[str]) -> dict:
    layer = dict(
        model_type="llama", hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, intermediate_size=c.intermediate_size,
        rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, max_position_embeddings=c.max_position_embeddings,
        vocab_size=c.target_vocab_size, num_hidden_layers=1, hidden_act="silu",
    )
    if c.rope_scaling:
        layer["rope_scaling"] = dict(c.rope_scaling)
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": c.draft_vocab_size,
        "norm_before_residual": c.norm_before_residual,
        "target_hidden_size": c.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(c.aux_layers),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": target_name, "architectures": list(architectures)},
        },
        "speculators_version": SPECULATORS_VERSION,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def _write_folder(path: Path, files: Dict[str, bytes]) -> None:
    """``path`` becomes a folder holding ``files``, all at once (see ``save_head``)."""
    path = Path(os.path.realpath(path))  # a link to a folder: the folder is replaced, the link stays
    try:  # one stat: a concurrent save may move the folder away between two (exists, then is_dir)
        kind = os.stat(path).st_mode
    except FileNotFoundError:
        kind = None
    if kind is not None and not stat.S_ISDIR(kind):
        raise _refusal(f"cannot save a head to {path}: it is a file, not a folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
    try:
        for name, data in files.items():
            with open(tmp / name, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the published folder from other users
        _fsync_folder(tmp)
        _publish(tmp, path)
        _fsync_folder(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the unpublished folder, or the replaced one


def _publish(tmp: Path, path: Path) -> None:
    """Put the folder ``tmp`` at ``path`` in one step; what was at ``path`` ends under ``tmp``'s name."""
    aside = tmp.with_name(tmp.name + ".old")
    try:
        for _ in range(1000):
            try:
                os.rename(tmp, path)  # atomic where nothing (or an empty folder) is at path
                return
            except OSError as error:
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
            try:
                if _exchange(tmp, path):
                    return
                # no atomic exchange on this system: the old folder moves aside, a reader may find none a moment
                os.rename(path, aside)
                shutil.rmtree(aside)
            except FileNotFoundError:  # a concurrent save moved it first: try again
                continue
        raise OSError(errno.EBUSY, f"could not replace {path}: other saves kept replacing it")
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # this kernel or filesystem lacks it
        return False
    raise OSError(code, os.strerror(code), str(b))


def _renameat2():
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return function


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- loading ------------------------------------------------------------------------------------
def _read(path: Path) -> Tuple[str, dict, Dict[str, Tensor]]:
    """(the folder's name for messages, its config, its tensors), read from one version of the folder."""
    folder = path.parent if path.is_file() else path
    where = str(folder)
    if not folder.is_dir():
        raise _refusal(f"no EAGLE-3 head at {path}: no such folder")
    for _ in range(10):
        pinned = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)  # config and weights come from this folder
        try:
            config_bytes = _read_in(pinned, CONFIG)
            name, weights = WEIGHTS, _read_in(pinned, WEIGHTS)
            if weights is None:
                name, weights = BIN, _read_in(pinned, BIN)
            if (config_bytes is None or weights is None) and _replaced(folder, pinned):
                continue  # a save swapped the folder while it was read: read the new one
        finally:
            os.close(pinned)
        break
    if config_bytes is None:
        raise _refusal(f"{where}: no {CONFIG}")
    if weights is None:
        raise _refusal(f"{where}: no {WEIGHTS} or {BIN}")
    try:
        config = json.loads(config_bytes)
    except ValueError as error:
        raise _refusal(f"{where}: {CONFIG} is not readable JSON ({error})") from None
    if not isinstance(config, dict):
        raise _refusal(f"{where}: {CONFIG} is not a JSON object")
    record = config.get("specdec")
    recorded = record.get("sha256") if isinstance(record, dict) else None
    if name == WEIGHTS and recorded and hashlib.sha256(weights).hexdigest() != recorded:
        raise _refusal(f"{where}: {WEIGHTS} does not match the sha256 {CONFIG} records ({recorded})")
    return where, config, _decode(where, name, weights)


def _read_in(folder_fd: int, name: str) -> Optional[bytes]:
    try:
        fd = os.open(name, os.O_RDONLY, dir_fd=folder_fd)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as file:
        return file.read()


def _replaced(folder: Path, pinned: int) -> bool:
    try:
        return os.stat(folder).st_ino != os.fstat(pinned).st_ino
    except FileNotFoundError:
        return True


def _decode(where: str, name: str, data: bytes) -> Dict[str, Tensor]:
    try:
        if name == WEIGHTS:
            tensors = safetensors_load(data)
        else:
            tensors = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as error:  # any decoding failure of the file's bytes is the same refusal
        raise _refusal(f"{where}: {name} is not readable ({type(error).__name__}: {error})") from None
    if not isinstance(tensors, dict) or not all(isinstance(t, Tensor) for t in tensors.values()):
        raise _refusal(f"{where}: {name} does not hold a dict of tensors")
    return tensors


def _parse(where: str, config: dict, tensors: Dict[str, Tensor],
           target: nn.Module) -> Tuple[HeadConfig, Dict[str, Tensor]]:
    """The head's config (from either format) and its tensors under this module's names."""
    kind = config.get("speculators_model_type")
    if kind == "eagle3":
        layer = config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise _refusal(f"{where}: {CONFIG} lacks transformer_layer_config")
        if "draft_vocab_size" not in config:
            raise _refusal(f"{where}: {CONFIG} lacks draft_vocab_size")
        ids, offset = config.get("eagle_aux_hidden_state_layer_ids"), 0
    elif kind is None and _is_original(config):
        layer, eagle = config, config.get("eagle_config")
        ids = config.get("eagle_aux_hidden_state_layer_ids") or (eagle.get(
            "eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None)
        offset = 1  # SpecForge's id k reads the output of layer k: hidden_states[k + 1]
    else:
        raise _refusal(f"{where}: {CONFIG} is neither the speculators EAGLE-3 format (speculators_model_type "
                       f"{kind!r}) nor the EAGLE-3 / SpecForge one")
    for option in UNSUPPORTED:
        if config.get(option):
            raise _refusal(f"{where}: the head uses {option}, which this project's head does not implement")
    if layer.get("hidden_act", "silu") != "silu":
        raise _refusal(f"{where}: the head's hidden_act is {layer['hidden_act']!r}, this project's head's 'silu'")
    tensors = _renamed(tensors)
    layers = target.config.get_text_config(decoder=True).num_hidden_layers
    fields = _layer_fields(where, layer)
    try:
        head_config = HeadConfig(
            **fields, target_hidden_size=int(config.get("target_hidden_size") or fields["hidden_size"]),
            draft_vocab_size=int(config.get("draft_vocab_size") or fields["target_vocab_size"]),
            aux_layers=[int(k) + offset for k in ids] if ids else HeadConfig.default_layers(layers),
            norm_before_residual=bool(config.get("norm_before_residual", False)), fc_bias="fc.bias" in tensors,
        )
    except (TypeError, ValueError) as error:
        raise _refusal(f"{where}: {CONFIG} holds a value of the wrong type ({error})") from None
    size = head_config.target_vocab_size
    if "d2t" not in tensors and "t2d" not in tensors and head_config.draft_vocab_size == size:
        tensors["d2t"] = torch.zeros(size, dtype=torch.long)  # no reduced vocabulary: draft id = target id
        tensors["t2d"] = torch.ones(size, dtype=torch.bool)
    return head_config, tensors


def _is_original(config: dict) -> bool:
    architectures = config.get("architectures") or []
    named = isinstance(architectures, list) and any("eagle3" in str(a).lower() for a in architectures)
    return "hidden_size" in config and ("draft_vocab_size" in config or named)


def _layer_fields(where: str, layer: dict) -> dict:
    """HeadConfig's fields from a llama config dict; absent values take LlamaConfig's defaults (a
    config saved by transformers' ``to_diff_dict`` leaves them out)."""
    missing = [key for key in REQUIRED if key not in layer]
    if missing:
        raise _refusal(f"{where}: {CONFIG} lacks {missing[0]}")
    rope = layer.get("rope_scaling") or layer.get("rope_parameters") or {}
    theta = layer.get("rope_theta") or rope.get("rope_theta") or 10000.0
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    if scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    try:
        hidden, heads = int(layer["hidden_size"]), int(layer["num_attention_heads"])
        return dict(
            hidden_size=hidden, num_attention_heads=heads,
            num_key_value_heads=int(layer.get("num_key_value_heads") or heads),
            intermediate_size=int(layer["intermediate_size"]), target_vocab_size=int(layer["vocab_size"]),
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
            head_dim=int(layer.get("head_dim") or hidden // heads),
            max_position_embeddings=int(layer.get("max_position_embeddings", 2048)), rope_scaling=scaling,
        )
    except (TypeError, ValueError, ZeroDivisionError) as error:
        raise _refusal(f"{where}: {CONFIG} holds a value of the wrong type ({error})") from None


def _renamed(tensors: Dict[str, Tensor]) -> Dict[str, Tensor]:
    out = {}
    for name, tensor in tensors.items():
        if name.startswith("verifier_"):  # speculators' training-time copies of the target's norm and lm_head
            continue
        if name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer."):]
        out[name] = tensor
    return out


def _check_fit(where: str, c: HeadConfig, target: nn.Module, own: bool) -> None:
    text = target.config.get_text_config(decoder=True)
    hidden, layers = text.hidden_size, text.num_hidden_layers
    rows = target.get_output_embeddings().weight.shape[0]
    n = len(c.aux_layers)
    if c.target_hidden_size != hidden:
        raise _refusal(f"{where} does not fit the target: target hidden size {c.target_hidden_size} in the head "
                       f"(fc reads {n} x {c.target_hidden_size}), {hidden} in the target ({n} x {hidden})")
    if c.target_vocab_size != rows:
        raise _refusal(f"{where} does not fit the target: vocabulary of {c.target_vocab_size} tokens in the head, "
                       f"{rows} output rows in the target")
    for k in c.aux_layers:
        if not 0 <= k < layers:
            raise _refusal(f"{where} does not fit the target: aux layer {k} (a hidden_states index) is not "
                           f"below the target's {layers} layers")
    width = target.get_input_embeddings().weight.shape[1]
    if not own and width != c.hidden_size:
        raise _refusal(f"{where} does not fit the target: hidden size {c.hidden_size} in the head, the target "
                       f"embedding it borrows is {width} wide")


def _check_tensors(where: str, c: HeadConfig, tensors: Dict[str, Tensor], own: bool) -> None:
    with torch.device("meta"):  # the expected names and shapes, nothing allocated
        expected = {k: tuple(v.shape) for k, v in Eagle3Head(c, own_embedding=own).state_dict().items()}
    missing = [k for k in expected if k not in tensors]
    if missing:
        more = f" ({len(missing)} missing)" if len(missing) > 1 else ""
        raise _refusal(f"{where}: the tensor {missing[0]} is missing{more}")
    unknown = sorted(set(tensors) - set(expected))
    if unknown:
        raise _refusal(f"{where}: tensors this head does not have: {', '.join(unknown[:4])}"
                       + (f" ({len(unknown)} in all)" if len(unknown) > 4 else ""))
    for name, shape in expected.items():
        got = tuple(tensors[name].shape)
        if name == "t2d" and got != shape:
            raise _refusal(f"{where} does not fit the target: vocabulary of {got[0] if got else 0} tokens in the "
                           f"head's t2d, {shape[0]} output rows in the target")
        if got != shape:
            raise _refusal(f"{where}: the tensor {name} has shape {list(got)}, expected {list(shape)}")
    ids = tensors["d2t"].long() + torch.arange(c.draft_vocab_size)
    outside = ids[(ids < 0) | (ids >= c.target_vocab_size)]
    if len(outside):
        raise _refusal(f"{where}: d2t maps a draft token to target id {int(outside[0])}, outside the target's "
                       f"{c.target_vocab_size} tokens")


def _refusal(message: str) -> ValueError:
    return ValueError(message.replace("\r", " ").replace("\n", " "))
