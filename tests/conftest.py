"""Tiny random models built from configs (float64, offline) shared by the tests."""
import os
import tempfile
import shutil
from pathlib import Path

# inductor compiles a graph's C++ in this process, not in a pool of workers it starts (each one a
# Python importing torch, per process that compiles): the suite keeps every core busy with one test
# file each, so a pool only adds processes. Read when torch is imported; subprocesses inherit it.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# inductor takes the vector instructions this CPU reports (the same list, the same pick where its probes pass, as
# here) without building a C++ probe of each and loading it in a child Python, in every process that compiles:
# ~8 s in a run's first compile (its folder cold), ~2.5 s in each later process (2026-11-30, noisy). A compiler
# that could not build them fails the compiled tests loudly instead of a narrower pick.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

import pytest
import torch
from hypothesis import settings
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration

from worker_times import pytest_runtest_logreport, pytest_terminal_summary  # noqa: F401 (hooks: each worker's files and end)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be downloaded in tests
# the project's cache folder (utils.models.cache_dir, the one switch the library reads) is this run's
# own: start-up measurements and compiled graphs start afresh at every run, so the suite takes the same
# paths every time; subprocesses get it too. The models converted in the user's cache (the embedded
# GGUF, the pair) are linked in, read only, so that a run does not convert them again. One run is one
# folder however many processes run it: pytest-xdist's workers (and a pytest started by a test) find
# the folder in _RUN_CACHE_ENV and share it, so a graph compiled or a start-up measured by one of them
# is on disk for the others (every save there is atomic); the process that made it removes it at the end.
_RUN_CACHE_ENV = "SPECDEC_TEST_RUN_CACHE"
_MADE_HERE = not os.environ.get(_RUN_CACHE_ENV)
if _MADE_HERE:
    _USERS_CACHE = Path(os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "speculative-decoding")
    _RUN_CACHE = Path(tempfile.mkdtemp(prefix="specdec-test-cache-"))
    for _entry in _USERS_CACHE.glob("*") if _USERS_CACHE.is_dir() else ():
        if _entry.is_dir() and _entry.name not in ("measurements", "inductor", "eagle"):
            (_RUN_CACHE / _entry.name).symlink_to(_entry, target_is_directory=True)
    os.environ[_RUN_CACHE_ENV] = str(_RUN_CACHE)
else:
    _RUN_CACHE = Path(os.environ[_RUN_CACHE_ENV])
# A subprocess's OpenMP threads sleep while they wait, as they do under `OMP_WAIT_POLICY=passive`: libgomp's
# default spins, and with a test file on every core a REPL started by a test spun its second thread on the
# other worker's core (measured: the embedded model's start-up took ~5x the CPU, ~4x the wall time). Only
# speed depends on it; a policy the caller set is kept. The subprocesses' environments take this mapping,
# inductor's compile threads too: the REPL's and README's helpers build an environment from scratch, and
# `--compile`'s start there ran a pool of compile workers the setting above means to spare.
# Their thread count stays the app's own (2 here; not OMP_NUM_THREADS=1): with the threads sleeping, one thread
# was no clear gain (docs/robustness.md, 2026-11-30, noisy), and it would give their start-up records pytest's key
# (threads 1), so what a REPL start measures or reads would depend on which test ran first.
# Every start-up measurement's load window reports no other work (utils.load.OTHERS_ENV, read in start_up_meter
# alone): the suite's other worker would make each one noisy, and a second start would measure again rather than
# reuse it, by the machine's load. The tests of the window pass their own meter (tests/test_load_window.py).
MEASUREMENTS_ENV = {"SPECDEC_CACHE": str(_RUN_CACHE), "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "passive"),
                    "TORCHINDUCTOR_COMPILE_THREADS": os.environ["TORCHINDUCTOR_COMPILE_THREADS"],
                    "TORCHINDUCTOR_VEC_ISA_OK": os.environ["TORCHINDUCTOR_VEC_ISA_OK"], "SPECDEC_OTHERS_CORES": "0"}
os.environ.update(MEASUREMENTS_ENV)
# tiny models: a second thread only adds synchronisation (measured: the tiny-model tests run
# several times faster with one); SPECDEC_TEST_THREADS changes it
torch.set_num_threads(int(os.environ.get("SPECDEC_TEST_THREADS", "1")))

VOCAB = 96

# Hypothesis profiles. "ci" (the default): the same examples on every run (derandomize), no
# example database, so a commit's result depends on the commit alone. "dev": random and 20 times as
# many examples, to hunt for new counterexamples; select it with HYPOTHESIS_PROFILE=dev or
# `pytest --hypothesis-profile=dev`. A test's own @settings must not pass derandomize, database or
# a bare max_examples (they would override the profile): it passes max_examples=examples(n).
DEV_SCALE = 20
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True, database=None)
settings.register_profile("dev", derandomize=False, deadline=None, print_blob=True, max_examples=100 * DEV_SCALE)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def examples(n: int) -> int:
    """A property test's number of examples: ``n`` under the "ci" profile, ``n * DEV_SCALE`` under "dev"."""
    return n * DEV_SCALE if settings.get_current_profile_name() == "dev" else n


# The files that take longest, longest first (longest-processing-time order: a worker takes the next
# file when it finishes one, so the short files fill the end). `make test` sends whole files to its
# workers in collection order (--no-loadscope-reorder: pytest-xdist's own order, by number of tests, put
# the few-test files last, and the run waited on one worker for them). The order is by CPU seconds, the
# test's and its subprocesses', each file alone beside other work (2026-11-30, noisy; docs/robustness.md):
# the compiled file (136), the chi-square grid (128), EAGLE's (124), then
# the pair's file where it is installed (~60 CPU s but ~100 s of wall time: a 6 GB model read and loaded;
# its REPL start gives the kernels since the cut of 2026-11-30, no longer minutes of measurement), the REPL's
# other files, the benchmark and the families (~75-100), the soak (~60 after its cut to 7 rounds, 2026-11-30),
# the sampled files (55; the cross-tokenizer's ~45 since its 800 generations a cell), the REPL's compiled start
# (~50 since its one width, 2026-11-30, estimated from its wall time); the files of one or two long compiling or
# REPL tests (20-40 s), then the middle weights
# that alphabetical order ran last, where the run's end is decided (2026-11-30, each alone, CPU s less
# pytest's own 7, noisy): the step's readiness (53), few-row passes' builds (47), the step runner and its
# state (37, 33), suffix decoding (19), the trees (20), the dtype routes' memory (~20 since its float32 kernels are
# timed over 1-4 positions, 2026-11-30, estimated), the sampled trees (18), the start-up trace (18), the merged
# tree (17), the drafter's head and the drafting strategies (15), README's first steps (~12 since their
# choose_kernels times 1-4 positions in one round, 2026-11-30; 36 before), greedy exactness (12), the kernel build (~10
# since its rebuilds copy the first build, 2026-11-30, estimated), the toolchain (10), the embedded model (8).
# The short files (a few seconds each) end the run.
HEAVY_FIRST = ("test_compiled.py", "test_control_combinations.py", "test_eagle.py",
               "test_pair_model.py", "test_repl_session.py", "test_bench.py", "test_families.py", "test_soak.py",
               "test_repl_startup.py", "test_compile_cache.py", "test_startup_memory.py", "test_lossless_sampling.py",
               "test_cross_tokenizer.py", "test_repl_target_line.py", "test_hostile_input.py", "test_c_step.py", "test_eagle_data.py",
               "test_one_copy.py", "test_head_compiled_step.py", "test_eagle_row.py", "test_cpu_figures.py",
               "test_step_readiness.py", "test_few_rows.py", "test_step_runner.py", "test_step_state.py",
               "test_suffix.py", "test_trees.py", "test_pass_dtype_memory.py",
               "test_trees_sampled.py", "test_startup_trace.py", "test_merged_tree.py", "test_drafter_head.py",
               "test_drafting_strategies.py", "test_readme.py", "test_greedy_exactness.py", "test_kernel_build.py", "test_toolchain.py",
               "test_embedded_model.py")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``needs_cxx`` (they compile graphs with inductor on CPU) or ``needs_cc`` (they build
    the skinny kernel) skip, with the reason, on a machine without that compiler (a slim image). The
    files of ``HEAVY_FIRST`` run first, in its order; the rest keep theirs (a stable sort)."""
    from utils.toolchain import WITHOUT_CC, c_compiler, cxx_compiler

    missing = {"needs_cxx": None if cxx_compiler() else "no C++ compiler for inductor (g++ or $CXX): --compile cannot run on CPU",
               "needs_cc": None if c_compiler() else f"no C compiler (cc, gcc or $CC): {WITHOUT_CC}"}
    for item in items:
        for mark, reason in missing.items():
            if reason and item.get_closest_marker(mark):
                item.add_marker(pytest.mark.skip(reason=reason))
    rank = {name: index for index, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_unconfigure(config):
    if _MADE_HERE:
        shutil.rmtree(_RUN_CACHE, ignore_errors=True)  # the links only: the user's models stay


def _seeded(seed: int):
    torch.manual_seed(seed)


def perturbed_copy(model, scale: float, seed: int):
    """The same architecture with noisy weights: a drafter that agrees with the target only partly."""
    drafter = type(model)(model.config).to(torch.float64)
    drafter.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale * (p.std() if p.numel() > 1 else 1))
    return drafter.eval()


def llama(vocab=VOCAB, layers=2, window=256, seed=0, init=0.02):
    _seeded(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=window, initializer_range=init, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).to(torch.float64).eval()


def gpt2(vocab=VOCAB, layers=2, window=256, seed=0, init=0.02):
    _seeded(seed)
    config = GPT2Config(vocab_size=vocab, n_embd=32, n_layer=layers, n_head=4, n_positions=window, bos_token_id=1, eos_token_id=1,
                        initializer_range=init)
    return GPT2LMHeadModel(config).to(torch.float64).eval()


def t5(vocab=VOCAB, seed=0):
    _seeded(seed)
    config = T5Config(
        vocab_size=vocab, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )
    return T5ForConditionalGeneration(config).to(torch.float64).eval()


FAMILIES = {"llama": llama, "gpt2": gpt2}
NOISE = {"llama": 0.2, "gpt2": 1.0}  # drafters that accept roughly half of their drafts


@pytest.fixture(scope="session", params=sorted(FAMILIES))
def pair(request):
    """(target, drafter) of one family: the drafter is a noisy copy, so it is right only sometimes."""
    target = FAMILIES[request.param]()
    return target, perturbed_copy(target, NOISE[request.param], seed=1)


@pytest.fixture(scope="session")
def t5_pair():
    target = t5()
    return target, perturbed_copy(target, 0.5, seed=1)


PROMPT = [5, 17, 33, 5, 17, 40, 2, 9, 5, 17, 33, 71]
EOS_NEVER = []  # no stop token: every run has max_gen_len tokens


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def save_tiny(folder: Path, model) -> str:
    from utils.models import embedded_model_dir

    model.to(torch.float32).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        source = embedded_model_dir() / name
        if source.exists():
            shutil.copy(source, folder / name)
    return str(folder)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """A tiny random target and drafter with SmolLM2's tokenizer (and one with another vocabulary)."""
    root = tmp_path_factory.mktemp("models")
    target = llama(vocab=49152, window=4096, layers=1)
    target.config.eos_token_id = 2
    drafter = perturbed_copy(target, 0.2, seed=1)
    other = llama(vocab=1000, window=4096, layers=1)
    seq2seq = t5(vocab=49152)
    seq2seq.config.eos_token_id = 2
    return {
        "t5": save_tiny(root / "t5", seq2seq),
        "t5_drafter": save_tiny(root / "t5_drafter", perturbed_copy(seq2seq, 0.2, seed=1)),
        "target": save_tiny(root / "target", target),
        "drafter": save_tiny(root / "drafter", drafter),
        "other": save_tiny(root / "other", other),
    }
