"""Inductor's probes of this CPU's vector instructions, kept between test runs (``tests/conftest.py``).

Before its first graph, each cache folder gets six small C++ programs built by inductor
(``torch._inductor.cpu_vec_isa``: does the compiler build AVX2, AVX-512, VNNI, AMX... code here?),
~10 s of compiler that a run's fresh folder paid in its first compiling test. They are no graph and
no measurement (inductor's hit counters skip them), and their answer depends only on torch, the C++
compiler and the CPU's flags: a run seeds its folder with the probes kept by the last run, under a
name that hashes torch's version and the compiler's, and keeps its own at its end. The probe still
loads each library (``_probe_load``) and reads /proc/cpuinfo at every start; only the builds are kept.
"""
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Set


def _sources() -> Set[str]:
    """The probes' C++ sources: inductor's ``*_code`` strings of its ISA classes."""
    from torch._inductor import cpu_vec_isa

    return {value for cls in vars(cpu_vec_isa).values() if isinstance(cls, type)
            for name, value in vars(cls).items() if name.endswith("_code") and isinstance(value, str)}


def kept_folder(users_cache: Path) -> Path:
    """``users_cache/inductor-probes-<hash>``: the hash of torch's version and the first line of the C++
    compiler's ``--version`` (another compiler or torch: other probes)."""
    import torch

    from utils.toolchain import cxx_compiler

    compiler = cxx_compiler() or ""
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout.split("\n")[0]
    except (OSError, subprocess.SubprocessError):
        version = ""
    key = hashlib.sha256("\n".join((torch.__version__, compiler, version)).encode()).hexdigest()[:16]
    return users_cache / f"inductor-probes-{key}"


def seed(kept: Path, inductor: Path) -> int:
    """Copy the kept probes (``<xx>/<key>.cpp`` and ``.so``, inductor's own layout) into ``inductor``;
    returns how many libraries were copied."""
    copied = 0
    for library in kept.glob("*/*.so") if kept.is_dir() else ():
        source = library.with_suffix(".cpp")
        if source.is_file():
            target = inductor / library.parent.name
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target / source.name)
            shutil.copyfile(library, target / library.name)
            copied += 1
    return copied


def keep(inductor: Path, kept: Path) -> None:
    """Copy this run's probes from ``inductor`` into ``kept`` (each file written aside and renamed into
    place: a run reading it at the same time sees whole files)."""
    sources = _sources()
    for source in inductor.glob("*/*.cpp"):
        library = source.with_suffix(".so")
        if not library.is_file() or source.stat().st_size > 16384 or source.read_text(errors="replace") not in sources:
            continue
        target = kept / source.parent.name
        target.mkdir(parents=True, exist_ok=True)
        for file in (source, library):
            aside = target / f"{file.name}.{os.getpid()}.tmp"
            shutil.copyfile(file, aside)
            os.replace(aside, target / file.name)
