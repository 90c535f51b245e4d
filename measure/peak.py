"""The float32 FMA peak of the cores a pass runs on: cores x clock x FMA units x float32 lanes x 2 FLOP,
from what the machine says of itself (``/proc/cpuinfo``, ``/sys``) and what the kernel was built for
(its vector width), each part's source named, and what could not be read said to be assumed: the FMA
units a core has are not in ``/proc/cpuinfo`` (they are assumed by vendor, family and vector width), and
the clock read is cpufreq's maximum where the kernel shows it, else the nominal one (a virtual machine's
``cpu MHz``): neither is the clock under a sustained AVX-512 load. A figure to set a pass's GFLOP/s
beside, not a measurement."""
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Tuple

PROC, SYS = Path("/proc"), Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class Peak:
    """``cores`` x ``ghz`` x ``units`` FMA units x ``lanes`` float32 lanes x 2 FLOP a cycle; each ``*_from`` names the source."""

    cores: int
    ghz: float
    ghz_from: str
    units: int
    units_from: str
    lanes: int
    cores_from: str

    def gflops(self) -> float:
        """The peak in GFLOP/s (10^9 floating-point operations a second)."""
        return self.cores * self.ghz * self.units * self.lanes * 2

    def line(self) -> str:
        """"float32 FMA peak 269 GFLOP/s = 2 cores (...) x 2.10 GHz (...) x 2 FMA units (...) x 16 lanes x 2"."""
        return (f"float32 FMA peak {self.gflops():.0f} GFLOP/s = {self.cores} core{'s' if self.cores != 1 else ''} ({self.cores_from}) x "
                f"{self.ghz:.2f} GHz ({self.ghz_from}) x {self.units} FMA unit{'s' if self.units != 1 else ''} ({self.units_from}) x "
                f"{self.lanes} float32 lanes x 2 FLOP")


def cpuinfo(text: str) -> Dict[str, str]:
    """The first processor's fields of a ``/proc/cpuinfo`` text (lower-case keys)."""
    fields: Dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    return fields


def clock(fields: Dict[str, str], max_khz: str = "") -> Tuple[float, str]:
    """GHz and where it came from: cpufreq's ``cpuinfo_max_freq`` (kHz), else the model name's "@ 2.10GHz",
    else ``cpu MHz``; (0, why) where none says."""
    if max_khz.strip().isdigit():
        return int(max_khz) / 1e6, "cpufreq's maximum, not the clock under a sustained AVX-512 load"
    named = re.search(r"@\s*([\d.]+)\s*GHz", fields.get("model name", ""))
    if named:
        return float(named.group(1)), "the model name's base clock; turbo not counted"
    try:
        return float(fields["cpu mhz"]) / 1000, "/proc/cpuinfo's cpu MHz: the nominal clock here, turbo not counted"
    except (KeyError, ValueError):
        return 0.0, "no clock readable"


def fma_units(fields: Dict[str, str], lanes: int) -> Tuple[int, str]:
    """FMA units a core issues a ``lanes``-wide FMA to each cycle, assumed by vendor and family."""
    vendor, family = fields.get("vendor_id", ""), fields.get("cpu family", "")
    if lanes == 16 and vendor == "AuthenticAMD" and family == "25":
        return 1, "assumed: Zen 4 runs a 512-bit FMA as two 256-bit halves, one a cycle"
    if lanes == 16 and vendor == "AuthenticAMD":
        return 2, "assumed: Zen 5 and later, two 512-bit FMA pipes (a mobile Zen 5 has one)"
    if lanes == 16 and vendor == "GenuineIntel":
        return 2, "assumed: an Intel server core's two 512-bit FMA ports (some Xeon Silver and Bronze, and client cores, have one)"
    if lanes == 8:
        return 2, "assumed: two 256-bit FMA pipes, as every AVX2 core since Haswell and Zen 2"
    return 2, "assumed: two scalar FMA pipes"


def cores(threads: int, siblings: str = "") -> Tuple[int, str]:
    """The cores ``threads`` threads run on: one each, unless ``siblings`` (cpu0's ``thread_siblings_list``)
    says a core runs two (then half, at least one)."""
    shared = len([part for part in siblings.replace("-", ",").split(",") if part.strip()]) > 1
    if shared:
        return max(1, threads // 2), f"{threads} threads on cores of 2 hardware threads each"
    return threads, f"{threads} threads, one a core" + ("" if siblings.strip() else " (assumed: no topology readable)")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def machine_peak(threads: int, simd_bits: int, proc: Path = PROC, cpus: Path = SYS) -> Peak:
    """The ``Peak`` of ``threads`` threads running a kernel built for ``simd_bits``-wide vectors (512,
    256, or 0: scalar), from ``proc``/cpuinfo and ``cpus``' cpufreq and topology."""
    fields = cpuinfo(_read(proc / "cpuinfo"))
    lanes = max(1, simd_bits // 32)
    ghz, ghz_from = clock(fields, _read(cpus / "cpu0" / "cpufreq" / "cpuinfo_max_freq"))
    units, units_from = fma_units(fields, lanes)
    count, count_from = cores(threads, _read(cpus / "cpu0" / "topology" / "thread_siblings_list"))
    return Peak(count, ghz, ghz_from, units, units_from, lanes, count_from)
