"""``tests/worker_times.py``'s summary of a parallel run: each worker's end and the idle tail between the
workers, each file's span on its worker, longest first; reports of one process (no worker) add nothing."""
from types import SimpleNamespace

from worker_times import WorkerTimes


def report(worker, nodeid, start, stop):
    node = None if worker is None else SimpleNamespace(gateway=SimpleNamespace(id=worker))
    return SimpleNamespace(node=node, nodeid=nodeid, start=start, stop=stop, duration=stop - start)


def test_the_summary_gives_each_workers_end_the_idle_tail_and_the_files_longest_first():
    times = WorkerTimes()
    for args in (("gw0", "tests/test_a.py::test_one", 100.0, 110.0), ("gw0", "tests/test_a.py::test_two", 110.0, 130.0),
                 ("gw1", "tests/test_b.py::test_one", 101.0, 105.0), ("gw1", "tests/test_c.py::test_one", 105.0, 170.0),
                 ("gw0", "tests/test_d.py::test_one", 130.0, 140.0), (None, "tests/test_e.py::test_one", 0.0, 500.0)):
        times.record(report(*args))
    lines = times.lines()
    assert lines[0] == "gw0: 2 files, tests 40 s, done at 40 s (last: test_d.py)"
    assert lines[1] == "gw1: 2 files, tests 69 s, done at 70 s (last: test_c.py)"
    assert lines[2] == "idle tail: 30 s between the first worker done and the last"
    assert [line.split()[-1] for line in lines[3:]] == ["test_c.py", "test_a.py", "test_d.py", "test_b.py"]
    assert lines[3].split()[:4] == ["65.0", "s", "gw1", "5-70"]
    assert times.lines(longest=1)[3:] == lines[3:4]


def test_a_run_in_one_process_prints_nothing():
    times = WorkerTimes()
    times.record(report(None, "tests/test_a.py::test_one", 0.0, 1.0))
    assert times.lines() == []
