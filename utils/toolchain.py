"""The machine's compilers, as the parts that need them find them: a C compiler for the skinny kernel
(``kernels.skinny``: ``$CC``, else ``cc``, else ``gcc``) and the C++ compiler inductor uses for
``--compile`` on CPU (``$CXX``, else ``g++``; ``torch._inductor.cpp_builder.get_cpp_compiler``).
``python -m utils.toolchain`` prints the one line ``make setup`` shows."""
import functools
import os
import shutil
import subprocess
from typing import Optional

# what lacking each costs, measured on the project's 2-core AMD EPYC (docs/profile.md, 2026-11-27):
# a one-position float32 pass of the embedded model took 40.7 ms on the skinny kernel, 50.6 ms prepacked
# (oneDNN) and 54.8 ms on the model's own (MKL) linears
WITHOUT_CC = ("the skinny kernel is left out: passes run on oneDNN/MKL, 1.2-1.3x slower at one position "
              "on the project's EPYC")
WITHOUT_CXX = "--compile cannot run on CPU, and the suite skips its compiled tests"


def c_compiler() -> Optional[str]:
    """The C compiler the skinny kernel is built with (``$CC``, ``cc`` or ``gcc``), or None."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@functools.lru_cache(maxsize=1)
def cxx_compiler() -> Optional[str]:
    """The C++ compiler inductor would use on CPU, or None where it finds none (then ``torch.compile``
    fails on CPU at its first graph)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return get_cpp_compiler()
    except Exception:  # inductor raises InvalidCxxCompiler, or a missing piece of its own
        return None


def _version(compiler: str) -> str:
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "does not run"
    lines = done.stdout.splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else "does not run"


def setup_line() -> str:
    """One line: which C and C++ compilers are here, and what lacking one costs."""
    cc, cxx = c_compiler(), cxx_compiler()
    parts = [f"C compiler {cc} ({_version(cc)})" if cc else f"no C compiler (cc, gcc or $CC): {WITHOUT_CC}",
             f"C++ compiler {cxx}" if cxx else f"no C++ compiler for inductor (g++ or $CXX): {WITHOUT_CXX}"]
    return "Compilers: " + "; ".join(parts)


if __name__ == "__main__":
    print(setup_line())
