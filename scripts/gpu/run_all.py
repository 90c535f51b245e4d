"""The prepared GPU run (issues 50 and 65; docs/gpu.md, "The prepared run"): in ONE call on a fresh GPU
machine, set up from what the calls before it staged (``scripts/gpu/carry.py``: the wheels, the embedded
GGUF in parts and the gpt-fast-style probe), then run the comparison phase by phase within a time
budget, and leave under --out: ``summary.md`` (the machine, each phase's command, seconds, status and
report), ``results.tar.gz`` (every phase's folder: results.md, summary.csv, runs.jsonl, plots, its
output) and ``run_all.log``. Both are rewritten after every phase, so a call stopped at its limit still
returns what was done. Phases run one after the other, never two at once (each is timed alone).

The phases, in this order; one that the budget no longer holds is skipped, and the summary says so
(``--phases`` runs the rest in a second call):

    step-bench       scripts/gpu/step_bench.py: our compiled step's target AR against transformers' compiled
                     static-cache generate, float32 and bfloat16 (graphs built, greedy tokens compared)
    probe            the gpt-fast-style probe (shared/tools/cuda-step-probe/step.py, carried), same model, same
                     dtypes, width 1, a cache of 512: the step we measure ourselves against
    repl-fresh       infer.py --prompt (one comparison, every default row, the shipped head) from an empty
                     project cache: GGUF conversion, the step's first graphs, the rows' graphs; wall seconds
    repl-next        the same again: the next start, on what the first one kept
    bench-bfloat16   bench.py on the compiled step (the default on CUDA): target AR, NASD, prompt lookup,
                     suffix, the EAGLE-3 head's chains, and transformers' compiled static-cache generate
    bench-float32    the same in float32
    step-bench-whole step-bench with the step compiled whole (--graphs whole, the other option: each pass
                     compiled as one graph with inductor's CUDA graphs), from an empty cache: compile time and speed
    family-bench     scripts/gpu/family_bench.py (issue 72): each family at a published config, random weights, the
                     compiled step against transformers' compiled static-cache generate, bfloat16; alone:
                     --phases family-bench (on CPU: --tiny)

On the GPU machine (the last call; ``run_all.sh`` stages and calls this):

    python3 scripts/gpu/run_all.py --stage /tmp/specdec-stage --out $OUT

Smoke test, on any machine, in the environment it runs in (nothing staged), tiny sizes; on CPU the rows
ask for the step by name (``--forward step``: inductor's default mode):

    .venv/bin/python scripts/gpu/run_all.py --smoke --device cpu --out /tmp/specdec-smoke
"""
import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from carry import assemble  # noqa: E402

PROMPTS = ("bench_prompts.jsonl", "prompts/code_editing.jsonl")
BENCH_ROWS = "target,ngram,pld,suffix,eagle,hf_generate_static"
PROBE = "cuda_step_probe.py"  # the probe, as carry.py stages it
REPL_PROMPT = ("Summarize in one sentence: The quick brown fox jumps over the lazy dog. The dog does not react, "
               "and the fox runs away into the forest.")


@dataclass(frozen=True)
class Sizes:
    """How much each phase runs: the benchmark's prompts and lengths, and the host-overhead model's."""

    categories: str
    limit: int
    new_tokens: int
    repeats: int
    layers: int  # host-overhead's tiny model
    host_tokens: int
    host_repeats: int


FULL = Sizes("summarization,coding,code_editing,qa,writing", 1, 64, 2, 30, 256, 5)  # docs/gpu.md's runs
SMOKE = Sizes("qa", 1, 8, 1, 2, 16, 1)


@dataclass(frozen=True)
class Phase:
    """One step: its commands (``python`` arguments from the repository root; more than one run at
    once), the seconds below which it is not started, the most it may take (0: what is left), and
    why it is skipped where it is."""

    name: str
    commands: Tuple[Tuple[str, ...], ...]
    floor: int
    skip: str = ""  # a reason to skip it on this run, or ""
    cap: int = 0
    env: Tuple[Tuple[str, str], ...] = ()  # variables set for its commands


def bench(device: str, sizes: Sizes, dtype: str, rows: str, out: Path, step: bool) -> Tuple[str, ...]:
    """A ``bench.py`` command line: the embedded model, greedy, the basic n-gram storage; ``step``: the
    compiled step asked for by name (CPU; on CUDA it is the default)."""
    argv = ["bench.py", "--device", device, "--dtype", dtype, "--prompts", *PROMPTS, "--categories", sizes.categories,
            "--limit", str(sizes.limit), "--max-new-tokens", str(sizes.new_tokens), "--repeats", str(sizes.repeats),
            "--storages", "basic", "--strategies", rows, "--out", str(out)]
    return tuple(argv + (["--forward", "step"] if step else []))


def probe_path(stage: Optional[Path]) -> Optional[Path]:
    """The probe: staged by carry.py, else beside this checkout (``../shared/tools/``), else None."""
    for path in ([stage / PROBE] if stage else []) + [ROOT.parent / "shared" / "tools" / "cuda-step-probe" / "step.py"]:
        if path.is_file():
            return path
    return None


def phases(device: str, sizes: Sizes, work: Path, stage: Optional[Path] = None) -> List[Phase]:
    """Every phase, in the order they run."""
    cuda = device.startswith("cuda")
    step = () if cuda else ("--forward", "step")
    tokens, repeats = (str(256), str(3)) if sizes is FULL else (str(sizes.new_tokens), "1")
    probe = probe_path(stage)
    fresh = (("SPECDEC_CACHE", str(work / "repl-cache")),)
    repl = ("infer.py", "--device", device, "--prompt", REPL_PROMPT, "--length", "32" if sizes is FULL else "8", "--verbose", *step)
    cap = (lambda seconds: seconds) if sizes is FULL else (lambda seconds: 0)  # a smoke run on CPU compiles slowly: no caps
    return [
        Phase("step-bench", (("scripts/gpu/step_bench.py", "--device", device, "--tokens", tokens, "--repeats", repeats,
                              *(() if cuda else ("--dtypes", "float32"))),), 150, cap=cap(260)),
        Phase("probe", ((str(probe or PROBE), "--device", device, "--dtypes", "float32,bfloat16" if cuda else "float32",
                         "--new", tokens, "--widths", "1", "--max", "512", "--no-hf", *(() if cuda else ("--no-compile",))),), 100,
              "" if probe else "the probe is neither staged nor beside this checkout", cap=cap(200)),
        Phase("repl-fresh", (repl,), 90, cap=cap(180), env=fresh),
        Phase("repl-next", (repl,), 40, cap=cap(90), env=fresh),
        Phase("bench-bfloat16", (bench(device, sizes, "bfloat16", BENCH_ROWS, work / "bench-bfloat16", bool(step)),), 120),
        Phase("bench-float32", (bench(device, sizes, "float32", BENCH_ROWS, work / "bench-float32", bool(step)),), 120),
        Phase("step-bench-whole", (("scripts/gpu/step_bench.py", "--device", device, "--tokens", tokens, "--repeats", repeats,
                                    "--graphs", "whole", *(() if cuda else ("--dtypes", "float32"))),), 150, cap=cap(260),
              env=(("SPECDEC_CACHE", str(work / "whole-cache")),)),
        Phase("family-bench", (("scripts/gpu/family_bench.py", "--device", device, "--tokens", tokens, "--repeats", repeats,
                                *(() if cuda else ("--tiny", "--dtypes", "float32"))),), 200),
    ]


def run_phase(phase: Phase, work: Path, env: Dict[str, str], seconds: float) -> Tuple[str, float]:
    """Run the phase's commands at once, each with its output in ``work/<name>[-i].out``/``.err``; stop
    them all at ``seconds``. Returns its status ("done", "failed (exit N)", "stopped at the budget") and wall time."""
    start, procs = time.monotonic(), []
    env = {**env, **dict(phase.env)}
    for i, command in enumerate(phase.commands):
        stem = work / (phase.name if len(phase.commands) == 1 else f"{phase.name}-{i + 1}")
        with open(f"{stem}.out", "w") as out, open(f"{stem}.err", "w") as err:
            procs.append(subprocess.Popen([sys.executable, *command], cwd=ROOT, env=env, stdout=out, stderr=err, start_new_session=True))
    codes: List[Optional[int]] = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, seconds - (time.monotonic() - start))))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    wall = time.monotonic() - start
    if any(code is None for code in codes):
        return f"stopped at the budget after {wall:.0f} s", wall
    bad = [code for code in codes if code != 0]
    return ("done" if not bad else f"failed (exit {bad[0]})"), wall


def error_tail(text: str, lines: int = 15) -> List[str]:
    """The last ``lines`` of a process's stderr, Python's warnings (and the source line each quotes) left out."""
    kept, after_warning = [], False
    for line in text.splitlines():
        if "Warning" in line:
            after_warning = True
        elif not (after_warning and line.startswith("  ")):
            kept.append(line)
            after_warning = False
    return kept[-lines:]


def phase_report(phase: Phase, work: Path, finished: bool) -> str:
    """What the phase wrote: each benchmark's results.md, each script's output; the end of its
    errors when it did not finish."""
    parts = []
    for i, command in enumerate(phase.commands):
        stem = work / (phase.name if len(phase.commands) == 1 else f"{phase.name}-{i + 1}")
        out = Path(command[command.index("--out") + 1]) if "--out" in command else None
        if out is not None and (out / "results.md").is_file() and not phase.name.startswith("warm"):
            parts.append((out / "results.md").read_text())
        elif Path(f"{stem}.out").is_file() and not phase.name.startswith("warm"):
            parts.append("    " + "\n    ".join(Path(f"{stem}.out").read_text().splitlines()[-60:]))
        err = Path(f"{stem}.err")
        if not finished and err.is_file():
            parts.append(f"{err.name}, last lines:\n\n    " + "\n    ".join(error_tail(err.read_text())))
    return "\n\n".join(parts)


def machine(env: Dict[str, str], device: str) -> str:
    """One line on the software and the device, read in the environment the phases get."""
    probe = ("import sys, torch, transformers; d = sys.argv[1]; "
             "name = torch.cuda.get_device_name(0) if d.startswith('cuda') and torch.cuda.is_available() else 'no CUDA device'; "
             "print(f'Python {sys.version.split()[0]} · torch {torch.__version__} · transformers {transformers.__version__} · "
             "{name} · {torch.get_num_threads()} threads')")
    done = subprocess.run([sys.executable, "-c", probe, device], cwd=ROOT, env=env, capture_output=True, text=True)
    return done.stdout.strip() or f"(the probe failed: {done.stderr.strip().splitlines()[-1:] or ['no output']})"


def set_up(stage: Optional[Path], env: Dict[str, str]) -> str:
    """The environment the phases run in: with ``stage``, the carried GGUF joined and the carried wheels
    installed into a site folder first on ``PYTHONPATH``, and the project's cache in /tmp; returns the
    revision the carried files were packed at ("" without a stage)."""
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    if stage is None:
        return ""
    site = Path("/tmp/specdec-site")
    manifest = assemble(stage, site)
    env["PYTHONPATH"] = os.pathsep.join([str(site)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("SPECDEC_CACHE", "/tmp/specdec-cache")
    return manifest.get("revision", "")


def write_out(out: Path, work: Path, summary: List[str]) -> None:
    """``summary.md`` and ``results.tar.gz`` (the work folder) under ``out``, replaced whole."""
    (out / "summary.md").write_text("\n".join(summary) + "\n")
    partial = out / "results.tar.gz.partial"
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(work, arcname="results")
    partial.replace(out / "results.tar.gz")


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="where summary.md, results.tar.gz and run_all.log go ($OUT on the GPU machine)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--stage", help="the folder the calls staged (carry.py's files); none: the environment this runs in")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (1 prompt, 8 tokens, 1 repeat, 2 layers): proves the script, measures nothing")
    p.add_argument("--budget", type=float, help="seconds for everything, set-up included (default 540; 7200 with --smoke)")
    p.add_argument("--phases", help="comma-separated phase names to run (default: all)")
    return p.parse_args(argv)


def main() -> None:
    args = parse()
    deadline = time.monotonic() + (args.budget or (7200 if args.smoke else 540))
    env = dict(os.environ)
    revision = set_up(Path(args.stage) if args.stage else None, env) or "this checkout"
    about = machine(env, args.device)
    if args.device.startswith("cuda") and "no CUDA device" in about:
        raise SystemExit(f"error: --device {args.device}, but {about}")
    out, work = Path(args.out), Path(tempfile.mkdtemp(prefix="specdec-work-"))  # $OUT takes a few files: the rest goes in the archive
    out.mkdir(parents=True, exist_ok=True)
    summary = [f"# The prepared run{' (smoke: tiny sizes, no figure)' if args.smoke else ''}", "",
               f"{about} · revision {revision} · {'SMOKE' if args.smoke else 'FULL'} sizes", ""]
    wanted = set(args.phases.split(",")) if args.phases else None
    with open(out / "run_all.log", "w") as log:
        for phase in phases(args.device, SMOKE if args.smoke else FULL, work, Path(args.stage) if args.stage else None):
            left = deadline - time.monotonic() - 15  # room to pack
            skip = "not asked for (--phases)" if wanted is not None and phase.name not in wanted else phase.skip
            skip = skip or (f"{left:.0f} s left, under its floor of {phase.floor} s" if left < phase.floor else "")
            status, wall = (f"skipped: {skip}", 0.0) if skip else run_phase(phase, work, env, min(left, phase.cap or left))
            line = f"{phase.name}: {status}" + (f" ({wall:.0f} s)" if wall else "")
            print(line, file=log, flush=True)
            print(line, file=sys.stderr, flush=True)
            commands = "\n".join(f"    {Path(sys.executable).name} " + " ".join(c) for c in phase.commands)
            summary += [f"## {phase.name}: {status}" + (f", {wall:.0f} s" if wall else ""), "", commands, ""]
            if not skip:
                summary += [phase_report(phase, work, status == "done"), ""]
            write_out(out, work, summary)


if __name__ == "__main__":
    main()
