"""The start-up, through ``infer.py`` on a pipe: the first screen, the verification costs it measures or
is given, the embedded model, and a bad start-up refused in one clear line (the tiny models' starts
forked from one Python: ``repl_driver.run_forked``; the embedded model's a fresh ``python infer.py``)."""
import pytest
import torch

from repl_driver import GIVEN_COSTS, run, run_forked, target_line


def test_start_up_measures_verification_costs_unless_told_not_to(started):
    measured, skipped, given, refused = (started[name] for name in ("measured", "skipped", "given", "implausible"))
    assert measured.returncode == 0 and skipped.returncode == 0, measured.stderr + skipped.stderr
    # that a measurement is made and shown, never what the clock said (a busy machine can make it implausible)
    assert "Verification cost" in measured.stdout
    assert "Verification cost" not in skipped.stdout and "Target AR" in skipped.stdout
    assert given.returncode == 0 and "Verification cost by positions 1..3: 1.00 1.20 1.10 (given, not measured)" in given.stdout
    assert refused.returncode == 1 and "--row-costs" in refused.stdout and "not plausible" in refused.stdout


BAD_START_UPS = [
    (["--target", "/nonexistent/model"], "could not load the target"),
    (["--drafter", "/nonexistent/model.gguf"], "could not load the drafter"),
    (["--gamma", "0"], "--gamma must be >= 1"),
    (["--processor", "nucleus 1 7"], "top_p must be in"),
]
NO_CUDA = not torch.cuda.is_available()


@pytest.fixture(scope="module")
def started(tiny_models):
    """The start-ups of this file on the tiny models, each in a process of its own forked from one Python
    that imported the libraries once (``repl_driver.run_forked``), by name: the costs measured, skipped,
    given and implausible; the bad ones by index, then "vocabulary", "cuda" (where this torch has no
    CUDA device) and "screen" (target, drafter, given costs, then /stats)."""
    common = ["--target", tiny_models["target"], "--prompt", "Hi", "--length", "4"]
    named = {"measured": [*common, "--verbose"], "skipped": [*common, "--no-calibrate", "--verbose"],
             "given": [*common, "--row-costs", "1,1.2,1.1", "--verbose"],
             "implausible": ["--target", tiny_models["target"], "--prompt", "Hi", "--row-costs", "1,9"]}
    named.update({index: ["--target", tiny_models["target"], *args] for index, (args, _) in enumerate(BAD_START_UPS)})
    named["vocabulary"] = ["--target", tiny_models["target"], "--drafter", tiny_models["other"]]
    if NO_CUDA:
        named["cuda"] = ["--target", tiny_models["target"], "--device", "cuda", "--prompt", "Hi"]
    named["screen"] = ["--target", tiny_models["target"], "--drafter", tiny_models["drafter"], "--row-costs", GIVEN_COSTS]
    stdins = ["/stats\n" if name == "screen" else "" for name in named]
    return dict(zip(named, run_forked(list(named.values()), stdins)))


@pytest.mark.parametrize("case", range(len(BAD_START_UPS)), ids=lambda i: f"args{i}-{BAD_START_UPS[i][1]}")
def test_bad_start_up_is_one_clear_line_and_non_zero_exit(started, case):
    result = started[case]
    assert result.returncode == 1
    assert BAD_START_UPS[case][1] in result.stdout and "Traceback" not in result.stdout + result.stderr


@pytest.mark.skipif(not NO_CUDA, reason="refuses only where this torch has no CUDA device")
def test_device_cuda_without_cuda_is_one_line_naming_what_to_install(started):
    """Not transformers' "AssertionError: Torch not compiled with CUDA enabled" inside a load error."""
    result = started["cuda"]
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("error:"))
    assert "--device cuda" in line and ("has no CUDA" in line or "sees no CUDA device" in line) and "AssertionError" not in line


def test_drafter_with_another_vocabulary_is_refused(started):
    result = started["vocabulary"]
    assert result.returncode == 1 and "cannot draft for this target" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_embedded_model_smoke():
    result = run("--prompt", "What is 2+2?", "--length", "8")
    assert result.returncode == 0, result.stderr
    assert "Target AR" in result.stdout and "SmolLM2-135M-Instruct" in result.stdout
    # a newcomer's first screen: the model, device and dtype, what runs its passes; the measurement under --verbose
    assert target_line(result).startswith("Target: SmolLM2-135M-Instruct") and " · cpu float32 · " in target_line(result)
    assert len(target_line(result)) < 120 and "kernels by measurement" not in result.stdout


MODEL_LINES = ("Target:", "Drafter:", "Head:")


def test_the_first_screen_is_one_short_line_per_model_and_stats_shows_the_start_up_in_full(started):
    """By default each model is one line under 120 characters, and no measurement is printed before the
    prompt; /stats prints the start-up in full: each model's whole line, the verification costs, the prefetch raced."""
    result = started["screen"]
    assert result.returncode == 0, result.stderr
    screen, stats = result.stdout.split("Type a prompt", 1)
    lines = [line for line in screen.splitlines() if line.startswith(MODEL_LINES)]
    assert [line.split(":")[0] for line in lines] == ["Target", "Drafter", "Head"], screen
    assert all(len(line) < 120 for line in lines), lines
    assert "Verification cost" not in screen and "KV cache" not in screen
    full = stats.split("Start-up, in full:", 1)[1]
    assert "Verification cost by positions 1..12: 1.00 1.10" in full and "Policy: " in full
    # the prefetch distance as the warm-up's first passes raced it (the Target line was written before: "untimed")
    assert "Prefetch" not in screen and "Prefetch: float32 weights " in full and " ms against " in full, full
    assert next(line for line in full.splitlines() if line.startswith("Target:")).count(" · ") > lines[0].count(" · ")
