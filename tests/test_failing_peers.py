"""Peers that fail. The OpenVINO worker's client (``peers_openvino.Worker``) against fake workers (small scripts: no OpenVINO):
a worker that hangs, dies or answers garbage costs one line, is killed and dropped, and the next call starts
a fresh one; in the benchmark a failing peer row is a failed row with its reason, and the other rows go on."""
import dataclasses
import json
import sys
import threading
from pathlib import Path

import pytest

import bench
import peers_openvino
import strategies

REQUEST = {"op": "generate", "prompt": [1, 2], "max_new_tokens": 2}
SCRIPTS = {
    "hangs": "import sys, time\nsys.stdin.readline()\ntime.sleep(120)\n",
    "garbage": "import sys\nsys.stdin.readline()\nprint('Segmentation fault (core dumped)', flush=True)\nsys.stdin.readline()\n",
    "exits": "import sys\nsys.exit(3)\n",
    # dies at its first request on its first start only; answers afterwards
    "dies_once": ("import json, sys\nfrom pathlib import Path\ncount = Path(__file__).with_suffix('.count')\n"
                  "starts = int(count.read_text()) + 1 if count.exists() else 1\ncount.write_text(str(starts))\n"
                  "for line in sys.stdin:\n    if starts == 1:\n        sys.exit(3)\n"
                  "    print(json.dumps({'tokens': [7, 8], 'steps': [1, 1]}), flush=True)\n"),
    # answers its first request (the warm-up's), dies at its second
    "answers_once": ("import json, sys\nfor i, line in enumerate(sys.stdin):\n    if i == 1:\n        sys.exit(3)\n"
                     "    print(json.dumps({'tokens': [7, 8], 'steps': [1, 1]}), flush=True)\n"),
}


def fake(tmp_path: Path, monkeypatch, behaviour: str) -> Path:
    script = tmp_path / f"{behaviour}.py"
    script.write_text(SCRIPTS[behaviour])
    monkeypatch.setattr(peers_openvino, "WORKER", script)
    return script


def start(tmp_path: Path, monkeypatch, behaviour: str, timeout: float = 30.0) -> "peers_openvino.Worker":
    fake(tmp_path, monkeypatch, behaviour)
    monkeypatch.setattr(peers_openvino, "TIMEOUT", timeout, raising=False)
    return peers_openvino.Worker(tmp_path, 1, python=Path(sys.executable))


def one_line_error(worker: "peers_openvino.Worker") -> str:
    """The worker's answer to ``REQUEST``, asked in a thread so that a hang fails the test instead of hanging it."""
    outcome = {}

    def ask():
        try:
            outcome["answer"] = worker.ask(REQUEST)
        except Exception as error:  # noqa: BLE001: the test reads which
            outcome["error"] = error
    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(30)
    try:
        assert not thread.is_alive(), "ask() hung on a hung worker"
    finally:
        if worker.process.poll() is None:
            worker.process.kill()
    error = outcome.get("error")
    assert isinstance(error, RuntimeError) and "\n" not in str(error), repr(error)
    return str(error)


def test_a_hung_worker_is_answered_in_one_line_and_killed(tmp_path, monkeypatch):
    worker = start(tmp_path, monkeypatch, "hangs", timeout=0.5)
    assert "no answer within 0.5 s" in one_line_error(worker)
    assert worker.process.poll() is not None  # killed, not left running


def test_a_worker_that_died_after_the_poll_is_answered_in_one_line(tmp_path, monkeypatch):
    """Dead between ``poll()`` and the write: the write's ``BrokenPipeError`` is the promised one line."""
    worker = start(tmp_path, monkeypatch, "exits")
    worker.process.wait()
    monkeypatch.setattr(worker.process, "poll", lambda: None)  # the moment before it was seen dead
    assert "the OpenVINO worker ended" in one_line_error(worker)


def test_a_worker_answering_garbage_is_answered_in_one_line_and_killed(tmp_path, monkeypatch):
    worker = start(tmp_path, monkeypatch, "garbage")
    assert "not a JSON answer: 'Segmentation fault (core dumped)'" in one_line_error(worker)
    assert worker.process.poll() is not None


def test_a_dead_worker_is_dropped_and_the_next_call_starts_a_fresh_one(tmp_path, monkeypatch):
    fake(tmp_path, monkeypatch, "dies_once")
    monkeypatch.setattr(peers_openvino, "unavailable", lambda args=None: "")
    monkeypatch.setattr(peers_openvino, "venv", lambda: Path(sys.executable).parent.parent)
    monkeypatch.setattr(peers_openvino, "_WORKERS", {})
    with pytest.raises(RuntimeError, match=r"^the OpenVINO worker ended \(exit status 3\)"):
        peers_openvino.worker(1).ask(REQUEST)
    assert 1 not in peers_openvino._WORKERS or peers_openvino._WORKERS[1].process.poll() is not None
    fresh = peers_openvino.worker(1)
    try:
        assert fresh.ask(REQUEST)["tokens"] == [7, 8]
    finally:
        fresh.close()


def benchmark_with_ov_plain(tiny_models, tmp_path: Path, monkeypatch, behaviour: str, repeats: int) -> list:
    """``bench.py`` on the tiny target with target, ov_plain (on the fake worker ``behaviour``) and pld; its runs.jsonl."""
    fake(tmp_path, monkeypatch, behaviour)
    monkeypatch.setattr(peers_openvino, "_WORKERS", {})
    monkeypatch.setattr(peers_openvino, "unavailable", lambda args=None: "")
    monkeypatch.setattr(peers_openvino, "venv", lambda: Path(sys.executable).parent.parent)
    monkeypatch.setitem(strategies.EVERY, "ov_plain", dataclasses.replace(strategies.EVERY["ov_plain"], unavailable=None))
    out = tmp_path / "results"
    bench.main(["--target", tiny_models["target"], "--device", "cpu", "--limit", "1", "--categories", "summarization",
                "--strategies", "target,ov_plain,pld", "--max-new-tokens", "4", "--repeats", str(repeats), "--out", str(out),
                "--no-calibrate"])
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def test_a_peer_row_failing_in_a_timed_run_is_a_failed_record_and_its_next_run_gets_a_fresh_worker(tiny_models, tmp_path, monkeypatch):
    records = benchmark_with_ov_plain(tiny_models, tmp_path, monkeypatch, "answers_once", repeats=2)
    ov = sorted((r["repeat"], bool(r.get("failed"))) for r in records if r["key"] == "ov_plain")
    assert ov == [(0, True), (1, False)]  # the warm-up's worker died at repeat 0; repeat 1 started another
    assert sorted((r["key"], r["repeat"]) for r in records if r["key"] != "ov_plain") == [("pld", 0), ("pld", 1), ("target", 0), ("target", 1)]


def test_a_failing_peer_row_is_reported_failed_and_the_benchmark_goes_on(tiny_models, tmp_path, monkeypatch):
    """ov_plain's worker dies at every request: its rows are failed rows, with the reason; target and pld run and report."""
    records = benchmark_with_ov_plain(tiny_models, tmp_path, monkeypatch, "exits", repeats=1)
    out = tmp_path / "results"
    assert {r["key"] for r in records if not r.get("failed")} == {"target", "pld"}
    failed = [r for r in records if r.get("failed")]
    assert failed and {r["key"] for r in failed} == {"ov_plain"} and all("OpenVINO worker ended" in r["failed"] for r in failed)
    report = (out / "results.md").read_text()
    assert "## failed rows" in report and "OpenVINO worker ended" in report.split("## failed rows")[1]


def test_our_row_failing_lets_the_others_report_then_exits_with_status_1(tiny_models, tmp_path, monkeypatch):
    """A failure of one of our rows is a bug of ours: the benchmark still reports every other row, then exits 1
    naming it (a peer's failure is the peer's: reported, status 0 unless --strict)."""
    run = bench.Bench.run

    def pld_fails(self, config, prompt, observer=None, repeat=0):
        if config.key == "pld" and repeat == 1:
            raise ValueError("a bug in pld\nits traceback's second line")
        return run(self, config, prompt, observer, repeat)
    monkeypatch.setattr(bench.Bench, "run", pld_fails)
    with pytest.raises(SystemExit, match=r"^error: 1 run\(s\) of our rows failed \(first: pld on question .*: "
                                         r"ValueError: a bug in pld\)$"):
        benchmark_with_ov_plain(tiny_models, tmp_path, monkeypatch, "answers_once", repeats=2)
    records = [json.loads(line) for line in (tmp_path / "results" / "runs.jsonl").read_text().splitlines()]
    assert sorted((r["key"], r["repeat"], bool(r.get("failed"))) for r in records if r["key"] != "ov_plain") == [
        ("pld", 0, False), ("pld", 1, True), ("target", 0, False), ("target", 1, False)]
    assert "## failed rows" in (tmp_path / "results" / "results.md").read_text()


def test_a_failing_llama_bench_is_a_line_of_its_section_not_the_end_of_the_benchmark(tmp_path):
    """``--llama-cpp``'s peer runs after the timed runs, before the reports: a llama-bench that fails is said in its section."""
    from types import SimpleNamespace

    from app.bench.llama_cpp import llama_cpp_report

    failing = tmp_path / "llama-bench"
    failing.write_text("#!/bin/sh\necho 'error: unknown model architecture' >&2\nexit 1\n")
    failing.chmod(0o755)
    ours = SimpleNamespace(run=lambda config, prompt: SimpleNamespace(tokens_per_second=10.0))
    args = SimpleNamespace(gguf=str(failing), threads=1, repeats=1, llama_cpp=str(failing), max_new_tokens=4)
    section = llama_cpp_report(ours, args, [1, 2, 3])
    assert "## llama.cpp" in section and "failed" in section and "unknown model architecture" in section
