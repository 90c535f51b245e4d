"""Compile once per machine, not per start (kernels.compile_cache): a second process that prepares
the same model with the same cache folder takes every graph from the disk (inductor's own hit
counters, no clock), says "cached", and computes what the first one did; the folder is the one the
environment names (a temporary one for this module here, never the user's)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runners import prepack_fits

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.needs_cxx  # inductor compiles C++ on CPU

# one start: tiny one-layer Llamas compiled with one bucket (own layers in float64, and, where oneDNN
# prepacks, float32 with prepacked layers), each one's cache counts, header and a pass's logits. Both
# variants run in one process, one after the other (a process's imports and inductor's workers cost more
# than a tiny model's graphs); each model's counts are its own prepare's (kernels.compile_cache.CacheCount).
# Inductor's probes of this CPU's vector instructions (small C++ programs built once per folder, kept for
# the process; no graph, not counted) are skipped in the tests (conftest: TORCHINDUCTOR_VEC_ISA_OK, the
# reported list taken); where they run, the test run's own folder holds them, not built again per start.
# The two starts are forks of one Python that imported torch, transformers and the project and probed the
# vector instructions, but built no graph (repl_driver.run_forked's way): each start is a process of its own,
# its inductor state (in memory, and the folder it is pointed at) from nothing, and the second finds only what
# the first left on the disk; one import of the libraries, not two (~5 s).
STARTS = """
import json, os, sys, traceback, torch
sys.path[:0] = [{root!r}, {tests!r}]
from conftest import PROMPT, llama  # (which names a compile folder of its own: this start's is put back)
from kernels.compile_cache import use_compile_cache
from torch._inductor.cpu_vec_isa import pick_vec_isa
import runners, runners.compiled as compiled
use_compile_cache()  # the run's folder
pick_vec_isa()
os.environ["SPECDEC_CACHE"] = {folder!r}
torch.set_num_threads(1)
torch.set_grad_enabled(False)
compiled.BUCKETS = (1,)


def start():
    found = {{}}
    for prepacked in {variants!r}:
        model = llama(layers=1, window=256)
        if prepacked:  # float32, oneDNN's prepacked layers called from the graph (no freezing)
            model = model.to(torch.float32)
            assert runners.set_prepack(model, True)
        seconds = compiled.prepare(model, 100)
        count = compiled.compiled(model).cache_count
        runner = compiled.CompiledRunner(model)
        logits = [runner(torch.tensor([PROMPT[: n + 1]]), 1)[0, :8].tolist() for n in range(3)]
        found[str(prepacked)] = {{"hits": count.hits, "misses": count.misses, "source": compiled.compile_source(model),
                                 "label": compiled.compiled_label(model), "logits": logits}}
    return found


starts = []
for _ in range(2):  # one start after the other, each in a fork of this Python
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            text, status = json.dumps(start()), 0
        except BaseException:
            text, status = traceback.format_exc(), 1
        with os.fdopen(write, "w") as out:
            out.write(text)
        os._exit(status)
    os.close(write)
    with os.fdopen(read) as answer:
        text = answer.read()
    if os.waitpid(pid, 0)[1] != 0:
        sys.exit(text)
    starts.append(json.loads(text))
print(json.dumps(starts))
sys.stdout.flush()
os._exit(0)  # both starts are done: no ~1 s of finalizing torch's and transformers' modules
"""
VARIANTS = {"own-layers": False, "prepacked": True}


def two_starts(folder: Path, variants) -> list:
    """Two starts, one after the other, each of every variant in ``variants`` (False: own layers, True:
    prepacked) on the cache folder ``folder``: ``[{"False": counts, ...}, {...}]``."""
    env = {name: value for name, value in os.environ.items() if name != "TORCHINDUCTOR_CACHE_DIR"}
    code = STARTS.format(root=str(ROOT), tests=str(ROOT / "tests"), folder=str(folder), variants=tuple(variants))
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def starts(tmp_path_factory):
    """Two processes, one after the other, on one cache folder: ``(folder, first's, second's)``."""
    folder = tmp_path_factory.mktemp("compile-cache") / "compiled"
    variants = [False] + ([True] if prepack_fits(1) else [])
    return (folder, *two_starts(folder, variants))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_second_start_takes_every_graph_from_the_cache_folder_and_says_cached(starts, variant):
    prepacked = VARIANTS[variant]
    if prepacked and not prepack_fits(1):
        pytest.skip("no oneDNN prepacking in this torch build")
    folder, first, second = starts[0], starts[1][str(prepacked)], starts[2][str(prepacked)]
    assert first["misses"] > 0 and first["hits"] == 0 and first["source"] == "fresh"
    assert "(fresh)" in first["label"]
    assert any((folder / "inductor").rglob("*")), "the graphs were kept in the cache folder the environment names"
    assert second["hits"] >= first["misses"] and second["misses"] == 0 and second["source"] == "cached"
    assert "(cached)" in second["label"]
    assert second["logits"] == first["logits"]


def test_the_cache_folder_is_inductors_own_when_the_user_set_one_else_the_projects(monkeypatch, tmp_path):
    from kernels import compile_cache

    monkeypatch.setattr(compile_cache, "_USER_SET", str(tmp_path / "a"))
    assert compile_cache.compile_cache_dir() == tmp_path / "a"
    monkeypatch.setattr(compile_cache, "_USER_SET", None)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "project"))
    assert compile_cache.compile_cache_dir() == tmp_path / "project" / "inductor"
