"""The load accounting every timing carries (``utils.load``): other processes' CPU from a fake
``/proc``, this process's tree excluded, windows summed into one QUIET or NOISY line, and the
benchmark's ``--strict`` refusing a noisy run. No clock, no real load: every figure is injected."""
from pathlib import Path

import pytest

from app.bench.report import check_strict, load_line, markdown, summarize
from utils.load import LoadMeter, LoadSummary, cpu_flags, others_seconds, read_processes, tree

TICK = 100  # clock ticks a second, as written in the fake stat files


def write_stat(proc: Path, pid: int, parent: int, user_ticks: int, system_ticks: int, name: str = "python", reaped_ticks: int = 0) -> None:
    """One ``/proc/<pid>/stat`` line as the kernel writes it (fields 14-17: utime, stime, cutime, cstime)."""
    fields = ["S", str(parent)] + ["0"] * 9 + [str(user_ticks), str(system_ticks), str(reaped_ticks), "0"] + ["0"] * 28
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "stat").write_text(f"{pid} ({name}) " + " ".join(fields) + "\n")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_stat_lines_are_read_with_names_holding_spaces_and_parentheses(tmp_path):
    write_stat(tmp_path, 10, 1, 150, 50, name="tmux: server (1)")
    (tmp_path / "self").mkdir()  # not a pid
    assert read_processes(tmp_path, TICK) == {10: (1, 2.0)}
    assert read_processes(tmp_path / "absent", TICK) == {}


def test_a_process_tree_holds_every_descendant_and_nothing_else():
    table = {1: (0, 0.0), 5: (1, 0.0), 6: (5, 0.0), 7: (6, 0.0), 8: (1, 0.0)}
    assert tree(5, table) == {5, 6, 7}
    assert others_seconds({5: (1, 1.0), 8: (1, 1.0)}, {5: (1, 9.0), 8: (1, 1.5), 9: (1, 0.25)}, {5}) == pytest.approx(0.75)


def test_a_window_counts_other_processes_and_never_ours_or_our_children(tmp_path):
    clock = Clock()
    write_stat(tmp_path, 100, 1, 0, 0)      # this process
    write_stat(tmp_path, 200, 1, 1000, 0)   # another program, already running
    write_stat(tmp_path, 300, 1, 500, 0)    # another, which ends during the window (missed: a floor)
    meter = LoadMeter(tmp_path, root=100, clock=clock, load=lambda: (1.5, 1.0, 1.0), tick=TICK)
    meter.start()
    clock.now = 10.0
    write_stat(tmp_path, 100, 1, 2000, 0)   # ours: 20 s of CPU over 10 s on two threads
    write_stat(tmp_path, 101, 100, 900, 0)  # our child (a peer's subprocess), started meanwhile
    write_stat(tmp_path, 200, 1, 1300, 0)   # +3 s
    write_stat(tmp_path, 400, 1, 200, 0)    # started meanwhile: +2 s, counted whole
    (tmp_path / "300" / "stat").unlink()
    window = meter.stop()
    assert window.seconds == 10.0 and window.others_cores == pytest.approx(0.5) and window.load_average == 1.5
    assert window.record(busy=0.3) == {"others_cores": 0.5, "load_average": 1.5, "noisy": True, "busy_limit": 0.3}
    assert window.record(busy=0.6)["noisy"] is False
    assert window.note("start-up") == "other processes used 0.50 cores during start-up (10 s): its measurements are noisy"


def write_machine(proc: Path, user: int, system: int, idle: int, steal: int = 0) -> None:
    """``/proc/stat``'s first line: user nice system idle iowait irq softirq steal guest guest_nice (ticks)."""
    (proc / "stat").write_text(f"cpu  {user} 0 {system} {idle} 7 0 0 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")


def test_a_window_sees_processes_that_started_and_ended_within_it_by_the_machines_busy_time(tmp_path):
    """A helper's short runs (a test file, a build) start and end between two readings: no process table sees
    them, the machine's busy time does; ours, our children's and the hypervisor's steal are not counted."""
    clock = Clock()
    write_stat(tmp_path, 100, 1, 0, 0)
    write_machine(tmp_path, 1000, 0, 5000)
    meter = LoadMeter(tmp_path, root=100, clock=clock, load=lambda: (1.0,), tick=TICK)
    meter.start()
    clock.now = 10.0
    write_stat(tmp_path, 100, 1, 1500, 0, reaped_ticks=300)  # ours 15 s, a child of ours ran 3 s and was waited for
    write_machine(tmp_path, 1000 + 1500 + 300 + 600, 200, 5200, steal=400)  # others: 6 s user + 2 s system, unseen
    assert meter.stop().others_cores == pytest.approx((8.0 - 0.02) / 10)  # less two ticks: one CPU's, one our stat's
    meter.start()
    clock.now = 20.0
    write_stat(tmp_path, 100, 1, 2500, 0, reaped_ticks=300)
    write_machine(tmp_path, 3400 + 1000, 200, 6000)  # only ours: quiet, never below the per-process floor
    assert meter.stop().others_cores == pytest.approx(0.0)


def test_a_short_quiet_window_is_not_read_as_load_from_the_ticks_the_counters_round_to(tmp_path):
    """A 0.1 s race on two busy threads: /proc/stat counts whole ticks per CPU and our stat rounds down, so the
    machine can show 3 ticks more than ours with nothing else running. That is 0.3 cores over 0.1 s, not load."""
    clock = Clock()
    write_stat(tmp_path, 100, 1, 1000, 0)
    (tmp_path / "stat").write_text("cpu  5000 0 0 9000 0 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\ncpu1 1 2 3 4 5 6 7 8 9 10\n")
    meter = LoadMeter(tmp_path, root=100, clock=clock, load=lambda: (1.0,), tick=TICK)
    meter.start()
    clock.now = 0.1
    write_stat(tmp_path, 100, 1, 1019, 0)  # ours: 0.19 s as our stat rounds it
    (tmp_path / "stat").write_text("cpu  5022 0 0 9000 0 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\ncpu1 1 2 3 4 5 6 7 8 9 10\n")
    assert meter.stop().others_cores == pytest.approx(0.0)
    meter.start()
    clock.now = 0.2
    write_stat(tmp_path, 100, 1, 1038, 0)
    (tmp_path / "stat").write_text("cpu  5051 0 0 9000 0 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\ncpu1 1 2 3 4 5 6 7 8 9 10\n")
    assert meter.stop().others_cores == pytest.approx((0.29 - 0.19 - 0.03) / 0.1)  # 10 ticks more: another ran


def test_windows_sum_to_a_time_weighted_quiet_or_noisy_line():
    quiet = [{"seconds": 9.0, "others_cores": 0.0, "load_average": 1.0, "noisy": False, "busy_limit": 0.3},
             {"seconds": 1.0, "others_cores": 0.2, "load_average": 1.2, "noisy": False, "busy_limit": 0.3}]
    summary = LoadSummary.of(quiet)
    assert summary.quiet and summary.mean_cores == pytest.approx(0.02) and summary.peak_cores == 0.2
    assert summary.line() == ("QUIET: other processes used 0.02 cores on average (peak 0.20 over one timed run) during 2 timed "
                              "runs, load average up to 1.20")
    noisy = quiet + [{"seconds": 10.0, "others_cores": 1.1, "load_average": 3.0, "noisy": True, "busy_limit": 0.3}]
    assert LoadSummary.of(noisy).line().startswith("NOISY (1 of 3 timed runs above 0.3 cores): other processes used 0.56 cores")
    assert LoadSummary.of([{"seconds": 1.0}]) is None and load_line([{"seconds": 1.0}]) == ""  # records from before the accounting


def record(config: str, noisy: bool, cores: float) -> dict:
    return {"question_id": 1, "category": "qa", "turn": 0, "repeat": 0, "config": config, "key": config, "gamma": 4,
            "n": 3, "storage": "basic", "filler": 3, "params": None, "new_tokens": 8, "seconds": 1.0, "drafted": 0,
            "accepted": 0, "target_passes": 8, "diverged_at": None, "divergence": None, "others_cores": cores,
            "load_average": 1.0, "noisy": noisy, "busy_limit": 0.3}


def test_the_report_names_noisy_rows_and_strict_refuses_them():
    records = [record("target", False, 0.01), record("pld", True, 0.9)]
    rows = summarize(records)
    report = markdown(rows, "title", load_line(records))
    assert report.split("\n")[2].startswith("NOISY (1 of 2 timed runs above 0.3 cores)")
    assert "| pld (noisy: 1/1 runs) |" in report and "| target |" in report
    check_strict(records, strict=False)
    with pytest.raises(SystemExit, match=r"--strict: 1 of 2 timed runs were noisy: other processes used more than 0.3 cores "
                                         r"\(first: pld on question 1, 0.90 cores\)"):
        check_strict(records, strict=True)
    check_strict([record("target", False, 0.01)], strict=True)


def test_the_busy_flag_takes_cores_and_refuses_anything_else(capsys):
    from app.bench.cli import build_parser

    assert build_parser().parse_args(["--busy", "0.5"]).busy == 0.5
    for bad in ("-1", "nan", "lots"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--busy", bad])
        assert "--busy takes a number of cores from 0 to 1024" in capsys.readouterr().err


def test_cpu_flags_name_the_vector_extensions_that_decide_kernels(tmp_path):
    (tmp_path / "cpuinfo").write_text("processor: 0\nflags\t\t: fpu sse avx avx2 fma avx512f avx512bw\n")
    assert cpu_flags(tmp_path) == "avx2 avx512f"
    assert cpu_flags(tmp_path / "absent") == ""
