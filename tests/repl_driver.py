"""What the REPL's tests share (tests/test_repl_session.py, tests/test_repl_startup.py,
tests/test_repl_target_line.py and the REPL tests of other files): ``infer.py`` as a real subprocess, on a
pseudo-terminal (``spawn``, ``command``) or a pipe (``run``; several starts forked from one Python that
imported the libraries once: ``run_forked``), and the Target line it prints."""
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


def spawn_env() -> dict:
    """The environment of a REPL on a pseudo-terminal: offline, the suite's measurements, no colour."""
    return {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(Path.home()), **MEASUREMENTS_ENV,
            "TERM": "xterm", "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}


def spawn(*args):
    """The REPL on a pseudo-terminal, started with SIGINT ignored, as a script's background job (or a
    test runner started with ``&``) starts it: Ctrl-C at its terminal must interrupt all the same."""
    child = pexpect.spawn(sys.executable, ["infer.py", "--device", "cpu", *args], cwd=str(ROOT), encoding="utf-8",
                          timeout=120, dimensions=(60, 200), preexec_fn=_sigint_ignored, env=spawn_env())
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


# One Python for a test's (or a module's) several start-ups: it imports what a start-up imports (torch,
# transformers, the app) a single time, then runs each case's ``infer.py`` in a fork of itself, one
# after the other, each a process of its own with its own stdin (a pipe), stdout, stderr and exit status.
# A fresh ``python infer.py`` costs seconds of imports; a refusal takes a fraction of one, a tiny
# model's run of a token or two not much more. A test of one start keeps ``run``'s fresh process.
_FORKED = r"""
import json, os, runpy, sys, tempfile, traceback
sys.path.insert(0, os.getcwd())
import torch, transformers, app.repl.cli  # noqa: F401 (imported once, before the forks)
# what a case's model load imports (transformers' modeling_utils pulls in torch.distributed, sympy,
# accelerate...: ~1,100 modules, ~3 s a case when each fork imported them again; the tiny models are Llamas)
import transformers.modeling_utils, transformers.models.llama.modeling_llama  # noqa: F401
setup, cases = json.load(sys.stdin)
exec(setup)  # the caller's changes to the imported modules (run_forked's setup), before every fork
found = []
for argv, given in cases:
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    read, write = os.pipe()  # its stdin: the case's input, then the end of it, as subprocess.run(input=...) gives it
    os.write(write, given.encode("utf-8", "surrogateescape")); os.close(write)  # its bytes as given (run_forked)
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the case: infer.py as `python infer.py ARGS` runs it
        os.dup2(read, 0); os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
        sys.argv, code = ["infer.py", *argv], 0
        try:
            runpy.run_path("infer.py", run_name="__main__")
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
            if isinstance(exit.code, str):
                print(exit.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
    os.close(read)
    status = os.waitpid(pid, 0)[1]
    out.seek(0); err.seek(0)
    found.append({"returncode": os.waitstatus_to_exitcode(status), "stdout": out.read().decode(errors="replace"),
                  "stderr": err.read().decode(errors="replace")})
print(json.dumps(found))
sys.stdout.flush()
os._exit(0)  # every case is done: no ~1 s of finalizing the modules imported (torch's, transformers')
"""


def run_forked(cases, stdins=None, setup: str = "") -> list:
    """``subprocess.CompletedProcess``-like results (``returncode``, ``stdout``, ``stderr``: text) of
    ``infer.py --device cpu ARGS`` for each ``ARGS`` in ``cases``, each in a process of its own forked
    from one Python that imported the start-up's libraries once, its stdin a pipe holding the matching
    text of ``stdins`` (default: nothing; bytes that are not UTF-8 as ``surrogateescape`` gives them), in ``run``'s
    environment: an argument's such bytes as Python's argv decodes them. ``setup``: Python run in that one
    Python before the forks (a module constant a test sets, as ``monkeypatch`` would in-process)."""
    import json
    from types import SimpleNamespace

    cases = [[["--device", "cpu", *args], given] for args, given in zip(cases, stdins or [""] * len(cases))]
    done = subprocess.run([sys.executable, "-c", _FORKED], cwd=ROOT, input=json.dumps([setup, cases]), capture_output=True, text=True,
                          timeout=600, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(Path.home()),
                                            **MEASUREMENTS_ENV})
    assert done.returncode == 0, done.stderr[-3000:]
    return [SimpleNamespace(**result) for result in json.loads(done.stdout.strip().splitlines()[-1])]
