"""The skinny kernel: a float32 CPU linear layer over a few positions that streams its weight once,
blocked for it (``skinny_gemm.c``, ``kernels.blocked``), and the C step that runs a whole pass of a
Llama-family model on it (``c_step.c``, ``kernels.c_step``) and an EAGLE-3 head's draft step
(``head_step.c``, ``kernels.head_step``): one library, built at first use with the machine's C
compiler for its own CPU.

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
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import Tensor

SOURCES = tuple(Path(__file__).with_name(name) for name in ("skinny_gemm.c", "skinny_tiles.c", "skinny_bf16.c", "skinny_bf16_rows.c", "skinny_bf16_dot.c", "skinny_amx.c", "c_step.c", "attention_entry.c", "head_step.c", "blocked_check.c", "step_embed.c"))
HEADERS = tuple(Path(__file__).with_name(name) for name in ("step_rows.h", "attention.h", "attention_vec.h", "attention_tiles.h", "attention_split.h", "linears.h", "bf16_tiles.h", "bf16_dot.h", "bf16_few.h", "f32_few.h", "step_profile.h", "step_layer.h", "step_bridge.h", "logits_top.h", "deal.h"))  # included by the sources: hashed with them, never compiled alone
SOURCE = SOURCES[0]
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")  # no fused a*b+c unless written: one rounding on every CPU
BUILD_TIMEOUT = 120.0  # seconds a compile may take before it counts as failed
RETRY_AFTER = 86400.0  # seconds a failed build is remembered (a full disk, a killed compiler pass)


def _cpu_line() -> str:
    """The CPU's feature line where the kernel says it (x86 ``flags``, aarch64 ``Features``), else ""."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def compiler_target(compiler: str) -> str:
    """What ``compiler -march=native`` builds for here: its predefined macros (``__AVX512F__``,
    ``__ARM_FEATURE_SVE``...: every instruction set the library may use), one per line; "" where the
    compiler will not say. This, not a /proc line, is what a library built here needs of a CPU."""
    try:
        done = subprocess.run([compiler, "-march=native", "-dM", "-E", "-x", "c", os.devnull],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return "\n".join(sorted(line for line in done.stdout.splitlines() if line.startswith("#define"))) if done.returncode == 0 else ""


def compiler_version(compiler: str) -> str:
    """The first line of ``compiler --version`` ("" where it says nothing)."""
    lines = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    return lines[0].strip() if lines else ""


def library_name(compiler: str, sources: Sequence[Path] = SOURCES, stem: str = "skinny") -> str:
    """The library's file stem: ``stem``, the machine, and a hash of the sources, the compiler's version
    and flags, its real target (``compiler_target``), the OS and the CPU's feature line, so that a cache
    folder shared by several machines never hands one a library built for another."""
    parts = [*(source.read_text() for source in (*sources, *HEADERS)), compiler_version(compiler), " ".join(FLAGS), compiler_target(compiler),
             platform.system(), platform.machine(), _cpu_line()]
    return f"{stem}-{platform.machine() or 'unknown'}-{hashlib.sha256(chr(10).join(parts).encode()).hexdigest()[:16]}"


def _earlier_failure(failed: Path, compiler: str, now: Callable[[], float]) -> Optional[str]:
    """The reason ``failed`` records, while it holds: the same compiler (path and version) failed less
    than ``RETRY_AFTER`` ago. None (try again) for another compiler, an older or unreadable marker."""
    try:
        recorded = json.loads(failed.read_text())
        age = now() - failed.stat().st_mtime
    except (OSError, ValueError):
        return None
    same = recorded.get("compiler") == compiler and recorded.get("version") == compiler_version(compiler)
    return recorded.get("reason") if same and 0 <= age < RETRY_AFTER else None


def _compile(compiler: str, sources: Sequence[Path], output: Path) -> Optional[str]:
    """Compile ``sources`` into one library ``output``: None, or why it failed (a timeout too)."""
    try:
        done = subprocess.run([compiler, *FLAGS, "-o", str(output), *map(str, sources)], capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"{compiler} timed out after {BUILD_TIMEOUT:g} s"
    if done.returncode == 0:
        return None
    return f"{compiler} failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"


def _build(compiler: str, folder: Path, sources: Sequence[Path] = SOURCES, stem: str = "skinny",
           now: Callable[[], float] = time.time) -> Path:
    """The library of ``sources`` for this compiler and CPU: built once, atomically, under a lock. A
    build that failed or timed out leaves ``<name>.failed`` (its reason, the compiler's path and
    version), so later starts do not pay for it again until the compiler changes or a day has passed."""
    from utils.files import write_atomically
    from utils.models import exclusive

    name = library_name(compiler, sources, stem)
    library, failed = folder / f"{name}.so", folder / f"{name}.failed"
    if library.is_file():
        return library
    reason = _earlier_failure(failed, compiler, now)
    if reason is not None:
        raise RuntimeError(f"{reason} (an earlier start; remove {failed} to try again, or wait a day, or change compilers)")
    folder.mkdir(parents=True, exist_ok=True)
    with exclusive(folder / f"{name}.lock"):
        if not library.is_file():
            temporary = folder / f"{name}.{os.getpid()}.tmp.so"
            reason = _compile(compiler, sources, temporary)
            if reason is not None:
                temporary.unlink(missing_ok=True)
                record = {"reason": reason, "compiler": compiler, "version": compiler_version(compiler)}
                write_atomically(failed, (json.dumps(record) + "\n").encode())
                raise RuntimeError(reason)
            os.replace(temporary, library)
            failed.unlink(missing_ok=True)
    return library


SYMBOLS = ("skinny_linear", "skinny_simd", "skinny_tiles", "skinny_tile_shape", "skinny_linear_tile", "skinny_bf16_paths",
           "skinny_linear_bf16", "skinny_bf16_tiles", "skinny_bf16_tile_shape", "amx_state", "c_step", "c_step_scratch", "logits_top", "head_step", "head_step_scratch", "blocked_holds", "skinny_set_ahead", "skinny_set_few_ahead", "c_step_set_bridge", "skinny_set_deal", "skinny_set_few32")  # what a library of ours exports


def _load(path: Path) -> ctypes.CDLL:
    """The library at ``path``; OSError where it is no loadable library, AttributeError where it
    lacks one of ``SYMBOLS`` (another build's file under this name)."""
    library = ctypes.CDLL(str(path))
    for name in SYMBOLS:
        getattr(library, name)
    return library


def _load_anew(path: Path) -> ctypes.CDLL:
    """``_load`` of a library rebuilt under a name this process already opened (the loader would hand
    back the old handle for that name): through a link of its own, removed once loaded."""
    link = path.with_name(f"{path.stem}.{os.getpid()}.load.so")
    link.unlink(missing_ok=True)
    os.link(path, link)
    try:
        return _load(link)
    finally:
        link.unlink(missing_ok=True)


def _discard(path: Path, folder: Path) -> None:
    """Remove a library file that did not load, under the build's lock (the next build makes it anew)."""
    from utils.models import exclusive

    with exclusive(folder / f"{path.stem}.lock"):
        path.unlink(missing_ok=True)


@functools.lru_cache(maxsize=1)
def _library() -> Tuple[Optional[ctypes.CDLL], str]:
    """(the loaded library, its file name) or (None, why not)."""
    from utils.models import cache_dir
    from utils.toolchain import c_compiler

    compiler = c_compiler()
    if compiler is None:
        return None, "no C compiler (cc, gcc or $CC)"
    folder = cache_dir() / "kernels"
    try:
        path = _build(compiler, folder)
        try:
            library = _load(path)
        except (OSError, AttributeError):  # a corrupt or foreign file under our name: never used, built again
            _discard(path, folder)
            path = _build(compiler, folder)
            library = _load_anew(path)
    except (OSError, AttributeError, RuntimeError, subprocess.SubprocessError) as error:
        return None, f"the skinny kernel did not build: {error}"
    library.skinny_linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4
    library.skinny_linear.restype = ctypes.c_int
    library.skinny_simd.restype = ctypes.c_int
    library.skinny_tiles.restype = ctypes.c_int
    library.skinny_tile_shape.argtypes = [ctypes.c_int64, ctypes.c_void_p]
    library.skinny_tile_shape.restype = ctypes.c_int
    library.skinny_linear_tile.argtypes = [ctypes.c_int64] + [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4
    library.skinny_linear_tile.restype = ctypes.c_int
    library.skinny_bf16_paths.restype = ctypes.c_int
    library.skinny_linear_bf16.argtypes = [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4
    library.skinny_linear_bf16.restype = ctypes.c_int
    library.skinny_bf16_tiles.argtypes = [ctypes.c_int64]
    library.skinny_bf16_tiles.restype = ctypes.c_int
    library.skinny_bf16_tile_shape.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    library.skinny_bf16_tile_shape.restype = ctypes.c_int
    library.amx_state.restype = ctypes.c_int
    library.skinny_set_ahead.argtypes, library.skinny_set_ahead.restype = [ctypes.c_int64] * 3, ctypes.c_int64
    library.skinny_set_few_ahead.argtypes, library.skinny_set_few_ahead.restype = [ctypes.c_int64], ctypes.c_int64
    library.c_step_set_bridge.argtypes, library.c_step_set_bridge.restype = [ctypes.c_int64], ctypes.c_int64
    library.skinny_set_deal.argtypes, library.skinny_set_deal.restype = [ctypes.c_int64], ctypes.c_int64
    library.c_step.restype = ctypes.c_int
    library.c_step_scratch.restype = ctypes.c_int64
    library.logits_top.argtypes, library.logits_top.restype = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p], None
    library.head_step.restype = ctypes.c_int
    library.head_step_scratch.restype = ctypes.c_int64
    library.blocked_holds.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3
    library.blocked_holds.restype = ctypes.c_int
    return library, path.name


def available() -> Tuple[bool, str]:
    """Whether the kernel is built and loaded here; else False and the reason, in a few words."""
    library, why = _library()
    return library is not None, "" if library is not None else why


def identity() -> str:
    """What a measurement of the kernel depends on: its library's name (source, compiler and CPU
    hashed in it), or "none"."""
    library, name = _library()
    return name if library is not None else "none"


def missing() -> str:
    """"" where the kernel is here; else why it is not, for the lines that list the options measured."""
    built, why = available()
    return "" if built else f"skinny not measured: {why}"


def skinny_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``F.linear(x, weight, bias)`` for float32 CPU tensors by the skinny kernel: ``x`` ``[..., K]``,
    ``weight`` ``[N, K]``, ``bias`` ``[N]`` or None -> ``[..., N]``. Each row of the result is computed
    alone, in a fixed order: it does not depend on how many rows ``x`` has. Anything else (another
    dtype or device of any of the three, autocast, a moved model) is ``F.linear``'s, which raises on a
    mismatch as it would: the C code is only ever handed float32 CPU memory of the right sizes."""
    library, why = _library()
    if library is None:
        raise RuntimeError(why)
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors) or weight.dim() != 2 or \
            x.shape[-1] != weight.shape[1] or (bias is not None and bias.shape != (weight.shape[0],)):
        return torch.nn.functional.linear(x, weight, bias)
    from kernels.blocked import blocked

    return skinny_blocked(x, blocked(weight), weight.shape[0], bias)


def holds(blocks: Tensor, weight: Tensor) -> bool:
    """``kernels.blocked.holds`` by the library's ``blocked_holds``: both read once, in place, on
    torch's threads (about a read of the two at memory speed, where torch's strided compare runs on
    one thread); torch's where the library is not built or the weight is not contiguous float32 CPU."""
    from kernels.blocked import holds as in_torch

    library = _library()[0]
    if library is None or weight.dtype != torch.float32 or blocks.dtype != torch.float32 or weight.device.type != "cpu" \
            or not weight.is_contiguous() or not blocks.is_contiguous():
        return in_torch(blocks, weight)
    n, k = weight.shape
    return bool(library.blocked_holds(blocks.data_ptr(), weight.detach().data_ptr(), n, k, torch.get_num_threads()))


def skinny_blocked(x: Tensor, packed: Tensor, n: int, bias: Optional[Tensor]) -> Tensor:
    """``skinny_linear`` on a weight already blocked (``kernels.blocked``: ``packed`` ``[ceil(n/16), K,
    16]``, float32 CPU, a released layer's one copy): ``x`` ``[..., K]`` -> ``[..., n]``. ``x`` of
    another dtype or device raises, in one line."""
    library = _library()[0]
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[-1] != packed.shape[1]:
        raise RuntimeError(f"the skinny kernel takes float32 CPU rows of {packed.shape[1]} features, got {x.dtype} {x.device} {tuple(x.shape)}")
    bias = None if bias is None else bias.contiguous()
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty((rows.shape[0], n), dtype=torch.float32)
    # torch's thread count, given explicitly: whichever OpenMP runtime the library loaded (torch's own
    # or a second one), it runs that many threads, never its own default
    run_linear(library, rows, packed, bias, out, torch.get_num_threads())
    return out.reshape(*x.shape[:-1], n)


def run_linear(library: ctypes.CDLL, rows: Tensor, packed: Tensor, bias: Optional[Tensor], out: Tensor, threads: int) -> int:
    """One call of the C kernel on checked, contiguous float32 CPU tensors (``packed``: the weight
    blocked, ``kernels.blocked``; ``out`` ``[M, N]``); the threads it ran on."""
    return library.skinny_linear(rows.data_ptr(), packed.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
                                 rows.shape[0], out.shape[1], rows.shape[1], threads)


def library() -> ctypes.CDLL:
    """The loaded library (``c_step`` and the kernel); raises with the reason where it is not built."""
    loaded, why = _library()
    if loaded is None:
        raise RuntimeError(why)
    return loaded
