"""Every CPU figure of issue 66 on the machine it runs on, one script after the other (never two at once),
each under its own heading, after one line naming the CPU and the vector extensions it has:

- ``step_bound.py``: the C step's one-position pass against a read of its own weights (the memory bound),
  the linears alone, wider passes, target AR's tokens/s;
- ``prompt_pass.py``: the prompt pass at 210 and 769 positions (GFLOP/s beside the FMA peak, against the torch forward on
  MKL) and a one-position pass after 700 cached positions;
- ``head_cost.py``: the EAGLE-3 head's draft step against a target pass;
- ``anchor_ar.py``: target AR against OpenVINO GenAI on the same prompts, where its probe's folder
  (``$OV_WORK``) is set up, else skipped with the reason.

    ../shared/tools/quiet -- .venv/bin/python scripts/cpu_figures.py          # run alone: it is a timing
    .venv/bin/python scripts/cpu_figures.py --smoke                           # tiny sizes: proves the commands
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parents[1]
EXTENSIONS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


def cpu_line() -> str:
    """The CPU's model name and which of ``EXTENSIONS`` it has (from /proc/cpuinfo), and the core count."""
    name, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and name == "unknown CPU":
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    have = [e for e in EXTENSIONS if e in flags]
    return f"{name} · {os.cpu_count()} cores · {', '.join(have) or 'none of ' + ', '.join(EXTENSIONS)}"


def commands(smoke: bool) -> List[Tuple[str, List[str], str]]:
    """(heading, arguments after the interpreter, why it is skipped or "")."""
    ov = os.environ.get("OV_WORK")
    return [
        ("the step against the memory bound", ["scripts/step_bound.py"] + (["--rounds", "2", "--tokens", "8", "--context", "16"] if smoke else []), ""),
        ("the prompt pass and a long context", ["scripts/prompt_pass.py"] + (["--rounds", "1", "--lengths", "70", "--context", "80"] if smoke else []), ""),
        ("the head's draft step", ["scripts/head_cost.py"] + (["--context", "32", "--rounds", "3"] if smoke else []), ""),
        ("target AR against OpenVINO GenAI", ["scripts/anchor_ar.py"],
         "" if ov and Path(ov).is_dir() and not smoke else "OV_WORK is not an OpenVINO probe folder here (../shared/tools/openvino-anchor)"),
    ]


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: proves the commands, measures nothing")
    args = parser.parse_args(argv)
    print(f"# CPU figures · {cpu_line()}", flush=True)
    failed = 0
    for heading, command, skip in commands(args.smoke):
        print(f"\n## {heading}: {' '.join(command)}", flush=True)
        if skip:
            print(f"skipped: {skip}", flush=True)
            continue
        done = subprocess.run([sys.executable, *command], cwd=ROOT)
        if done.returncode:
            print(f"failed (exit {done.returncode})", flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
