"""The CPU figures' command (``scripts/cpu_figures.py``) and the prompt-pass script it runs work on the
embedded model after the one-copy release (a smoke run: tiny sizes, no figure read)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_prompt_pass_script_runs_on_the_c_step_and_on_the_models_own_linears_in_one_process():
    """Every many-row variant, chunks of 16 and 256, the torch forward, the linears alone, beside the FMA peak."""
    done = subprocess.run([sys.executable, "scripts/prompt_pass.py", "--rounds", "1", "--lengths", "70", "--context", "80",
                           "--tiles", "all", "--chunks", "16", "256"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "prompt pass of 70 positions, C step, tile 12x2 (decoding's), chunks of 16: " in out and "torch, own (MKL)" in out
    assert "float32 FMA peak " in out and "% of the peak)" in out and out.count("linears alone, tile ") >= 3


def test_the_cpu_line_names_the_vector_extensions_and_the_openvino_row_says_why_it_is_skipped(monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts"))
    import cpu_figures

    assert "cores" in cpu_figures.cpu_line()
    monkeypatch.delenv("OV_WORK", raising=False)
    skipped = {heading: why for heading, _, why in cpu_figures.commands(smoke=False)}
    assert skipped["target AR against OpenVINO GenAI"].startswith("OV_WORK is not") and not skipped["the prompt pass and a long context"]
