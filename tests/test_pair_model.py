"""Speculative decoding on the real drafter pair (Qwen2.5-Coder-1.5B-Instruct with its 0.5B sibling),
when it is installed (make fetch-pair); skipped otherwise. CI stays on tiny models and the embedded one."""
import pytest

from utils import pair

pytestmark = [pytest.mark.pair,
              pytest.mark.skipif(not pair.installed(), reason=f"the real drafter pair is not installed ({pair.INSTALL_HINT})")]

LENGTH = 16
# a code edit the pair's drafter mostly gets right (its 0.5B sibling of the same family)
REQUEST = "Rename the variable `x` to `total` and return the whole function.\n\ndef add_all(values):\n    x = 0\n" \
          "    for value in values:\n        x += value\n    return x"


def test_the_repl_starts_on_the_pair_with_speculative_decoding_and_names_its_dtype():
    """``--preset pair``'s start on the real pair: the target's dtype measured (``--dtype auto``) and named on
    its line, the drafter's dtype by its rule, the rows run, the speculative row writing target AR's text (greedy,
    under the dtype and kernels this start chose: a code edit, drafts accepted). It also stands for greedy
    speculative decoding on the real pair through the public functions, a test of its own until 2026-11-30 (its
    own load of the pair took 35 s of the suite; the functions are the REPL's, and are tested on the other models).
    ``--prepack on`` gives the kernels: where the dtype measured float32, a start with ``--prepack auto``
    measured both float32 models' kernels too (about 200 of this test's 240 s in the suite's run at fdb2079).
    The kernel measurement itself is covered on the embedded and tiny models (``test_repl_target_line``,
    ``test_startup_measurements``); the dtype measurement compares the same kernels under either flag
    (``prepack`` is in its key either way)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "infer.py", "--preset", "pair", "--no-calibrate", "--prepack", "on", "--length", str(LENGTH),
                             "--prompt", REQUEST, "--verbose"], cwd=root, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Measuring the target's dtype" in result.stdout + result.stderr, result.stderr[-2000:]  # measured, not given
    assert "'s kernels (" not in result.stdout + result.stderr, result.stderr[-2000:]  # no kernel measurement: minutes on the pair
    target_line = next(line for line in result.stdout.splitlines() if line.startswith("Target:"))
    # the dtype's reason: measured, or float32 where a busy machine spent the budget before two rounds were
    # timed (measure.pass_dtype.choose's fallback; this test failed on it once at load 6, before this line accepted it)
    assert "by measurement:" in target_line or "float32 (fallback: " in target_line, target_line
    assert ("torch.bfloat16" in target_line) == ("bfloat16 by measurement" in target_line), target_line
    # a float32 target's drafter races its own dtypes (app.drafter_dtype.measures); a bfloat16 target's drafts in bfloat16
    assert ("Measuring the drafter's dtype" in result.stderr) == ("torch.bfloat16" not in target_line), result.stderr[-2000:]
    assert "torch.bfloat16" in target_line or "prepacked linears" in target_line, target_line  # float32: the kernels given
    assert "Speculative" in result.stdout, result.stdout[-2000:]
    assert "\r" not in result.stdout + result.stderr, (result.stdout + result.stderr)[-2000:]  # no progress bar off a terminal
    # greedy: the speculative row writes what target AR writes, under the dtype and kernels this start chose
    outs, rates, row, out = {}, {}, None, None
    for line in result.stdout.splitlines():
        if line.startswith("─"):
            row = line.strip("─ ").split(" (")[0]  # "Speculative (gamma auto)": the row's name
        elif line.startswith("Out:") and row is not None and row not in outs:
            out = outs[row] = [line]  # the row's text, to its figures' line (an edit spans lines)
        elif " tokens/s · " in line and row is not None:
            out = None
            if " · acceptance " in line:
                rates.setdefault(row, float(line.split(" · acceptance ")[1].split()[0]))
        elif out is not None:
            out.append(line)
    outs = {name: "\n".join(lines) for name, lines in outs.items()}
    assert outs.get("Speculative") == outs.get("Target AR") and "total" in outs["Target AR"], result.stdout[-2000:]
    assert rates.get("Speculative", 0) > 0, result.stdout[-2000:]  # a real drafter of the same family: drafts accepted
