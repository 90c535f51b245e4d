"""The start-up, traced: it reads as a walk down the floors (app -> measure -> runners, utils), not
back and forth (docs/layout.md). Issue 41's target: the trace from ``app/pair.py``'s ``load_pair`` and
``app/session.py``'s ``build_settings`` enters each project file at most twice.

How the trace is read (``sys.settrace``'s "call" event, every Python call while the start-up runs; no line
events, and none for returns or C calls, which ``sys.setprofile`` would also send it: the same calls, fewer hook calls):

* a *project frame* is one whose code is in a project file (this repository, without ``tests/``
  and ``.venv``); module bodies run by an import are left out (what was imported earlier depends on
  the tests that ran before);
* at each call into a project file F, its *route* is the list of project files on the call stack,
  outermost first, ending with F, consecutive frames of one file taken as one: ``app/pair.py >
  measure/entry.py > measure/steps.py > measure/timing.py`` is the way the start-up came down to a
  timed pass;
* F's *entries* are the distinct routes that reach it. A loop that calls F the same way a thousand
  times is one entry (the trace reads the same whether a measurement times 10 passes or 1000, for the
  target and then for the drafter); F reached from two files, or called back from below (a route that
  holds F twice: ``a.py > b.py > a.py``), is entered again;
* a call from a file of the ground floor (``kernels/``, ``models/``, ``runners/``, ``utils/``) into another is the ground
  floor's own business (a model pass goes through ``runners/eager.py``, ``static.py``, and back),
  not a step of the start-up's walk, and is not counted.

The start-up runs whole and from nothing saved on tiny float32 models (so the kernels are measured
too), with a drafter, ``--dtype auto`` measured from the target's folder, every measurement cut short
at its first check (a fake clock: the fallbacks' paths), then again with results saved (the reuse
path) and with real passes timed on a quiet start (``--remeasure``)."""
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
GROUND = ("kernels", "models", "runners", "utils")  # kernels/: what runners/ held of its kernels, the same floor
MOST = 2  # entries a file may have


class Trace:
    """The routes by which each project file (under ``root``) was entered while ``run`` ran."""

    def __init__(self, root: Path = ROOT):
        self.root = root
        self.routes: Dict[str, Set[Tuple[str, ...]]] = defaultdict(set)
        self._files: Dict[object, str | None] = {}

    def file(self, code) -> str | None:
        """``code``'s file relative to ``root`` when it is project code (no module body), else None."""
        if code not in self._files:
            path = Path(code.co_filename).resolve() if code.co_filename.startswith("/") else None
            project = code.co_name != "<module>" and path is not None and path.is_relative_to(self.root)
            name = str(path.relative_to(self.root)) if project else None
            self._files[code] = None if name is None or name.split("/")[0] in ("tests", ".venv") else name
        return self._files[code]

    def __call__(self, frame, event, arg) -> None:
        if event != "call":
            return
        callee = self.file(frame.f_code)
        if callee is None:
            return
        stack: List[str] = []
        outer = frame.f_back
        while outer is not None:
            found = self.file(outer.f_code)
            if found is not None and (not stack or stack[-1] != found):
                stack.append(found)
            outer = outer.f_back
        caller = stack[0] if stack else None
        if caller == callee or (caller is not None and caller.split("/")[0] in GROUND and callee.split("/")[0] in GROUND):
            return
        self.routes[callee].add(tuple(reversed(stack)) + (callee,))

    def run(self, function, *args, **kwargs):
        previous = sys.gettrace()
        sys.settrace(self)
        try:
            return function(*args, **kwargs)
        finally:
            sys.settrace(previous)

    def entries(self) -> Dict[str, int]:
        return {name: len(routes) for name, routes in self.routes.items()}


def slow_clock(step: float = 10.0):
    now = [0.0]

    def clock() -> float:
        now[0] += step
        return now[0]

    return clock


def start(trace: Trace, models: Dict[str, str], clock=None, remeasure: bool = False):
    """``load_pair`` then ``build_settings``, as the REPL runs them, traced."""
    from app.pair import LoadOptions, load_pair
    from app.session import build_settings

    say = lambda text, style="": None  # noqa: E731
    options = LoadOptions("cpu", cache="auto", measure_dtype=True, remeasure=remeasure)
    pair = trace.run(load_pair, models["target"], models["drafter"], options, say=say)
    return pair, trace.run(build_settings, pair, "greedy", "auto", 8, say=say)


@pytest.fixture
def quiet_measurements(monkeypatch, tmp_path):
    """A private cache folder, an idle machine, no lines on stderr; the returned function sets the
    clock of every budget (None: the real one)."""
    from dataclasses import replace

    from app import pair

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr("measure.busy_note", lambda: "")
    clock, options = [None], pair.measure_options
    monkeypatch.setattr(pair, "measure_options", lambda *a, **k: replace(options(*a, **k), say=lambda text: None,
                                                                          **({"clock": clock[0]} if clock[0] else {})))
    return lambda chosen: clock.__setitem__(0, chosen)


def test_the_start_up_walks_down_the_floors_and_enters_each_file_at_most_twice(tiny_models, quiet_measurements, monkeypatch):
    from measure import timing

    cut, reused, measured = Trace(), Trace(), Trace()
    quiet_measurements(slow_clock())
    pair, (config, _) = start(cut, tiny_models)  # nothing saved: every measurement starts, past its budget at once
    assert pair.measured.target.kernels.line == "the model's own linears (fallback: measurement over its 10 s budget)"
    assert config.policy.calibration.startswith("Verification costs not measured (fallback")
    monkeypatch.setattr(timing.PassTimer, "seconds", lambda self, rows: 0.010 + 0.001 * rows)  # deterministic passes
    quiet_measurements(None)
    pair, (config, _) = start(measured, tiny_models, remeasure=True)  # a quiet start measures it all again, saved
    assert config.policy.row_costs is not None and pair.measured.target.kernels.source == "measured"
    pair, (config, _) = start(reused, tiny_models)  # and the next start reuses it
    assert pair.measured.target.kernels.source == "remembered" and pair.measured.costs.draft_cost.source == "remembered"
    for trace in (cut, measured, reused):
        assert "measure/entry.py" in trace.routes and ("measure/timing.py" in trace.routes) == (trace is not reused)
        over = {name: sorted(" > ".join(r) for r in trace.routes[name]) for name, n in trace.entries().items() if n > MOST}
        assert not over, over
        back = [route for routes in trace.routes.values() for route in routes if len(set(route)) < len(route)]
        assert not back, back  # no file called back from below


def test_the_trace_counts_routes_not_calls(tmp_path, monkeypatch):
    """The reading itself, on two files of its own: a loop is one entry, a call back from below another."""
    (tmp_path / "up.py").write_text("import down\n\ndef walk():\n    for _ in range(5):\n        down.step()\n"
                                    "    down.call_back()\n\ndef helper():\n    return 1\n")
    (tmp_path / "down.py").write_text("import up\n\ndef step():\n    return 2\n\ndef call_back():\n    return up.helper()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import up

    trace = Trace(tmp_path)
    trace.run(up.walk)
    assert trace.entries() == {"up.py": 2, "down.py": 1}  # up.py > down.py > up.py: entered again from below
    assert trace.routes["up.py"] == {("up.py",), ("up.py", "down.py", "up.py")}
