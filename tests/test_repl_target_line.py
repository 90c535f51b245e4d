"""How the target's passes run, chosen at start-up (--prepack, --compile, --quantize) and named on the
Target line, through ``infer.py`` on a pipe."""
import re

import pytest

from repl_driver import run_forked, target_line


# the compiled start's pass width: one bucket that every pass here pads into (decoding's 1 position, verification's
# 2-5 with gamma <= 4), so one graph; each width costs ~9 s of compiling on this CPU (the default six: 56 s of the
# file's 62, single run) and every width is prepared by the same loop (runners.compiled.prepare), whose graphs,
# padding and several widths of one model test_compiled checks (2026-11-30: (1, 8) -> (8,), ~9 s)
WIDTHS = (8,)
CAPACITY = 1024  # the start's 1000 positions (LoadOptions.compile_length) + the widest pass, to a power of two (32: 2048)


@pytest.fixture(scope="module")
def starts(tiny_models):
    """The file's start-ups, forked from one Python that imported the libraries once (``repl_driver.run_forked``;
    one such Python for the file, not one for the eager starts and one for the compiled: ~4 s of imports):
    ``{"auto", "on", "off"}`` (``--prepack``), ``"int8"`` (``--quantize``), and ``"compile"`` where a C++ compiler
    is here. The buckets set before the forks are read by ``--compile`` only."""
    from utils.toolchain import cxx_compiler

    common = ("--target", tiny_models["target"], "--prompt", "Hi", "--length", "1", "--no-calibrate", "--verbose")
    cases = {"auto": common, "on": [*common, "--prepack", "on"], "off": [*common, "--prepack", "off"],
             "int8": ("--target", tiny_models["target"], "--quantize", "int8", "--prompt", "Hi", "--length", "4")}
    if cxx_compiler():
        cases["compile"] = ("--target", tiny_models["target"], "--compile", "--no-calibrate", "--prompt", "Hi", "--length", "6", "--verbose")
    results = run_forked(list(cases.values()), setup=f"import runners.compiled; runners.compiled.BUCKETS = {WIDTHS!r}")
    return dict(zip(cases, results))


def test_prepacking_is_measured_by_default_or_the_flags_choice_and_named_on_the_target_line(starts):
    """On the tiny float32 Llama, one token a run: the choice and its line do not depend on the model's size."""
    auto, on, off = (starts[name] for name in ("auto", "on", "off"))
    assert auto.returncode == 0 and on.returncode == 0 and off.returncode == 0, auto.stderr + on.stderr + off.stderr
    # measured, or (a busy machine) fallen back past its budget: either way named, saved or not
    # a Llama's eager passes run the lean forward (runners.lean), and the line says so
    assert re.search(r"· eager · lean Llama forward \(attention: (SDPA\)|the step's own, row by row\) on the C step \(.*\)) · (kernels by measurement: a one-position pass [0-9.]+ ms own, [0-9.]+ ms prepacked(, [0-9.]+ ms skinny)?; "
                     r"every pass on (prepacked|own|skinny|.* at [0-9]+\+ positions) \(costs"
                     r"|the model's own linears \(fallback: measurement over its [0-9.]+ s budget)", target_line(auto))
    assert target_line(on).endswith("· eager · lean Llama forward (attention: SDPA) · prepacked linears")
    assert target_line(off).endswith("· eager · lean Llama forward (attention: SDPA)")


@pytest.mark.needs_cxx
def test_compile_compiles_once_at_start_up_says_how_long_and_names_the_runner(starts):
    result = starts["compile"]
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("Compiled the target in") == 1
    widths = "/".join(map(str, WIDTHS))
    assert re.search(r"compiled \(inductor, frozen weights, (GEMM templates autotuned against MKL|MKL), passes of " + widths + r" positions, "
                     f"cache of {CAPACITY} positions, " r"compiled in \d+ s \((fresh|cached|partly cached)\)\)", target_line(result))
    assert "Target AR" in result.stdout and "N-gram assisted" in result.stdout


def test_quantized_target_loads_and_runs(starts):
    result = starts["int8"]
    assert result.returncode == 0, result.stderr
    assert "int8 weights" in target_line(result) and "Target AR" in result.stdout
