"""A fresh machine without compilers meets no surprise: ``make setup`` says what is missing and what
it costs, the compiled tests skip with the reason, and the start-up line names the kernels it really
measures (``utils.toolchain``, ``measure.timing.kernel_options_text``)."""
import os
import subprocess
import sys
from pathlib import Path

from measure import timing
from kernels import skinny

ROOT = Path(__file__).resolve().parents[1]
NO_COMPILERS = {"PATH": "/nonexistent", "CXX": "/nonexistent/g++", "HOME": os.environ.get("HOME", "/tmp")}


def test_setup_says_in_one_line_that_the_compilers_are_missing_and_what_that_costs():
    done = subprocess.run([sys.executable, "-m", "utils.toolchain"], capture_output=True, text=True, cwd=ROOT,
                          env=NO_COMPILERS, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1
    assert "no C compiler (cc, gcc or $CC): the skinny kernel is left out" in lines[0]
    assert "no C++ compiler for inductor (g++ or $CXX): --compile cannot run on CPU" in lines[0]


def test_setup_names_the_compilers_that_are_here():
    done = subprocess.run([sys.executable, "-m", "utils.toolchain"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("Compilers: "), done.stderr
    from utils.toolchain import c_compiler, cxx_compiler

    assert ("no C compiler" in done.stdout) == (c_compiler() is None)
    assert ("no C++ compiler" in done.stdout) == (cxx_compiler() is None)


def test_the_compiled_tests_skip_with_the_reason_where_inductor_finds_no_cxx_compiler():
    env = {**os.environ, "CXX": "/nonexistent/g++", "PATH": f"{Path(sys.executable).parent}:/nonexistent"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "tests/test_compile_cache.py"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "3 skipped" in done.stdout and "passed" not in done.stdout.splitlines()[-1]
    assert "no C++ compiler for inductor (g++ or $CXX): --compile cannot run on CPU" in done.stdout


def test_the_kernel_measurement_names_the_options_it_times_and_why_one_is_missing(monkeypatch):
    assert timing.kernel_options_text() == ("own, prepacked and skinny linears" if skinny.available()[0] else
                                            f"own and prepacked linears; skinny not measured: {skinny.available()[1]}")
    monkeypatch.setattr(skinny, "available", lambda: (False, "no C compiler (cc, gcc or $CC)"))
    assert timing.kernel_options() == ("prepacked", "own")
    assert timing.kernel_options_text() == "own and prepacked linears; skinny not measured: no C compiler (cc, gcc or $CC)"
