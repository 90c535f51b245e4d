"""The FMA peak a pass's GFLOP/s is set beside (``measure.peak``): read from injected /proc and /sys
texts, each part's source named, what cannot be read said to be assumed."""
import pytest

from measure.peak import clock, cores, cpuinfo, fma_units, machine_peak

XEON = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\nmodel name\t: Intel(R) Xeon(R) Processor\n" \
       "cpu MHz\t\t: 2100.000\nflags\t\t: fma avx2 avx512f\n\nprocessor\t: 1\ncpu MHz\t\t: 999.0\n"
ZEN4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel name\t: AMD EPYC 9R14 96-Core Processor\ncpu MHz\t\t: 3700.0\n"


def test_a_virtual_xeon_with_no_cpufreq_peaks_at_its_nominal_clock_with_two_fma_ports(tmp_path):
    (tmp_path / "cpuinfo").write_text(XEON)
    peak = machine_peak(2, 512, proc=tmp_path, cpus=tmp_path / "none")
    assert (peak.cores, peak.ghz, peak.units, peak.lanes) == (2, 2.1, 2, 16)
    assert peak.gflops() == pytest.approx(2 * 2.1 * 2 * 16 * 2)
    assert "nominal clock" in peak.ghz_from and peak.units_from.startswith("assumed") and "assumed" in peak.cores_from
    assert peak.line().startswith("float32 FMA peak 269 GFLOP/s = 2 cores (")


def test_cpufreqs_maximum_and_hyperthreads_are_read_where_the_kernel_shows_them(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(ZEN4)
    for part, text in (("cpufreq/cpuinfo_max_freq", "3700000\n"), ("topology/thread_siblings_list", "0,96\n")):
        path = tmp_path / "cpus" / "cpu0" / part
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    peak = machine_peak(2, 512, proc=tmp_path / "proc", cpus=tmp_path / "cpus")
    assert (peak.cores, peak.ghz, peak.units) == (1, 3.7, 1) and "cpufreq" in peak.ghz_from and "Zen 4" in peak.units_from


def test_each_part_falls_back_and_says_from_where():
    assert clock(cpuinfo("model name\t: Intel(R) Xeon(R) Gold 6130 CPU @ 2.10GHz\n"))[0] == 2.1
    assert clock({}) == (0.0, "no clock readable")
    assert fma_units({"vendor_id": "GenuineIntel"}, 8)[0] == 2 and fma_units({}, 1)[0] == 2
    assert cores(4, "3\n") == (4, "4 threads, one a core") and cores(1, "0-1")[0] == 1
