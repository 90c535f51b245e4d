"""The prepared GPU run's parts that run anywhere (docs/gpu.md, "The prepared run"): what the calls
carry fits each call and joins back byte for byte, a part that never arrived is refused in one line,
every benchmark command it runs is one the benchmark accepts, a phase past its budget is stopped."""
import json
import random
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))

import carry  # noqa: E402
import run_all  # noqa: E402


def test_the_calls_each_fit_and_carry_the_wheels_whole_and_the_gguf_once_in_order():
    sizes = {Path("a.whl"): 14, Path("b.whl"): 3}
    calls = carry.plan_calls(sizes, 98, 45)
    assert [call.size(sizes) for call in calls] == [45, 45, 25]
    assert [f for call in calls for f in call.files] == list(sizes) and calls[0].files == list(sizes)
    ranges = [r for call in calls for r in call.ranges]
    assert ranges[0][0] == 0 and ranges[-1][1] == 98 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def test_a_file_larger_than_a_call_is_refused():
    with pytest.raises(ValueError):
        carry.plan_calls({Path("big.whl"): 50}, 10, 45)


def stage_all(out: Path, stage: Path) -> None:
    stage.mkdir()
    for call in sorted(out.glob("call*")):
        for path in call.iterdir():
            shutil.copy(path, stage / path.name)


def test_the_staged_parts_join_into_the_gguf_and_a_missing_part_is_refused_in_one_line(tmp_path):
    data = random.Random(0).randbytes(1000)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(data)
    calls = carry.plan_calls({}, len(data), 300)
    manifest = carry.write_calls(calls, gguf, tmp_path / "out")
    assert len(manifest["gguf"]["parts"]) == 4 and sorted(p.name for p in (tmp_path / "out").iterdir()) == ["call1", "call2", "call3", "call4"]
    stage_all(tmp_path / "out", tmp_path / "stage")
    carry.assemble(tmp_path / "stage", tmp_path / "site")
    assert (tmp_path / "site" / carry.PACKAGE / "model.gguf").read_bytes() == data
    (tmp_path / "stage" / "gguf.part02").unlink()
    with pytest.raises(SystemExit) as refused:
        carry.assemble(tmp_path / "stage", tmp_path / "site2")
    assert "gguf.part02" in str(refused.value) and "\n" not in str(refused.value)


def test_every_benchmark_and_repl_command_of_the_run_is_one_the_program_accepts(tmp_path):
    from app.bench.cli import build_parser
    from app.repl.cli import build_parser as repl_parser

    for device in ("cuda", "cpu"):
        for sizes in (run_all.FULL, run_all.SMOKE):
            for phase in run_all.phases(device, sizes, tmp_path):
                for command in phase.commands:
                    if command[0] == "bench.py":
                        args = build_parser().parse_args(list(command[1:]))
                        assert args.device == device and args.max_new_tokens == sizes.new_tokens
                        assert args.forward == ("auto" if device == "cuda" else "step")  # the step: CUDA's default, by name on CPU
                    if command[0] == "infer.py":
                        args = repl_parser().parse_args(list(command[1:]))
                        assert args.device == device and args.prompt and not args.eager
                        assert args.verbose  # the record keeps each model's line and the measurements in full


def test_the_run_measures_issue_65s_phases_in_order_each_alone_and_the_repl_twice_on_one_fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(run_all, "ROOT", tmp_path / "repo")  # no shared/ beside it
    names = [phase.name for phase in run_all.phases("cuda", run_all.FULL, tmp_path)]
    assert names == ["step-bench", "probe", "repl-fresh", "repl-next", "bench-bfloat16", "bench-float32", "step-bench-whole",
                     "family-bench"]
    phases = {phase.name: phase for phase in run_all.phases("cuda", run_all.FULL, tmp_path, tmp_path)}
    assert all(len(phase.commands) == 1 for phase in phases.values())  # never two timed at once
    assert phases["repl-fresh"].env == phases["repl-next"].env and "SPECDEC_CACHE" in dict(phases["repl-fresh"].env)
    assert not (tmp_path / run_all.PROBE).exists() and phases["probe"].skip  # staged nowhere here: skipped, with its reason
    (tmp_path / run_all.PROBE).write_text("")
    assert not run_all.phases("cuda", run_all.FULL, tmp_path, tmp_path)[1].skip


def test_a_phase_past_its_budget_is_stopped_and_a_failing_one_says_its_exit_status(tmp_path):
    both = run_all.Phase("both", (("-c", "import time; time.sleep(120)"), ("-c", "pass")), 0)
    status, _ = run_all.run_phase(both, tmp_path, {"PATH": "/usr/bin:/bin"}, 2)
    assert status.startswith("stopped at the budget")
    failing = run_all.Phase("failing", (("-c", "raise SystemExit(3)"),), 0)
    assert run_all.run_phase(failing, tmp_path, {"PATH": "/usr/bin:/bin"}, 60)[0] == "failed (exit 3)"


def test_the_family_bench_builds_each_published_shape_and_its_tiny_rehearsal_as_a_family_the_step_takes(tmp_path):
    """Issue 72's prepared CUDA run (``scripts/gpu/family_bench.py``): each published config (built on the
    meta device: no memory, no weights) is of a family the step takes, at its published parameter count
    (within 2%); so is each ``--tiny`` model; and the run's phase is a command the script accepts."""
    import torch

    import family_bench
    from models.layer_spec import family_name
    from runners import lean_unsupported

    published = {"qwen3-0.6b": ("Qwen3", 0.6e9), "gemma3-270m": ("Gemma 3", 0.27e9), "gemma3-1b": ("Gemma 3", 1.0e9),
                 "olmo2-1b": ("OLMo 2", 1.5e9), "smollm3-3b": ("SmolLM3", 3.1e9)}
    assert list(family_bench.SHAPES) == list(published)
    for name, (family, count) in published.items():
        shape, tiny = family_bench.build(name, False, torch.bfloat16, "meta"), family_bench.build(name, True, torch.float32, "cpu")
        for model in (shape, tiny):
            assert lean_unsupported(model) is None and family_name(model) == family, name
        assert abs(sum(p.numel() for p in shape.parameters()) / count - 1) < 0.02, name
    for device, sizes in (("cuda", run_all.FULL), ("cpu", run_all.SMOKE)):
        phase = next(p for p in run_all.phases(device, sizes, tmp_path) if p.name == "family-bench")
        args = family_bench.parser().parse_args(list(phase.commands[0][1:]))
        assert args.device == device and args.tiny == (device == "cpu") and args.shapes == ",".join(published)
