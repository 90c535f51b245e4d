"""The runner family (runners/): one interface, the reference's cache functions at its path, a package a newcomer can read."""
import ast
import subprocess
import sys
from pathlib import Path

import torch

import runners
import utils.caching
from conftest import PROMPT, llama, t5
from runners import BeamRunner, KVCacheModel, Runner, make_runner

ROOT = Path(__file__).resolve().parents[1]


def test_every_runner_make_runner_gives_is_a_runner():
    model = llama()
    for runner in (KVCacheModel(model), KVCacheModel(model, cache="static"), KVCacheModel(model, use_cache=False),
                   make_runner(model), KVCacheModel(t5(), encoder_input_ids=PROMPT)):
        assert isinstance(runner, Runner)
    assert not isinstance(BeamRunner(model), Runner)  # a batch of beams: start/extend, no rollback


def test_the_reference_cache_path_holds_only_the_references_functions_and_the_runners_use_them():
    names = {n for n in vars(utils.caching) if not n.startswith("_")}
    assert names == {"prune_cache", "prune_tuple_cache", "prune_dynamic_cache"}
    for name in names:
        assert getattr(runners, name) is getattr(utils.caching, name), name
    assert not (ROOT / "utils" / "compiled.py").exists() and not (ROOT / "sampling" / "drafters.py").exists()


IMPORT_ALONE = '''
import importlib, sys
for module in sys.argv[1:]:
    for name in [n for n in sys.modules if n == "runners" or n.startswith("runners.")]:
        del sys.modules[name]
    importlib.import_module(module)
'''


def test_each_runners_module_imports_alone_and_none_imports_a_private_name():
    paths = sorted((ROOT / "runners").glob("*.py"))
    modules = ["runners" if path.stem == "__init__" else f"runners.{path.stem}" for path in paths]
    subprocess.run([sys.executable, "-c", IMPORT_ALONE, *modules], cwd=ROOT, check=True)  # a cycle fails one of them
    for path in paths:
        tree = ast.parse(path.read_text())
        assert len(path.read_text().splitlines()) <= 400, path.name
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert not any(a.name.startswith("_") for a in node.names), (path.name, node.module)


@torch.no_grad()
def test_the_beam_runner_reorders_its_rows_as_the_model_would():
    model = llama()
    runner = BeamRunner(model)
    first = runner.start(PROMPT)
    assert first.shape == (1, model.config.vocab_size) and runner.cached == len(PROMPT)
    logits = runner.extend([0, 0], [3, 4])
    for row, token in enumerate((3, 4)):
        whole = model(input_ids=torch.tensor([PROMPT + [token]])).logits[0, -1]
        torch.testing.assert_close(logits[row], whole, rtol=1e-4, atol=1e-4)
    assert runner.forward_passes == 2 and runner.cached == len(PROMPT) + 1
