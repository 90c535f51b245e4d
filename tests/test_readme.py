"""The README's Python examples run as written (from the repository root)."""
import re
import subprocess
import sys
from pathlib import Path

from conftest import MEASUREMENTS_ENV

ROOT = Path(__file__).resolve().parents[1]


def test_readme_python_examples_run_as_written(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert blocks
    script = tmp_path / "examples.py"
    script.write_text("\n".join(blocks))
    result = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), **MEASUREMENTS_ENV, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-2000:]
