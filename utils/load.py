"""What else ran while we timed: the CPU that every process outside this one's tree used, read from
``/proc`` between timed runs (never during one), and the load average.

A timing is only as good as the machine's quiet. The benchmark, the A/B script and the profile take a
``LoadMeter`` window around each timed run and keep its figures with the result; a window in which
the other processes used more than ``busy`` cores on average is *noisy*. The accounting matches
``../shared/tools/quiet``: per process, user + system time between two readings (a process that
started between them counts whole; one that ended between them is missed, so the figure is a floor),
and where ``/proc/stat`` is readable, at least the machine's busy CPU less this tree's (``machine_seconds``,
``reaped_seconds``): that sees what started and ended within the window (a test file, a build, a helper's short
runs), which the per-process sum misses entirely.
"""
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Protocol, Set, Tuple

PROC = Path("/proc")
BUSY = 0.3  # cores: the quiet tool's default; above it a timing is noisy
# every start-up measurement's window reports this many other cores instead of reading /proc (``start_up_meter``):
# the test suite sets "0", since its second worker would make each of its measurements noisy, measured again
OTHERS_ENV = "SPECDEC_OTHERS_CORES"
Table = Dict[int, Tuple[int, float]]  # pid -> (parent pid, CPU seconds: user + system)


def read_processes(proc: Path = PROC, tick: Optional[int] = None) -> Table:
    """Every process's parent and CPU seconds so far, from ``proc/<pid>/stat`` (empty without /proc)."""
    tick = tick or os.sysconf("SC_CLK_TCK")
    table: Table = {}
    try:
        entries = [entry for entry in os.listdir(proc) if entry.isdigit()]
    except OSError:
        return table
    for entry in entries:
        try:
            text = (proc / entry / "stat").read_text()
        except OSError:  # the process ended while we listed
            continue
        fields = text[text.rindex(")") + 2:].split()  # the name, in parentheses, may hold spaces
        table[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return table


def machine_seconds(proc: Path = PROC, tick: Optional[int] = None) -> Optional[Tuple[float, int]]:
    """The CPU seconds every process has used so far, machine-wide: ``proc/stat``'s first line's user, nice,
    system, irq and softirq (not idle, iowait or steal: the hypervisor's other guests), and how many CPUs it
    sums (its ``cpuN`` lines); None without it."""
    tick = tick or os.sysconf("SC_CLK_TCK")
    try:
        lines = (proc / "stat").read_text().split("\n")
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in lines[0].split()[1:8])
    except (OSError, ValueError, IndexError):
        return None
    cpus = sum(1 for line in lines[1:] if line.startswith("cpu") and line[3:4].isdigit())
    return (user + nice + system + irq + softirq) / tick, max(cpus, 1)


def reaped_seconds(pid: int, proc: Path = PROC, tick: Optional[int] = None) -> float:
    """The CPU seconds of ``pid``'s children that ended and were waited for (``stat``'s cutime and cstime)."""
    tick = tick or os.sysconf("SC_CLK_TCK")
    try:
        text = (proc / str(pid) / "stat").read_text()
        fields = text[text.rindex(")") + 2:].split()
        return (int(fields[13]) + int(fields[14])) / tick
    except (OSError, ValueError, IndexError):
        return 0.0


def tree(root: int, table: Table) -> Set[int]:
    """``root`` and every process descended from it."""
    children: Dict[int, List[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def others_seconds(before: Table, after: Table, mine: Iterable[int]) -> float:
    """CPU seconds used between two readings by the processes outside ``mine``."""
    mine = set(mine)
    return sum(max(0.0, seconds - before.get(pid, (0, 0.0))[1]) for pid, (_, seconds) in after.items() if pid not in mine)


@dataclass(frozen=True)
class Window:
    """One timed run's surroundings: the other processes' mean cores over it and the 1-minute load average at its end."""

    seconds: float
    others_cores: float
    load_average: Optional[float]

    def note(self, what: str) -> str:
        """One line for a noisy window: ``what`` ran beside other work."""
        return (f"other processes used {self.others_cores:.2f} cores during {what} ({self.seconds:.0f} s): "
                "its measurements are noisy")

    def record(self, busy: float = BUSY) -> dict:
        return {"others_cores": round(self.others_cores, 3), "load_average": self.load_average,
                "noisy": self.others_cores > busy, "busy_limit": busy}


class LoadMeter:
    """``start()`` before a timed run and ``stop()`` after it give that run's ``Window``; this process
    and its children (a peer's subprocess, say) are ours, not noise."""

    def __init__(self, proc: Path = PROC, root: Optional[int] = None, clock: Callable[[], float] = time.monotonic,
                 load: Callable[[], Tuple[float, ...]] = os.getloadavg, tick: Optional[int] = None):
        self.proc, self.root, self.clock, self.load, self.tick = proc, root or os.getpid(), clock, load, tick
        self._before: Table = {}
        self._started = 0.0
        self._machine: Optional[Tuple[float, int]] = None
        self._reaped = 0.0

    def start(self) -> None:
        # the machine's count is read inside ours (ours first here, last in ``stop``), so that our threads' CPU
        # between the readings (OpenMP's spinning workers) is never counted as another's
        self._before, self._started = read_processes(self.proc, self.tick), self.clock()
        self._machine, self._reaped = machine_seconds(self.proc, self.tick), reaped_seconds(self.root, self.proc, self.tick)

    def stop(self) -> Window:
        machine, reaped = machine_seconds(self.proc, self.tick), reaped_seconds(self.root, self.proc, self.tick)
        after, now = read_processes(self.proc, self.tick), self.clock()
        mine = tree(self.root, after) | tree(self.root, self._before)
        elapsed = max(now - self._started, 1e-9)
        others = others_seconds(self._before, after, mine)
        if machine is not None and self._machine is not None:  # what ran and ended within the window too
            ours = sum(max(0.0, seconds - self._before.get(pid, (0, 0.0))[1]) for pid, (_, seconds) in after.items() if pid in mine)
            # /proc/stat counts a tick per CPU, a process's stat rounds down to a tick: over a short window (a race
            # of 0.2 s) those ticks alone read as a third of a core, so they are taken off (a floor, like the rest)
            slack = (machine[1] + 1) / (self.tick or os.sysconf("SC_CLK_TCK"))
            others = max(others, machine[0] - self._machine[0] - ours - max(0.0, reaped - self._reaped) - slack)
        try:
            average = round(self.load()[0], 2)
        except (OSError, AttributeError):
            average = None
        return Window(elapsed, others / elapsed, average)


class Meter(Protocol):
    """What a timed run is measured in: ``start()`` before it, ``stop()`` after it gives its ``Window``."""

    def start(self) -> None: ...

    def stop(self) -> Window: ...


@dataclass(frozen=True)
class FixedMeter:
    """A meter whose every window says the other processes used ``cores`` (``OTHERS_ENV``; tests)."""

    cores: float

    def start(self) -> None:
        """Nothing to read."""

    def stop(self) -> Window:
        return Window(0.0, self.cores, None)


def start_up_meter() -> Meter:
    """The meter a start-up measurement is taken in (``measure.record.Options.meter``): a ``LoadMeter`` of this
    process, or a ``FixedMeter`` where ``$SPECDEC_OTHERS_CORES`` names the cores (the one place it is read)."""
    fixed = os.environ.get(OTHERS_ENV)
    if not fixed:
        return LoadMeter()
    try:
        cores = float(fixed)
    except ValueError:
        cores = -1.0
    if not cores >= 0:  # NaN and negatives too: a window's cores are a count
        raise ValueError(f"${OTHERS_ENV} must be a number of cores >= 0 (it is {fixed!r})")
    return FixedMeter(cores)


@dataclass(frozen=True)
class LoadSummary:
    """The windows of a whole measurement: time-weighted mean and peak other cores, the highest load
    average, and how many windows were noisy against ``busy``."""

    mean_cores: float
    peak_cores: float
    load_average: Optional[float]
    noisy: int
    windows: int
    busy: float = BUSY

    @classmethod
    def of(cls, records: Iterable[dict], busy: float = BUSY) -> Optional["LoadSummary"]:
        """From records carrying ``others_cores`` (and ``seconds``, ``load_average``, ``noisy``); None when none does."""
        measured = [r for r in records if r.get("others_cores") is not None]
        if not measured:
            return None
        weights = [max(r.get("seconds") or 0.0, 1e-9) for r in measured]
        mean = sum(w * r["others_cores"] for w, r in zip(weights, measured)) / sum(weights)
        averages = [r["load_average"] for r in measured if r.get("load_average") is not None]
        busy = measured[0].get("busy_limit", busy)  # the limit the run was judged by
        noisy = sum(bool(r.get("noisy", r["others_cores"] > busy)) for r in measured)
        return cls(mean, max(r["others_cores"] for r in measured), max(averages) if averages else None, noisy,
                   len(measured), busy)

    @property
    def quiet(self) -> bool:
        return self.noisy == 0

    def line(self) -> str:
        """``QUIET: ...`` or ``NOISY: ...``, one line, as the quiet tool says it."""
        average = f", load average up to {self.load_average:.2f}" if self.load_average is not None else ""
        verdict = "QUIET" if self.quiet else f"NOISY ({self.noisy} of {self.windows} timed runs above {self.busy:g} cores)"
        return (f"{verdict}: other processes used {self.mean_cores:.2f} cores on average (peak {self.peak_cores:.2f} "
                f"over one timed run) during {self.windows} timed run{'s' if self.windows != 1 else ''}{average}")


def cpu_flags(proc: Path = PROC) -> str:
    """The vector extensions that decide CPU kernels: ``avx2``, ``avx512f``, ``avx512_bf16``, ``amx_tile`` (those present)."""
    try:
        text = (proc / "cpuinfo").read_text()
    except OSError:
        return ""
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags)


def over_busy(window: Window) -> Optional[float]:
    """The other processes' cores over ``window`` where they exceed ``BUSY`` (a measurement taken under load), else
    None. The caller starts its meter, runs and stops it itself: a callback from here would call back up a floor
    (``tests/test_startup_trace.py``)."""
    return window.others_cores if window.others_cores > BUSY else None
