"""The machine a figure is measured on: its load now (``busy_note``), what makes its figures its own
(``machine_key``: CPU, threads, library versions) and what a result records of it (``run_environment``)."""
import os
import platform
from pathlib import Path
from typing import Callable, Optional, Tuple


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


def last_level_cache(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """Bytes of the CPU's last-level cache as Linux lists it (the highest ``index*/level``; "307200K"
    is 300 MiB); 0 where none is listed. A virtual machine may list its host's."""
    best = (0, 0)
    for index in root.glob("index*"):
        try:
            level, text = int((index / "level").read_text()), (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text[:-1] if scale > 1 else text
        if digits.isdigit():
            best = max(best, (level, int(digits) * scale))
    return best[1]
