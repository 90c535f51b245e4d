"""The skinny kernel (``kernels.skinny``) computes what ``F.linear`` computes, a row at a time in a
fixed order (so a verification pass's linear layers give each position what a one-position pass
gives it, whatever the thread count), and a model on it decodes losslessly."""
import subprocess
import sys

import pytest
import torch

from conftest import EOS_NEVER, PROMPT, llama
from drafters import PromptLookupSpec
from kernels import skinny
from runners import KVCacheModel, kernels, prepackable
from sampling import autoregressive_generate, generate

pytestmark = pytest.mark.skipif(not skinny.available()[0], reason=f"the skinny kernel does not build here: {skinny.available()[1]}")


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 12, 13])
@pytest.mark.parametrize("out_features,in_features", [(48, 64), (7, 13), (33, 8), (5, 100)])
def test_skinny_linear_equals_f_linear_over_any_rows_odd_shapes_and_bias(rows, out_features, in_features):
    generator = torch.Generator().manual_seed(rows * 1000 + out_features)
    x = torch.randn(2, rows, in_features, generator=generator)
    weight, bias = torch.randn(out_features, in_features, generator=generator), torch.randn(out_features, generator=generator)
    for b in (bias, None):
        exact = torch.nn.functional.linear(x.double(), weight.double(), None if b is None else b.double())
        torch.testing.assert_close(skinny.skinny_linear(x, weight, b).double(), exact, rtol=1e-5, atol=1e-5)


def test_each_row_is_computed_alone_the_same_with_any_rows_and_any_thread_count():
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(12, 576, generator=generator), torch.randn(1536, 576, generator=generator)
    many = skinny.skinny_linear(x, weight, None)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = [skinny.skinny_linear(x[i : i + 1], weight, None) for i in range(12)]
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(alone[i][0], many[i]) for i in range(12))


@pytest.mark.skipif(not prepackable(llama().to(torch.float32)), reason="routes live on PrepackedLinear (needs oneDNN)")
def test_a_model_on_the_skinny_kernel_matches_its_own_layers_and_decodes_losslessly():
    target = llama(vocab=300, init=0.2).to(torch.float32)
    ids = torch.tensor([PROMPT])
    with kernels(target, False):
        own = KVCacheModel(target)(ids, 5)
        reference = autoregressive_generate(PROMPT, target, 30, eos_tokens_id=EOS_NEVER, use_cache=True)
    with kernels(target, ("skinny",)):
        torch.testing.assert_close(KVCacheModel(target)(ids, 5), own, rtol=1e-4, atol=1e-4)
        ar = autoregressive_generate(PROMPT, target, 30, eos_tokens_id=EOS_NEVER, use_cache=True)
        pld, _ = generate(PROMPT, target, PromptLookupSpec(), dict(max_gen_len=30, eos_tokens_id=EOS_NEVER, use_cache=True))
    assert ar == reference and pld == reference


def test_a_compiler_that_fails_gives_one_reason_and_no_kernel(tmp_path):
    """A broken compiler: the kernel is unavailable with its reason, nothing half-written is left, and
    the start-up measurement simply has one option fewer."""
    code = ("import kernels.skinny as s; ok, why = s.available(); print(ok); print(why); "
            "import os; print(sorted(p for p in os.listdir(os.path.join(os.environ['SPECDEC_CACHE'], 'kernels')) if p.endswith('.so')))")
    env = {"PATH": "/usr/bin:/bin", "CC": "/bin/false", "SPECDEC_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(skinny.SOURCE.parents[1]), timeout=120)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    assert lines[0] == "False" and lines[1].startswith("the skinny kernel did not build: /bin/false failed") and lines[2] == "[]"


def test_a_transposed_weight_or_other_dtypes_still_give_f_linear():
    """The kernel reads a contiguous float32 weight: a transposed view is made contiguous first, and
    bfloat16 inputs (autocast) take ``F.linear`` itself."""
    generator = torch.Generator().manual_seed(3)
    x, weight = torch.randn(3, 40, generator=generator), torch.randn(40, 24, generator=generator).t()
    torch.testing.assert_close(skinny.skinny_linear(x, weight, None), torch.nn.functional.linear(x, weight), rtol=1e-5, atol=1e-5)
    halves = x.to(torch.bfloat16), weight.to(torch.bfloat16)
    assert torch.equal(skinny.skinny_linear(*halves, None), torch.nn.functional.linear(*halves))


def test_the_kernel_runs_on_torchs_thread_count_whatever_openmp_runtime_loaded_it(monkeypatch):
    """The thread count is given to the C code at every call and the loop runs on exactly that many:
    a second OpenMP runtime (another wheel's, conda's libiomp) cannot fall back on its own default."""
    ran = []
    real = skinny.run_linear
    monkeypatch.setattr(skinny, "run_linear", lambda *args: ran.append(real(*args)) or ran[-1])
    generator = torch.Generator().manual_seed(1)
    x, weight = torch.randn(3, 64, generator=generator), torch.randn(64, 64, generator=generator)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            skinny.skinny_linear(x, weight, None)
    finally:
        torch.set_num_threads(threads)
    assert ran == [1, 2, 3]


def test_a_weight_or_bias_the_kernel_cannot_read_raises_as_f_linear_does_and_never_reaches_c():
    """Only float32 CPU tensors of matching sizes reach the C code: a weight on another device (meta:
    no memory behind its pointer), a float64 bias or one of the wrong length get ``F.linear``'s own
    answer (its error), not a crash or numbers read from the wrong memory."""
    generator = torch.Generator().manual_seed(2)
    x, weight = torch.randn(2, 16, generator=generator), torch.randn(8, 16, generator=generator)
    for w, b in [(weight, torch.randn(8, dtype=torch.float64)), (weight, torch.randn(5)), (torch.randn(8, 12), None)]:
        with pytest.raises(RuntimeError):
            torch.nn.functional.linear(x, w, b)
        with pytest.raises(RuntimeError):
            skinny.skinny_linear(x, w, b)
    on_meta = weight.to("meta")  # its data pointer is 0: handed to C, the process would die
    expected = torch.nn.functional.linear(x, on_meta)
    got = skinny.skinny_linear(x, on_meta, None)
    assert (got.shape, got.dtype, got.device) == (expected.shape, expected.dtype, expected.device)


def test_the_library_name_names_the_machine_and_the_compilers_real_target(monkeypatch):
    """Two machines sharing a cache folder get two libraries when ``-march=native`` means two targets
    there (aarch64's features, macOS with no /proc/cpuinfo): the name hashes what the compiler
    predefines for ``-march=native``, and starts with the machine."""
    import platform

    from utils.toolchain import c_compiler

    compiler = c_compiler()
    assert skinny.compiler_target(compiler)  # gcc and clang both answer -dM -E
    name = skinny.library_name(compiler)
    assert name.startswith(f"skinny-{platform.machine()}-")
    monkeypatch.setattr(skinny, "_cpu_line", lambda: "")  # no /proc/cpuinfo (macOS): the target still tells them apart
    plain = skinny.library_name(compiler)
    monkeypatch.setattr(skinny, "compiler_target", lambda cc: "#define __AVX512F__ 1")
    assert skinny.library_name(compiler) != plain


def test_a_failed_build_is_remembered_and_not_retried_at_every_start(tmp_path):
    """A compiler that fails is run once to build: the next start reads why from the cache folder
    (``<name>.failed``, which says how to try again) instead of paying for the build again."""
    log = tmp_path / "calls"
    compiler = tmp_path / "cc"
    compiler.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\ncase \"$*\" in *-shared*) echo 'no' >&2; exit 1;; esac\n"
                        "case \"$*\" in *--version*) echo 'fake cc 1.0';; esac\nexit 0\n")
    compiler.chmod(0o755)
    code = "import kernels.skinny as s; ok, why = s.available(); print(ok); print(why)"
    env = {"PATH": "/usr/bin:/bin", "CC": str(compiler), "SPECDEC_CACHE": str(tmp_path / "cache")}
    outputs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                              cwd=str(skinny.SOURCE.parents[1]), timeout=120) for _ in range(2)]
    assert all(done.returncode == 0 for done in outputs), outputs
    builds = [line for line in log.read_text().splitlines() if "-shared" in line]
    assert len(builds) == 1
    first, second = (done.stdout.splitlines() for done in outputs)
    assert first == ["False", f"the skinny kernel did not build: {compiler} failed: no"]
    assert second[0] == "False" and second[1].startswith(f"the skinny kernel did not build: {compiler} failed: no (an earlier start; remove ")
