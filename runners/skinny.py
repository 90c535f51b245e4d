"""The skinny kernel: a float32 CPU linear layer over a few positions that reads its weight once on
every core (``skinny_gemm.c``), built at first use with the machine's C compiler for its own CPU.

``skinny_linear(x, weight, bias)`` is ``F.linear`` for float32 CPU tensors, computed by that kernel;
``available()`` says whether it could be built here (a C compiler with OpenMP), and why not. The
library is kept in the cache folder under a name that hashes the source, the compiler and the CPU's
flags, built into a temporary file and renamed into place under a lock, so two processes building
at once both load a whole library. Whether it pays is measured per pass width at start-up
(``measure.measure_kernels``), like the prepacked layers.
"""
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional, Tuple

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("skinny_gemm.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _compiler() -> Optional[str]:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _build(compiler: str, folder: Path) -> Path:
    """The library for this source, compiler and CPU: built once, atomically, under a lock."""
    from utils.models import exclusive

    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[:1]
    digest = hashlib.sha256("\n".join([SOURCE.read_text(), *version, " ".join(FLAGS), _cpu_flags()]).encode()).hexdigest()[:16]
    library = folder / f"skinny-{digest}.so"
    if library.is_file():
        return library
    folder.mkdir(parents=True, exist_ok=True)
    with exclusive(folder / f"skinny-{digest}.lock"):
        if not library.is_file():
            temporary = folder / f"skinny-{digest}.{os.getpid()}.tmp.so"
            done = subprocess.run([compiler, *FLAGS, "-o", str(temporary), str(SOURCE)], capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                temporary.unlink(missing_ok=True)
                raise RuntimeError(f"{compiler} failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
            os.replace(temporary, library)
    return library


@functools.lru_cache(maxsize=1)
def _library() -> Tuple[Optional[ctypes.CDLL], str]:
    """(the loaded library, its file name) or (None, why not)."""
    from utils.models import cache_dir

    compiler = _compiler()
    if compiler is None:
        return None, "no C compiler (cc, gcc or $CC)"
    torch.get_num_threads()  # torch's OpenMP runtime is loaded first, so the library shares it (one thread pool)
    try:
        library = ctypes.CDLL(str(_build(compiler, cache_dir() / "kernels")))
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        return None, f"the skinny kernel did not build: {error}"
    library.skinny_linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
    library.skinny_linear.restype = None
    return library, Path(library._name).name


def available() -> Tuple[bool, str]:
    """Whether the kernel is built and loaded here; else False and the reason, in a few words."""
    library, why = _library()
    return library is not None, "" if library is not None else why


def identity() -> str:
    """What a measurement of the kernel depends on: its library's name (source, compiler and CPU
    hashed in it), or "none"."""
    library, name = _library()
    return name if library is not None else "none"


def skinny_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``F.linear(x, weight, bias)`` for float32 CPU tensors by the skinny kernel: ``x`` ``[..., K]``,
    ``weight`` ``[N, K]`` (contiguous), ``bias`` ``[N]`` or None -> ``[..., N]``. Each row of the result
    is computed alone, in a fixed order: it does not depend on how many rows ``x`` has."""
    library, why = _library()
    if library is None:
        raise RuntimeError(why)
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu":
        return torch.nn.functional.linear(x, weight, bias)  # the kernel is float32 CPU only (autocast, a moved model)
    weight, bias = weight.contiguous(), None if bias is None else bias.contiguous()
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty((rows.shape[0], weight.shape[0]), dtype=torch.float32)
    library.skinny_linear(rows.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
                          rows.shape[0], weight.shape[0], rows.shape[1])
    return out.reshape(*x.shape[:-1], weight.shape[0])
