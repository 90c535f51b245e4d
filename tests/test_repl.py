"""The REPL driven as a user would: a real subprocess on a pseudo-terminal or a pipe."""
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pexpect

import pytest
import torch

from conftest import MEASUREMENTS_ENV, llama, save_tiny

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


@pytest.fixture(scope="module")
def repl(tiny_models):
    child = spawn("--target", tiny_models["target"], "--drafter", tiny_models["drafter"], "--row-costs", GIVEN_COSTS)
    yield child
    child.close(force=True)


def test_commands_change_settings_and_help_shows_them(repl):
    command(repl, "/gamma 6", "gamma: 6")
    command(repl, "/length 12", "length: 12")
    command(repl, "/processor topk 0.7 20", "processor: topk temperature=0.7 top_k=20")
    command(repl, "/set_ngramstorage onelevel 4", "n-gram storage: onelevel 4")
    command(repl, "/top_k_filler 1", "top_k_filler: 1")
    command(repl, "/reset_in_between", "reset in between: off")
    command(repl, "/cache", "cache: off")
    command(repl, "/debug", "debug: on")
    command(repl, "/chat", "chat: off")
    command(repl, "/drafter", "Drafter AR: on")
    command(repl, "/target", "Target AR: off")
    command(repl, "/ngram", "N-gram assisted: off")
    command(repl, "/speculative", "Speculative: off")
    command(repl, "/pld", "Prompt lookup: off")
    command(repl, "/chained", "Chained n-gram\\+drafter: on")
    command(repl, "/pld_params 2 4 7", "n-grams 2 to 4, 7 tokens")
    command(repl, "/adaptive", "adaptive draft length: on")
    command(repl, "/min_draft 2", "min_draft: 2")
    command(repl, "/p_min 0.25", "p_min: 0.25")
    command(repl, "/pause 3 5", "after 3 fruitless steps, for 5 steps")
    command(repl, "/stream", "stream: on")
    command(repl, "/min_gain 1.4", "min_gain: 1.4")
    shown = command(repl, "/help", "Anything else is a prompt")
    for expected in ("[6]", "[12]", "[topk temperature=0.7 top_k=20]", "[onelevel 4]", "[2 4 7]", "[0.25]", "[3 5]"):
        assert expected in shown
    assert "Versions: torch 2." in shown and "· transformers " in shown  # what this session's figures are measured with
    # back to the defaults for the other tests
    for line in ("/gamma 4", "/length 35", "/processor greedy", "/set_ngramstorage basic 3", "/top_k_filler 3",
                 "/reset_in_between", "/cache", "/debug", "/chat", "/drafter", "/target", "/ngram", "/speculative", "/pld",
                 "/chained", "/pld_params 1 3 10", "/adaptive", "/min_draft 0", "/p_min 0", "/pause 0 8", "/stream", "/min_gain 0"):
        command(repl, line, r"\S")


BAD_INPUT = [
    ("/gamma", "usage: /gamma"), ("/gamma x", "usage: /gamma"), ("/gamma 0", "must be >= 1"), ("/length -3", "must be >= 1"),
    ("/length", "usage: /length"), ("/processor", "usage: /processor"), ("/processor beam 1", "unknown processor"),
    ("/processor topk 0.5", "usage: /processor topk"), ("/processor nucleus 0.5 0.9 3", "usage: /processor nucleus"),
    ("/processor multinomial 0", r"temperature must be in \[0.001, 1000\]"), ("/processor nucleus 1 1.5", r"top_p must be in \(0, 1\]"),
    ("/processor topk 1 zero", "usage: /processor topk"), ("/set_ngramstorage basic 1", "must be >= 2"),
    ("/set_ngramstorage trie 3", "usage: /set_ngramstorage"), ("/set_ngramstorage basic", "usage: /set_ngramstorage"),
    ("/top_k_filler 0", "must be >= 1"), ("/frobnicate", "unknown command"), ("/cache now", "usage: /cache"),
    ("/pld_params 3 2 5", "usage: /pld_params"), ("/pld_params 1 x 5", "usage: /pld_params"), ("/pld_params 1 2", "usage: /pld_params"),
    ("/p_min 1", "usage: /p_min"), ("/p_min", "usage: /p_min"), ("/p_min high", "usage: /p_min"), ("/min_draft -1", "must be >= 0"),
    ("/pause 1", "usage: /pause"), ("/pause 1 0", "must be >= 1"), ("/ngram_load /nonexistent.json", "cannot read"),
    ("/ngram_load infer.py", "not a valid n-gram storage file"), ("/ngram_save", "usage: /ngram_save"),
    ("/ngram_build /nonexistent.txt", "cannot read the corpus"), ("/stream on", "usage: /stream"), ("/min_gain -1", "usage: /min_gain"), ("/min_gain x", "usage: /min_gain"),
    ("/quit now", "/quit takes no argument"), ("/gamma 1e999", "gamma must be an integer"), ("/min_gain inf", "usage: /min_gain"),
    ("/length 99999999999999999999", "length must be >= 1 and <= 1000000"), ("/p_min nan", "usage: /p_min"),
]


def test_every_malformed_command_prints_usage_and_changes_nothing(repl):
    before = command(repl, "/help", "Anything else is a prompt")
    for line, expected in BAD_INPUT:
        out = command(repl, line, expected)
        assert "Traceback" not in out
    after = command(repl, "/help", "Anything else is a prompt")
    assert after == before


def test_prompt_produces_every_enabled_section_and_the_table(repl):
    command(repl, "/drafter", "Drafter AR: on")
    repl.sendline("Hello there")
    for section in ("Speculative", "N-gram assisted", "Target AR", "Drafter AR"):
        repl.expect(section)
        repl.expect("tokens/s")
    repl.expect("speedup")
    repl.expect(PROMPT)
    table = repl.before
    assert "1.00x" in table  # target AR against itself
    command(repl, "/drafter", "Drafter AR: off")


def _table_rows(text: str) -> dict:
    """strategy -> (tokens, accept, tok/step) from the comparison table (times left out)."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 7 and cells[1].isdigit():
            rows[cells[0]] = (cells[1], cells[5], cells[6])
    return rows


def _compare(repl, prompt: str, title: str = "speedup") -> str:
    """Send a prompt; returns the comparison table (title, rows, policy caption)."""
    repl.sendline(prompt)
    repl.expect(title)
    text = repl.after
    repl.expect("policy:")
    text += repl.before + repl.after
    repl.expect(PROMPT)
    return text + repl.before


def test_gamma_is_a_bound_and_auto_a_choice_named_in_the_table(repl):
    command(repl, "/gamma 2", r"at most 2 drafts per step")
    _compare(repl, "Hello there", title="gamma <= 2")
    command(repl, "/gamma auto", "gamma: auto")
    assert "[auto]" in command(repl, "/help", "Anything else is a prompt")
    _compare(repl, "Hello there", title="gamma auto")
    command(repl, "/gamma 4", r"at most 4 drafts per step")


def test_a_prompt_gives_the_same_result_whatever_ran_before(repl):
    """The policy keeps nothing between prompts unless /memory is on: same tokens, acceptance, tokens per step."""
    command(repl, "/length 20", "length: 20")
    first = _table_rows(_compare(repl, "Repeat after me: one two three one two three"))
    _compare(repl, "Write something unexpected about zebras")
    again = _table_rows(_compare(repl, "Repeat after me: one two three one two three"))
    assert first and first == again
    command(repl, "/memory", "policy memory: on")
    assert "memory on" in command(repl, "/stats", "policy:")
    command(repl, "/memory", "policy memory: off")
    command(repl, "/length 35", "length: 35")


def test_strategies_drafting_from_the_storage_each_start_from_it_as_it_was_before_the_prompt(repl):
    """Chained drafting reads nothing that n-gram assisted decoding learned from the same prompt."""
    text = "Repeat after me: one two three one two three"
    command(repl, "/chained", "Chained n-gram\\+drafter: on")
    command(repl, "/length 20", "length: 20")
    with_ngram = _table_rows(_compare(repl, text))["Chained n-gram+drafter"]
    command(repl, "/ngram", "N-gram assisted: off")
    alone = _table_rows(_compare(repl, text))["Chained n-gram+drafter"]
    command(repl, "/ngram", "N-gram assisted: on")
    command(repl, "/chained", "Chained n-gram\\+drafter: off")
    command(repl, "/length 35", "length: 35")
    assert with_ngram == alone


def test_debug_view_shows_speculative_steps(repl):
    command(repl, "/debug", "debug: on")
    command(repl, "/length 6", "length: 6")
    repl.sendline("Hi")
    repl.expect("Speculative step")
    repl.expect("speedup")
    repl.expect(PROMPT)
    command(repl, "/debug", "debug: off")
    command(repl, "/length 35", "length: 35")


def test_debug_view_and_stream_never_share_a_line(repl):
    command(repl, "/debug", "debug: on")
    command(repl, "/stream", "stream: on")
    command(repl, "/length 8", "length: 8")
    repl.sendline("Hi there")
    repl.expect("speedup")
    shown = repl.before
    repl.expect(PROMPT)
    command(repl, "/stream", "stream: off")
    command(repl, "/debug", "debug: off")
    command(repl, "/length 35", "length: 35")
    headers = [line for line in shown.replace("\r", "").splitlines() if "Speculative step" in line]
    assert headers and all(line.startswith("Speculative step") for line in headers)
    assert all(" proposed, " in line or "no drafts" in line for line in headers)


def test_ctrl_c_stops_the_generation_and_the_repl_goes_on(repl):
    command(repl, "/length 3000", "length: 3000")
    command(repl, "/cache", "cache: off")  # slow enough to be interrupted
    repl.sendline("Tell me a long story")
    time.sleep(3)
    repl.sendintr()
    repl.expect("interrupted")
    repl.expect(PROMPT)
    command(repl, "/cache", "cache: on")
    command(repl, "/length 35", "length: 35")


def test_ctrl_d_exits_with_status_zero(tiny_models):
    child = spawn("--target", tiny_models["target"])
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_quit_exits_with_status_zero(tiny_models):
    child = spawn("--target", tiny_models["target"])
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def run(*args, stdin: str = ""):
    return subprocess.run([sys.executable, "infer.py", "--device", "cpu", *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(Path.home()), **MEASUREMENTS_ENV})


def test_piped_prompt_runs_and_exits_at_end_of_input(tiny_models):
    result = run("--target", tiny_models["target"], stdin="/length 5\nHello\n")
    assert result.returncode == 0, result.stderr
    assert "Target AR" in result.stdout and "N-gram assisted" in result.stdout and "Goodbye" in result.stdout


def test_prompt_flag_runs_one_comparison(tiny_models):
    result = run("--target", tiny_models["target"], "--drafter", tiny_models["drafter"], "--prompt", "Hi", "--length", "4")
    assert result.returncode == 0, result.stderr
    assert "Speculative" in result.stdout and "speedup" in result.stdout


def test_start_up_measures_verification_costs_unless_told_not_to(tiny_models):
    measured = run("--target", tiny_models["target"], "--prompt", "Hi", "--length", "4", "--verbose")
    skipped = run("--target", tiny_models["target"], "--prompt", "Hi", "--length", "4", "--no-calibrate", "--verbose")
    assert measured.returncode == 0 and skipped.returncode == 0, measured.stderr + skipped.stderr
    # that a measurement is made and shown, never what the clock said (a busy machine can make it implausible)
    assert "Verification cost" in measured.stdout
    assert "Verification cost" not in skipped.stdout and "Target AR" in skipped.stdout
    given = run("--target", tiny_models["target"], "--prompt", "Hi", "--length", "4", "--row-costs", "1,1.2,1.1", "--verbose")
    assert given.returncode == 0 and "Verification cost by positions 1..3: 1.00 1.20 1.10 (given, not measured)" in given.stdout
    refused = run("--target", tiny_models["target"], "--prompt", "Hi", "--row-costs", "1,9")
    assert refused.returncode == 1 and "--row-costs" in refused.stdout and "not plausible" in refused.stdout


def test_speculative_without_drafter_says_how_to_get_one(tiny_models):
    result = run("--target", tiny_models["target"], stdin="/speculative\n/drafter\n")
    assert result.stdout.count("restart with --drafter MODEL") == 2 and result.returncode == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "/nonexistent/model"], "could not load the target"),
        (["--drafter", "/nonexistent/model.gguf"], "could not load the drafter"),
        (["--gamma", "0"], "--gamma must be >= 1"),
        (["--processor", "nucleus 1 7"], "top_p must be in"),
    ],
)
def test_bad_start_up_is_one_clear_line_and_non_zero_exit(tiny_models, args, message):
    result = run("--target", tiny_models["target"], *args)
    assert result.returncode == 1
    assert message in result.stdout and "Traceback" not in result.stdout + result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="refuses only where this torch has no CUDA device")
def test_device_cuda_without_cuda_is_one_line_naming_what_to_install(tiny_models):
    """Not transformers' "AssertionError: Torch not compiled with CUDA enabled" inside a load error."""
    result = run("--target", tiny_models["target"], "--device", "cuda", "--prompt", "Hi")
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("error:"))
    assert "--device cuda" in line and ("has no CUDA" in line or "sees no CUDA device" in line) and "AssertionError" not in line


def test_drafter_with_another_vocabulary_is_refused(tiny_models):
    result = run("--target", tiny_models["target"], "--drafter", tiny_models["other"])
    assert result.returncode == 1 and "cannot draft for this target" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_embedded_model_smoke():
    result = run("--prompt", "What is 2+2?", "--length", "8")
    assert result.returncode == 0, result.stderr
    assert "Target AR" in result.stdout and "SmolLM2-135M-Instruct" in result.stdout
    # a newcomer's first screen: the model, device and dtype, what runs its passes; the measurement under --verbose
    assert target_line(result).startswith("Target: SmolLM2-135M-Instruct") and " · cpu float32 · " in target_line(result)
    assert len(target_line(result)) < 120 and "kernels by measurement" not in result.stdout


def target_line(result) -> str:
    return next(line for line in result.stdout.splitlines() if line.startswith("Target:"))


def test_prepacking_is_measured_by_default_or_the_flags_choice_and_named_on_the_target_line(tiny_models):
    """On the tiny float32 Llama, one token a run: the choice and its line do not depend on the model's size."""
    common = ("--target", tiny_models["target"], "--prompt", "Hi", "--length", "1", "--no-calibrate", "--verbose")
    auto, on, off = run(*common), run(*common, "--prepack", "on"), run(*common, "--prepack", "off")
    assert auto.returncode == 0 and on.returncode == 0 and off.returncode == 0, auto.stderr + on.stderr + off.stderr
    # measured, or (a busy machine) fallen back past its budget: either way named, saved or not
    # a Llama's eager passes run the lean forward (runners.lean), and the line says so
    assert re.search(r"· eager · lean Llama forward \(attention: (SDPA\)|the step's own, row by row\) on the C step \(.*\)) · (kernels by measurement: a one-position pass [0-9.]+ ms own, [0-9.]+ ms prepacked(, [0-9.]+ ms skinny)?; "
                     r"every pass on (prepacked|own|skinny|.* at [0-9]+\+ positions) \(costs"
                     r"|the model's own linears \(fallback: measurement over its [0-9.]+ s budget)", target_line(auto))
    assert target_line(on).endswith("· eager · lean Llama forward (attention: SDPA) · prepacked linears")
    assert target_line(off).endswith("· eager · lean Llama forward (attention: SDPA)")


@pytest.mark.needs_cxx
def test_compile_compiles_once_at_start_up_says_how_long_and_names_the_runner(tiny_models):
    result = run("--target", tiny_models["target"], "--compile", "--no-calibrate", "--prompt", "Hi", "--length", "6", "--verbose")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("Compiled the target in") == 1
    assert re.search(r"compiled \(inductor, frozen weights, (GEMM templates autotuned against MKL|MKL), passes of 1/2/4/8/16/32 positions, cache of 2048 positions, "
                     r"compiled in \d+ s \((fresh|cached|partly cached)\)\)", target_line(result))
    assert "Target AR" in result.stdout and "N-gram assisted" in result.stdout


def test_a_drafter_made_of_the_targets_first_layers_drafts_in_the_repl(tiny_models, tmp_path):
    deep = save_tiny(tmp_path / "deep", llama(vocab=49152, window=4096, layers=3))  # tiny_models' target, three layers
    result = run("--target", deep, "--drafter", "layers:2", "--no-calibrate", "--prompt", "Hi", "--length", "6")
    assert result.returncode == 0, result.stderr
    assert "first 2 layers of the target" in result.stdout and "Speculative" in result.stdout
    refused = run("--target", tiny_models["target"], "--drafter", "layers:1", "--no-calibrate", "--prompt", "Hi")
    assert refused.returncode == 1 and "a drafter needs fewer layers than the target" in refused.stdout


def test_quantized_target_loads_and_runs(tiny_models):
    result = run("--target", tiny_models["target"], "--quantize", "int8", "--prompt", "Hi", "--length", "4")
    assert result.returncode == 0, result.stderr
    assert "int8 weights" in target_line(result) and "Target AR" in result.stdout


def test_encoder_decoder_models_are_detected_and_use_the_encoder_decoder_functions(tiny_models):
    result = run("--target", tiny_models["t5"], "--drafter", tiny_models["t5_drafter"], "--no-chat", "--length", "6",
                 stdin="/ngram\nTranslate this\n")
    assert result.returncode == 0, result.stderr
    assert "decoder-only models only" in result.stdout
    assert "Speculative" in result.stdout and "Target AR" in result.stdout
    assert "N-gram assisted ─" not in result.stdout  # no section for it


MODEL_LINES = ("Target:", "Drafter:", "Head:")


def test_the_first_screen_is_one_short_line_per_model_and_stats_shows_the_start_up_in_full(tiny_models):
    """By default each model is one line under 120 characters, and no measurement is printed before the
    prompt; /stats prints the start-up in full: each model's whole line and the verification costs."""
    result = run("--target", tiny_models["target"], "--drafter", tiny_models["drafter"], "--row-costs", GIVEN_COSTS, stdin="/stats\n")
    assert result.returncode == 0, result.stderr
    screen, stats = result.stdout.split("Type a prompt", 1)
    lines = [line for line in screen.splitlines() if line.startswith(MODEL_LINES)]
    assert [line.split(":")[0] for line in lines] == ["Target", "Drafter", "Head"], screen
    assert all(len(line) < 120 for line in lines), lines
    assert "Verification cost" not in screen and "KV cache" not in screen
    full = stats.split("Start-up, in full:", 1)[1]
    assert "Verification cost by positions 1..12: 1.00 1.10" in full and "Policy: " in full
    assert next(line for line in full.splitlines() if line.startswith("Target:")).count(" · ") > lines[0].count(" · ")


def test_stats_and_stream_show_the_last_prompt(repl):
    command(repl, "/stream", "stream: on")
    command(repl, "/length 8", "length: 8")
    repl.sendline("Hello")
    repl.expect("speedup")
    repl.expect(PROMPT)
    out = command(repl, "/stats", "Statistics of the last prompt")
    repl.sendline("/stats")
    repl.expect("acceptance by draft position")
    repl.expect("policy chose: drafted in")  # the automatic choice is named, with what it chose from
    repl.expect(PROMPT)
    assert "target passes" in out and "drafted" in out
    command(repl, "/stream", "stream: off")
    command(repl, "/length 35", "length: 35")


def test_ngram_storage_can_be_built_saved_and_loaded(repl, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog.\n")
    command(repl, f"/ngram_build {corpus}", "static n-gram tier")
    command(repl, f"/ngram_save {tmp_path / 'own.json'}", "saved to")
    command(repl, f"/ngram_load {tmp_path / 'own.json'}", "static n-gram tier")
    assert (tmp_path / "own.json").stat().st_size > 0
    shown = command(repl, "/help", "Anything else is a prompt")
    assert "[static tier loaded]" in shown
