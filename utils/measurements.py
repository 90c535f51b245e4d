"""Start-up measurements that stay usable on a busy machine: a time budget each (checked between
passes, never inside one), a progress line on stderr, the machine's load, and results saved per
machine, model and settings in ``cache_dir()/measurements`` and reused on the next start.

A measurement never changes a generated token: it only picks kernels, a cache kind or the policy's
costs, so reusing one (or falling back) changes speed, never output.
"""
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

Clock = Callable[[], float]
Say = Callable[[str], None]

# Seconds each start-up measurement may take. On a quiet 2-core CPU the embedded 135M model needs
# well under these (cache and kernels ~1 s each, verification costs ~3 s); on a busy one they are
# the ceiling: a measurement stops at its first check past the budget (at most one pass later).
BUDGETS: Dict[str, float] = {"cache": 3.0, "prepack": 5.0, "verification": 5.0, "drafter": 2.0, "dtype": 2.0}


def to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Budget:
    """``seconds`` of ``clock`` for one measurement, started when made. ``exhausted()`` is asked
    between passes; once true the measurement stops and ``stopped`` stays true."""

    seconds: float
    clock: Clock = time.perf_counter
    progress: Optional[Callable[[int, int], None]] = None  # (passes done, passes planned)
    stopped: bool = field(default=False, init=False)
    note: str = field(default="", init=False)  # what was measured when the budget cut it short

    def __post_init__(self) -> None:
        self.started = self.clock()

    def exhausted(self) -> bool:
        if not self.stopped and self.clock() - self.started > self.seconds:
            self.stopped = True
        return self.stopped

    def tick(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)

    @property
    def reason(self) -> str:
        return f"measurement over its {self.seconds:g} s budget"


# ---- the machine's load -------------------------------------------------------------------------
def cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_note(load: Callable[[], Tuple[float, ...]] = os.getloadavg, cpus: Optional[int] = None) -> str:
    """One line when the 1-minute load average exceeds the CPUs this process may use (more runnable
    work than cores: every pass timed now waits its turn), else "". Nothing where there is no load average."""
    cpus = cpus or cpu_count()
    try:
        recent = load()[0]
    except (OSError, AttributeError):
        return ""
    if recent <= cpus:
        return ""
    return f"the machine is busy (load {recent:.1f} on {cpus} CPU{'s' if cpus > 1 else ''}): figures will be noisy"


# ---- progress -------------------------------------------------------------------------------------
def announce(line: str, say: Optional[Say] = None, tty: Optional[bool] = None) -> Optional[Callable[[int, int], None]]:
    """Say ``line`` (stderr by default) as a measurement starts; on a terminal, return a progress
    callback that redraws one line with ``\\r`` between passes (no thread: a spinner's thread
    would compete with the passes being timed). None elsewhere, like the loading lines."""
    (say or to_stderr)(line)
    if not (sys.stderr.isatty() if tty is None else tty):
        return None

    def progress(done: int, total: int) -> None:
        width = 24
        filled = width * done // max(total, 1)
        end = "\r\033[K" if done >= total else ""
        sys.stderr.write(f"\r  [{'#' * filled}{'.' * (width - filled)}] {done}/{total} passes{end}")
        sys.stderr.flush()

    return progress


def finish_progress(progress: Optional[Callable[[int, int], None]]) -> None:
    """Clear a progress line left open by a measurement that stopped early."""
    if progress is not None:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


# ---- what a measurement depends on ------------------------------------------------------------
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, else ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_key() -> dict:
    """What makes this machine's figures its own: CPU, threads, torch and transformers versions."""
    import torch
    import transformers

    return {"cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def run_environment() -> dict:
    """What a figure was measured with, for its record: ``machine_key`` plus Python and the CPU's vector extensions."""
    from utils.load import cpu_flags

    return {**machine_key(), "python": platform.python_version(), "cpu_flags": cpu_flags()}


def versions_line() -> str:
    """``run_environment`` in one line: the libraries, Python, the CPU and its vector extensions."""
    env = run_environment()
    return (f"torch {env['torch']} · transformers {env['transformers']} · Python {env['python']} · {env['cpu']} "
            f"({env['cpu_flags'] or 'no AVX2'}), {env['threads']} threads")


def model_identity(model) -> dict:
    """A model's name and a cheap fingerprint: its config's hash, parameter count, dtype and device.
    The folder's last component only: a measurement is about speed, which the moved folder keeps."""
    config = model.config
    name = str(getattr(config, "_name_or_path", "") or type(model).__name__)
    text = config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else repr(config)
    params = next(model.parameters())
    return {"name": Path(name).name or name, "config": hashlib.sha256(text.encode()).hexdigest()[:16],
            "parameters": sum(p.numel() for p in model.parameters()), "dtype": str(params.dtype).replace("torch.", ""),
            "device": str(params.device)}


# ---- saved results --------------------------------------------------------------------------------
def measurements_dir() -> Path:
    """``cache_dir()/measurements`` (the test suite points the cache folder at one of its own)."""
    from utils.models import cache_dir

    return cache_dir() / "measurements"


def saved_path(kind: str, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return measurements_dir() / f"{kind}-{digest}.json"


@dataclass
class Saved:
    result: dict
    when: str  # YYYY-MM-DD HH:MM, local time
    noisy: bool  # measured on a busy machine, or stopped by its budget


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``: a
    reader (another process) sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def save(kind: str, key: dict, result: dict, noisy: bool, when: Optional[str] = None) -> Path:
    path = saved_path(kind, key)
    record = {"kind": kind, "key": key, "when": when or time.strftime("%Y-%m-%d %H:%M"), "noisy": noisy, "result": result}
    write_atomically(path, json.dumps(record, indent=1, sort_keys=True))
    return path


def load(kind: str, key: dict, check: Callable[[dict], None], say: Say = to_stderr) -> Optional[Saved]:
    """The saved result for ``kind`` and ``key``, or None: none saved, or one that does not parse or
    has the wrong shape (``check`` raises ValueError saying why), which is named in one line."""
    path = saved_path(kind, key)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as error:
        return _unreadable(path, f"cannot read it ({error.strerror})", say)
    try:
        record = json.loads(text)
        if not isinstance(record, dict) or not isinstance(record.get("result"), dict):
            raise ValueError("not a saved measurement")
        if record.get("key") != key:
            raise ValueError("saved for other settings")
        if not isinstance(record.get("when"), str) or not isinstance(record.get("noisy"), bool):
            raise ValueError("no date or noise flag")
        check(record["result"])
    except (ValueError, TypeError, KeyError) as error:  # json's errors are ValueErrors
        return _unreadable(path, str(error).splitlines()[0] if str(error) else type(error).__name__, say)
    return Saved(record["result"], record["when"], record["noisy"])


def _unreadable(path: Path, reason: str, say: Say) -> None:
    say(f"ignoring unreadable measurement {path}: {reason}; measuring again")
    return None


def remembered(kind: str, key: dict, measure: Callable[[], Tuple[dict, bool]], check: Callable[[dict], None],
               remeasure: bool = False, busy: bool = False, say: Say = to_stderr) -> Tuple[dict, str]:
    """``(result, provenance)``: the saved result ("reused from <date>") unless ``remeasure``, or unless
    it was noisy and the machine is quiet now (a better measurement is possible); else
    ``measure()`` (returning the result and whether it stopped early), saved, with provenance ""."""
    saved = None if remeasure else load(kind, key, check, say)
    if saved is not None and not (saved.noisy and not busy):
        return saved.result, f"reused from {saved.when}"
    result, stopped = measure()
    try:
        save(kind, key, result, noisy=busy or stopped)
    except OSError as error:  # a read-only cache: measured, not saved
        say(f"could not save the measurement in {measurements_dir()}: {error.strerror}")
    return result, ""
