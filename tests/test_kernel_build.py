"""The kernels' build machinery (``kernels.skinny._build``) with a fake compiler: a failed or timed-out
build is remembered with its reason and the compiler's identity, and tried again when the compiler
changed or a day has passed, never at every start before that."""
import json
import os
import shutil
from pathlib import Path
from typing import Optional

import pytest

from kernels import skinny

FIXED = 1_700_000_000.0  # the failure marker's mtime; "now" is given relative to it


def fake_compiler(path: Path, log: Path, build: str) -> Path:
    """A compiler script that logs each call, answers --version, and builds by running ``build``."""
    path.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\ncase \"$*\" in *--version*) echo 'fake cc 1.0'; exit 0;; esac\n"
                    f"case \"$*\" in *-shared*) {build};; esac\nexit 0\n")
    path.chmod(0o755)
    return path


def builds(log: Path) -> int:
    return sum("-shared" in line for line in log.read_text().splitlines()) if log.exists() else 0


def failing_build(tmp_path: Path, compiler: Path, now: float) -> str:
    """Run ``_build`` at ``now`` seconds after the marker's time, expecting it to fail; its message."""
    folder = tmp_path / "kernels"
    for marker in folder.glob("*.failed"):
        os.utime(marker, (FIXED, FIXED))
    with pytest.raises(RuntimeError) as error:
        skinny._build(str(compiler), folder, now=lambda: FIXED + now)
    return str(error.value)


def test_a_failed_build_records_why_and_the_compiler_and_is_retried_after_a_day(tmp_path):
    log = tmp_path / "calls"
    compiler = fake_compiler(tmp_path / "cc", log, "echo 'No space left on device' >&2; exit 1")
    assert "No space left on device" in failing_build(tmp_path, compiler, 0)
    (marker,) = (tmp_path / "kernels").glob("skinny-*.failed")
    recorded = json.loads(marker.read_text())
    assert recorded["compiler"] == str(compiler) and recorded["version"] == "fake cc 1.0"
    assert "No space left on device" in recorded["reason"]
    assert "an earlier start" in failing_build(tmp_path, compiler, 3600) and builds(log) == 1  # within the day: remembered
    failing_build(tmp_path, compiler, skinny.RETRY_AFTER + 1)
    assert builds(log) == 2  # a day later: tried again (a full disk, a killed compiler pass)


def test_a_failed_build_is_tried_again_with_another_compiler_of_the_same_version(tmp_path):
    log = tmp_path / "calls"
    first = fake_compiler(tmp_path / "cc", log, "exit 1")
    failing_build(tmp_path, first, 0)
    other = fake_compiler(tmp_path / "cc2", log, "exit 1")  # same --version line, another path
    failing_build(tmp_path, other, 60)
    assert builds(log) == 2


def test_a_build_that_times_out_is_recorded_and_not_retried_at_every_start(tmp_path, monkeypatch):
    monkeypatch.setattr(skinny, "BUILD_TIMEOUT", 0.5)
    log = tmp_path / "calls"
    compiler = fake_compiler(tmp_path / "cc", log, "exec sleep 30")
    assert "timed out after 0.5 s" in failing_build(tmp_path, compiler, 0)
    (marker,) = (tmp_path / "kernels").glob("skinny-*.failed")
    assert "timed out" in json.loads(marker.read_text())["reason"]
    assert "timed out" in failing_build(tmp_path, compiler, 60) and builds(log) == 1


_PROBE = ("import kernels.skinny as s, os; ok, why = s.available(); print(ok, why); "
          "print(s.identity()); print(os.path.getsize(os.path.join(os.environ['SPECDEC_CACHE'], 'kernels', s.identity())))")


def probe(cache: Path, compiler: Optional[Path] = None):
    """A fresh Python's ``skinny.available()`` on the cache folder ``cache``: builds there when needed (with
    ``compiler`` as ``$CC`` where given)."""
    import subprocess
    import sys

    env = {"PATH": "/usr/bin:/bin", "SPECDEC_CACHE": str(cache), **({"CC": str(compiler)} if compiler else {})}
    return subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, cwd=str(skinny.SOURCE.parents[1]),
                          env=env, timeout=180)


def copying_compiler(path: Path, log: Path, library: Path) -> Path:
    """The machine's C compiler for every question (``--version``, its target: the library's name hashes
    them, so it stays the first build's), but a library build logs the call and copies ``library`` to its
    output: the rebuild path runs as it does, without the ~15 s of compiling the C step again."""
    from utils.toolchain import c_compiler

    real = shutil.which("cc", path="/usr/bin:/bin") or c_compiler()
    path.write_text(f"#!/bin/sh\ncase \"$*\" in *-shared*)\n  echo \"$@\" >> {log}\n  out=; previous=\n"
                    f"  for arg in \"$@\"; do [ \"$previous\" = -o ] && out=$arg; previous=$arg; done\n"
                    f"  exec cp {library} \"$out\";;\nesac\nexec {real} \"$@\"\n")
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def first_build():
    """The library a first start built: the suite's own cache folder's (``conftest.MEASUREMENTS_ENV``:
    built there once per run, by whichever test needed it first, or here), as ``(folder, [name, size])``.
    Each corruption below copies it into a fresh folder and damages the copy; the rebuild copies it back
    (``copying_compiler``): only a fresh Python per case is paid, not a compile of the library."""
    from conftest import MEASUREMENTS_ENV

    cache = Path(MEASUREMENTS_ENV["SPECDEC_CACHE"])
    first = probe(cache)
    assert first.returncode == 0 and first.stdout.startswith("True"), first.stderr
    return cache, first.stdout.splitlines()[1:3]


@pytest.mark.needs_cc
@pytest.mark.parametrize("content", [b"not a library", "foreign"])
def test_a_corrupt_or_foreign_library_under_our_name_is_built_again_never_used(first_build, tmp_path, content):
    """The cached library replaced by garbage (a torn copy, a full disk) or by another library (no
    ``c_step``): the next start builds it again (one build call) and loads that, never the file it found."""
    import subprocess

    name, size = first_build[1]
    library = tmp_path / "kernels" / name
    library.parent.mkdir()
    shutil.copyfile(first_build[0] / "kernels" / name, library)
    if content == "foreign":
        other = tmp_path / "other.c"
        other.write_text("int skinny_linear(void) { return 0; }\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(other)], check=True, timeout=60)
    else:
        library.write_bytes(content)
    log = tmp_path / "calls"
    compiler = copying_compiler(tmp_path / "cc", log, first_build[0] / "kernels" / name)
    again = probe(tmp_path, compiler)
    assert again.returncode == 0 and again.stdout.splitlines() == ["True ", name, size], again.stdout + again.stderr
    assert builds(log) == 1, "the file found was not built again"
