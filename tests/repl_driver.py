"""What the REPL's tests share (tests/test_repl_session.py, tests/test_repl_startup.py,
tests/test_repl_target_line.py and the REPL tests of other files): ``infer.py`` as a real subprocess, on a
pseudo-terminal (``spawn``, ``command``) or a pipe (``run``), and the Target line it prints."""
import signal
import subprocess
import sys
from pathlib import Path

import pexpect

from conftest import MEASUREMENTS_ENV

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "\n> "  # the REPL prompt at the start of a line (usage lines contain "<n> ")


def _sigint_ignored():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def spawn(*args):
    """The REPL on a pseudo-terminal, started with SIGINT ignored, as a script's background job (or a
    test runner started with ``&``) starts it: Ctrl-C at its terminal must interrupt all the same."""
    child = pexpect.spawn(sys.executable, ["infer.py", "--device", "cpu", *args], cwd=str(ROOT), encoding="utf-8",
                          timeout=120, dimensions=(60, 200), preexec_fn=_sigint_ignored,
                          env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(Path.home()), **MEASUREMENTS_ENV,
                               "TERM": "xterm", "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"})
    child.expect("Type a prompt")
    child.expect(PROMPT)
    return child


def command(child, line: str, expected: str):
    """Send a line, wait for ``expected`` and the next prompt; returns everything printed."""
    child.sendline(line)
    child.expect(expected)
    text = child.before + child.after
    child.expect(PROMPT)
    return text + child.before


GIVEN_COSTS = "1,1.1,1.15,1.2,1.3,1.4,1.5,1.6,1.7,1.8,1.9,2.0"  # /gamma auto must not depend on a busy machine's measurement


def run(*args, stdin: str = ""):
    return subprocess.run([sys.executable, "infer.py", "--device", "cpu", *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(Path.home()), **MEASUREMENTS_ENV})


def target_line(result) -> str:
    return next(line for line in result.stdout.splitlines() if line.startswith("Target:"))
