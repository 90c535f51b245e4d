"""The README's promises: its two commands are the Makefile's and CI's, its session is a real REPL
transcript, and the Python first steps (docs/python.md, which the README points to) run as written."""
import re
import subprocess
import sys
from pathlib import Path

from conftest import MEASUREMENTS_ENV

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FIRST_STEPS = ROOT / "docs" / "python.md"


def section(path: Path, heading: str) -> str:
    """The text of ``path`` under ``## heading``, up to the next ``## `` heading."""
    text = path.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : None if end < 0 else end]


def test_the_readme_gives_the_two_commands_and_ci_runs_the_test_one():
    commands = re.findall(r"^make (\w+)", section(README, "The two commands"), flags=re.M)
    assert commands == ["run", "test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run: .*\n\t\$\(BIN\)/python infer\.py", makefile, flags=re.M)
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == "make test"


def test_the_readme_session_is_the_repl_on_the_embedded_model():
    """Its command line is infer.py's, and what it printed has the REPL's shape: the models' lines, a
    section per strategy and the table, then the exit."""
    session = re.search(r"```text\n\$ (.*?)\n(.*?)```", section(README, "A session"), flags=re.S)
    assert session and "infer.py" in session.group(1)
    out = session.group(2)
    for expected in ("Speculative Decoding", "Target: SmolLM2-135M-Instruct", "Drafter: ", "Type a prompt", "Target AR",
                     "speedup over target AR", "Goodbye!"):
        assert expected in out, expected
    assert len(README.read_text(encoding="utf-8").splitlines()) < 120  # a newcomer's page; the rest is in docs/


# choose_kernels' measurement in the first steps times passes over 1-4 positions in one round, not 1-12 in three:
# the blocks run as written on the kernels it chooses (greedy exact, asserted in them); the embedded model's
# measurement at the programs' 1-12 positions and 3 rounds is test_repl_startup's smoke (its first start). 25 of
# this test's ~30 s were that measurement (2026-11-30, noisy)
SHORT_MEASUREMENT = ("import functools, measure.choose\n"
                     "measure.choose.measure_kernels = functools.partial(measure.choose.measure_kernels, max_rows=4, repeats=1)\n")


def test_the_python_first_steps_run_as_written(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", section(FIRST_STEPS, "First steps"), flags=re.S)
    assert blocks and "choose_kernels(model)" in blocks[0]
    script = tmp_path / "examples.py"
    script.write_text(SHORT_MEASUREMENT + "\n".join(blocks))
    result = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), **MEASUREMENTS_ENV, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-2000:]
