"""The compiled step's artifacts kept between starts: what ``torch.compiler.save_cache_artifacts``
returns after the step's graphs were built (inductor's compiled graphs, AOTAutograd's entries, and on
CUDA the Triton kernels and their autotuning), in one file per machine kind and model, loaded with
``torch.compiler.load_cache_artifacts`` before the next start builds its first graph. Inductor's own
on-disk caches (``kernels.compile_cache``) already serve a second start on the same machine; this file
also carries them to a fresh machine with the project's cache folder, and says which graphs it holds.

A file is named by the hash of its key: torch's version, CUDA's, the device (the GPU's name and compute
capability, or the CPU's name and flags), the model's identity (name, config hash, parameter count) and the
compute dtype. It starts with one JSON line: that key, the graphs it holds ((width, keys, hidden layers)
each) and the SHA-256 of the payload after it. A file whose line does not parse, whose key is another's
or whose payload does not hash to its line is not loaded (and is replaced by the next save), nor is one
torch could not load (``load_cache_artifacts`` logs its own failure and answers None). The payload is
unpickled, so a file is read only where this user owns it and its folder and no one else can write
either (nor is a link followed): anything else is skipped, with its reason. Saves write a private
temporary file and rename it into place (two processes saving at once each leave a whole file); a
failed save removes its temporary file.
"""
import hashlib
import json
import os
import platform
import stat
import tempfile
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

import torch
from torch.nn import Module

Graph = Tuple[int, int, Tuple[int, ...]]  # (width, keys attended, hidden layers)


def artifact_key(model: Module, dtype: torch.dtype, device: torch.device) -> dict:
    """What a file's artifacts depend on beyond the graphs themselves (inductor keys those within the payload)."""
    if device.type == "cuda":
        where = {"gpu": torch.cuda.get_device_name(device), "capability": list(torch.cuda.get_device_capability(device))}
    else:
        from utils.load import cpu_flags

        where = {"cpu": platform.processor() or platform.machine(), "flags": hashlib.sha256(cpu_flags().encode()).hexdigest()[:16]}
    config = model.config
    text = config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else repr(config)
    identity = {"name": Path(str(getattr(config, "_name_or_path", "") or type(model).__name__)).name,
                "config": hashlib.sha256(text.encode()).hexdigest()[:16], "parameters": sum(p.numel() for p in model.parameters())}
    return {"torch": torch.__version__, "cuda": torch.version.cuda, **where, "model": identity, "dtype": str(dtype)}


def artifacts_dir() -> Path:
    from utils.models import cache_dir

    return cache_dir() / "step-artifacts"


def artifact_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return artifacts_dir() / f"step-{digest}.bin"


def _untrusted(info: os.stat_result, what: str) -> str:
    """Why a file or folder with this ``stat`` could hold another user's bytes; "" when it cannot."""
    if not hasattr(os, "getuid"):  # no POSIX owners: nothing to check against
        return ""
    if info.st_uid != os.getuid():
        return f"{what} belongs to another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} is writable by other users"
    return ""


def _read_trusted(path: Path) -> Tuple[bytes, str]:
    """``(bytes, "")`` of ``path`` where this user alone could have written it and its folder; else
    ``(b"", why not)``. The file is opened without following a link and checked on the open descriptor,
    so what is checked is what is read."""
    problem = _untrusted(os.stat(path.parent), "its folder")
    if problem:
        return b"", problem
    try:
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as error:
        if path.is_symlink():  # O_NOFOLLOW's ELOOP: a link put in the file's place
            return b"", "the file is a link"
        raise
    with os.fdopen(handle, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            return b"", "the file is not a regular file"
        problem = _untrusted(info, "the file")
        return (b"", problem) if problem else (file.read(), "")


def read_artifact(key: dict) -> Tuple[Optional[bytes], List[Graph], str]:
    """``(payload, graphs, problem)``: the payload and graphs of ``key``'s file where it is whole and
    its own; else None, [] and why not ("" when there is no file)."""
    path = artifact_path(key)
    try:
        data, problem = _read_trusted(path)
    except FileNotFoundError:
        return None, [], ""
    except OSError as error:
        return None, [], f"unreadable: {error.strerror}"
    if problem:
        return None, [], f"skipped: {problem} (its payload is unpickled)"
    head, _, payload = data.partition(b"\n")
    try:
        line = json.loads(head)
        graphs = [(int(w), int(k), tuple(int(x) for x in layers)) for w, k, layers in line["graphs"]]
        stored_key, digest = line["key"], line["sha256"]
    except (ValueError, KeyError, TypeError):
        return None, [], "not a step artifact"
    if stored_key != json.loads(json.dumps(key)):
        return None, [], "made for another torch, device, model or dtype"
    if hashlib.sha256(payload).hexdigest() != digest:
        return None, [], "corrupt (its payload does not match its checksum)"
    return payload, graphs, ""


def load_artifacts(key: dict) -> Tuple[List[Graph], str]:
    """Load ``key``'s artifacts into torch's caches: ``(graphs, problem)``; nothing is loaded on a problem."""
    payload, graphs, problem = read_artifact(key)
    if payload is None:
        return [], problem
    try:
        info = torch.compiler.load_cache_artifacts(payload)
    except Exception as error:  # a payload torch cannot read: rebuilt, never half-loaded on purpose
        return [], f"not loadable: {type(error).__name__}"
    if info is None:  # torch swallowed its own failure (logged) and loaded nothing
        return [], "not loadable: torch could not read its payload"
    return graphs, ""


def save_artifacts(key: dict, graphs: Iterable[Graph]) -> Optional[Path]:
    """Write every artifact this process compiled (``torch.compiler.save_cache_artifacts``) under ``key``,
    atomically; None when torch has nothing to save or the folder cannot be written."""
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return None
    payload = bytes(saved[0])
    line = json.dumps({"key": key, "graphs": sorted(set(graphs)), "sha256": hashlib.sha256(payload).hexdigest()})
    path = artifact_path(key)
    temporary = None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # private: a load trusts no one else's folder
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")  # mode 0o600
        with os.fdopen(handle, "wb") as out:
            out.write(line.encode() + b"\n" + payload)
        os.replace(temporary, path)
        temporary = None
    except OSError:
        return None
    finally:  # any failure, an interrupt too: no half-written file is left beside the artifacts
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
    return path
