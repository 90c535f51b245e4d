"""Where a run's wall time went, per worker and per test file: hooks ``tests/conftest.py`` takes in.

Under pytest-xdist (``make test``), the controller sees every test's report with the worker that ran it
and the clock readings of each phase (``report.start``, ``report.stop``: seconds since the epoch). At the
end it prints, per worker, its files, the seconds its tests took (setup, call and teardown) and when it
finished, counted from the run's first report, so that an idle tail (one worker done, the other still on
its last files) shows as the gap between the two; then each file's span on its worker, longest first:
what ``HEAVY_FIRST``'s order is read from. In one process it prints nothing (no report names a worker)."""
from collections import defaultdict
from typing import Dict, List, Tuple

LONGEST = 40  # the files listed; the rest are short enough not to decide the order


class WorkerTimes:
    """Each (worker, file)'s first start, last stop and summed phase seconds, from the reports."""

    def __init__(self):
        self.spans: Dict[Tuple[str, str], List[float]] = {}
        self.origin = float("inf")  # the run's first report's start

    def record(self, report) -> None:
        node = getattr(report, "node", None)  # set by xdist on the controller only
        start, stop = getattr(report, "start", None), getattr(report, "stop", None)
        if node is None or start is None or stop is None:
            return
        file = report.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
        span = self.spans.setdefault((node.gateway.id, file), [start, stop, 0.0])
        span[0], span[1], span[2] = min(span[0], start), max(span[1], stop), span[2] + report.duration
        self.origin = min(self.origin, start)

    def lines(self, longest: int = LONGEST) -> List[str]:
        """The summary: one line per worker, the idle tail, then the ``longest`` files' spans."""
        if not self.spans:
            return []
        workers: Dict[str, List[Tuple[str, List[float]]]] = defaultdict(list)
        for (worker, file), span in self.spans.items():
            workers[worker].append((file, span))
        found, ends = [], {}
        for worker, files in sorted(workers.items()):
            last_file, last = max(files, key=lambda item: item[1][1])
            ends[worker] = last[1] - self.origin
            busy = sum(span[2] for _, span in files)
            found.append(f"{worker}: {len(files)} files, tests {busy:.0f} s, done at {ends[worker]:.0f} s (last: {last_file})")
        if len(ends) > 1:
            found.append(f"idle tail: {max(ends.values()) - min(ends.values()):.0f} s between the first worker done and the last")
        spans = sorted(self.spans.items(), key=lambda item: item[1][1] - item[1][0], reverse=True)[:longest]
        found += [f"{stop - start:8.1f} s  {worker}  {start - self.origin:6.0f}-{stop - self.origin:.0f}  {file}"
                  for (worker, file), (start, stop, _) in spans]
        return found


_RUN = WorkerTimes()


def pytest_runtest_logreport(report) -> None:
    _RUN.record(report)


def pytest_terminal_summary(terminalreporter) -> None:
    found = _RUN.lines()
    if found:
        terminalreporter.write_sep("=", "time per worker and per test file (wall seconds from the first test)")
        for line in found:
            terminalreporter.write_line(line)
