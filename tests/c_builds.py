"""The kernels' libraries built for another ``-march`` than this CPU's, for the tests that compare builds
(``test_c_step``, ``test_c_step_bf16``, ``test_prompt_gemm``, ``test_attention_kernel``, ``test_amx``): each
(arch, sources) pair is compiled once per test run, whichever process asks first, in the run's cache folder
(``conftest.MEASUREMENTS_ENV``), and every test loads it; each source file is compiled once per run too (an
object keyed by its preprocessed text), so a variant (``FEW_ROWS=0``) recompiles only the files its define changes. The libraries keep no state a test changes (C's
only mutable globals, ``c_step_group`` and ``c_step_positions``, are never set by a test; ``amx_state``
answers the same every time), so a shared build gives each test what its own did. A test gets a fresh
``ctypes.CDLL``: the argument types one test sets on its functions are not another's."""
import ctypes
import hashlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Dict, Sequence, Tuple

import pytest

from conftest import MEASUREMENTS_ENV
from kernels import skinny

_BUILT: Dict[Tuple[str, Tuple[str, ...], Tuple[str, ...]], Path] = {}  # this process's: (arch, sources, defines) -> library


def _key(compiler: str, flags: Sequence[str], sources: Sequence[Path]) -> str:
    """A hash of what the library is built from: the sources and the headers they include, the compiler
    (path and version) and the flags (``-march`` with them)."""
    parts = [*(source.read_text() for source in (*sources, *skinny.HEADERS)), compiler, skinny.compiler_version(compiler), *flags]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def build_for(arch: str, sources: Sequence[Path] = skinny.SOURCES, defines: Sequence[str] = ()) -> Path:
    """The library of ``sources`` compiled for ``-march=arch`` with the kernels' other flags (and ``-D`` each of
    ``defines``: a variant of the same bits): built once per run (atomically, under a lock: two workers never
    build it twice), its path. Skips the test off an x86-64 CPU with AVX2 (the builds compared need one)."""
    from utils.models import exclusive
    from utils.toolchain import c_compiler

    if platform.machine() != "x86_64" or "avx2" not in open("/proc/cpuinfo").read():
        pytest.skip("an x86-64 CPU with AVX2 builds and runs the builds compared")
    memo = (arch, tuple(str(s) for s in sources), tuple(defines))
    if memo in _BUILT:
        return _BUILT[memo]
    if arch == "native" and not defines and memo[1] == tuple(map(str, skinny.SOURCES)) and skinny.available()[0]:
        # the app's own library is this very build (the same compiler, flags and sources, -march=native
        # among them), already built in the run's cache folder: loading it spares a third -O3 build
        _BUILT[memo] = Path(skinny.library()._name)
        return _BUILT[memo]
    compiler = c_compiler()
    flags = [f"-march={arch}", *(f for f in skinny.FLAGS if f != "-march=native"), *(f"-D{d}" for d in defines)]
    folder = Path(MEASUREMENTS_ENV["SPECDEC_CACHE"]) / "test-builds"
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / f"{arch}-{_key(compiler, flags, sources)}.so"
    with exclusive(folder / f"{library.stem}.lock"):
        if not library.is_file():
            objects = [_object(compiler, flags, source, folder) for source in sources]
            temporary = folder / f"{library.stem}.{os.getpid()}.tmp.so"
            subprocess.run([compiler, *flags, "-o", str(temporary), *map(str, objects)], check=True, timeout=120)  # the link
            os.replace(temporary, library)
    _BUILT[memo] = library
    return library


def _object(compiler: str, flags: Sequence[str], source: Path, folder: Path) -> Path:
    """``source`` compiled with ``flags`` (``-c``, not ``-shared``) into an object kept in ``folder``, keyed by its
    preprocessed text (the ``-D`` defines and ``-march`` macros applied, its headers in it), the compiler and the
    flags: a variant's define that leaves a file's text as it was (``FEW_ROWS`` outside ``c_step.c``) reuses that
    file's object, so a variant build recompiles only the files it changes (an -O3 ``c_step.c``, ~3 s, not all
    eleven, ~8 s). Linking those objects is what one ``compiler ... -shared sources`` does: each file is compiled
    alone there too (no link-time optimisation), so the library is the same."""
    compile_flags = [f for f in flags if f != "-shared"]
    text = subprocess.run([compiler, *compile_flags, "-E", str(source)], check=True, capture_output=True, timeout=60).stdout
    codegen = [f.encode() for f in compile_flags if not f.startswith("-D")]  # a define is in the text, or changes nothing
    key = hashlib.sha256(b"\n".join([text, compiler.encode(), skinny.compiler_version(compiler).encode(), *codegen])).hexdigest()[:16]
    target = folder / "objects" / f"{source.stem}-{key}.o"
    target.parent.mkdir(exist_ok=True)
    from utils.models import exclusive

    with exclusive(target.with_suffix(".lock")):
        if not target.is_file():
            temporary = target.with_name(f"{target.stem}.{os.getpid()}.tmp.o")
            subprocess.run([compiler, *compile_flags, "-c", "-o", str(temporary), str(source)], check=True, timeout=120)
            os.replace(temporary, target)
    return target


def load_for(arch: str, sources: Sequence[Path] = skinny.SOURCES, defines: Sequence[str] = ()) -> ctypes.CDLL:
    """``build_for``'s library, loaded: a ``ctypes.CDLL`` of its own for each call."""
    return ctypes.CDLL(str(build_for(arch, sources, defines)))
