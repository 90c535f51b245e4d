"""The model cache's first use: one conversion however many processes ask at once, nothing
half-written under the final name, leftovers and incomplete entries repaired in one line.
Every test points SPECDEC_CACHE at a temporary folder: the real cache is never touched."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from utils import models

ROOT = Path(__file__).resolve().parents[1]

# A process converting a fake GGUF with a stand-in for transformers' de-quantization. The
# conversion counts itself and, before finishing, waits until both processes have started asking
# for the folder, so that the second really overlaps the first (it waits on the lock or finds the
# folder done: the assertions hold either way, whatever the timing).
CHILD = r"""
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from utils import models

work, me, gguf = Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])

def convert(path, out):
    (work / f"converted-{me}").touch()
    give_up = time.monotonic() + 120
    while not all((work / f"asking-{name}").exists() for name in ("a", "b")):
        if time.monotonic() > give_up:
            raise SystemExit("the other process never started")
        time.sleep(0.01)
    time.sleep(0.2)  # only widens the window in which the other process waits
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"w" * 1000)

models.convert_gguf = convert
(work / f"asking-{me}").touch()
print(models.gguf_model_dir(gguf, lambda line: None))
"""


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECDEC_CACHE", str(root))
    return root


@pytest.fixture
def gguf(tmp_path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def fake_converter(monkeypatch, calls: list):
    def convert(path: Path, out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"weights")

    monkeypatch.setattr(models, "convert_gguf", convert)


def partials(cache: Path) -> list:
    return sorted(p.name for p in cache.glob("*.partial*")) if cache.exists() else []


def test_two_processes_asking_at_once_convert_once_and_share_one_complete_folder(tmp_path, cache, gguf):
    env = {**os.environ, "SPECDEC_CACHE": str(cache)}
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(ROOT), str(tmp_path), name, str(gguf)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    results = [child.communicate(timeout=300) for child in children]
    assert [child.returncode for child in children] == [0, 0], [err for _, err in results]
    folders = {out.strip() for out, _ in results}
    assert folders == {str(cache / "gguf-model-64")}
    assert len(list(tmp_path.glob("converted-*"))) == 1
    assert models.model_folder_problem(cache / "gguf-model-64") is None and partials(cache) == []


def test_leftovers_of_an_interrupted_conversion_are_removed_saying_so_in_one_line(cache, gguf, monkeypatch):
    calls, lines = [], []
    fake_converter(monkeypatch, calls)
    for name in ("gguf-model-64.partial", "gguf-model-64.partial-x1y2"):  # the old fixed name and a unique one
        (cache / name).mkdir(parents=True)
        (cache / name / "model.safetensors").write_bytes(b"half")
    folder = models.gguf_model_dir(gguf, lines.append)
    assert partials(cache) == [] and len(calls) == 1 and models.model_folder_problem(folder) is None
    assert len(lines) == 2 and lines[0].startswith("Removed 2 leftover(s) of an interrupted conversion")
    assert lines[1].startswith("Converting model.gguf once")


@pytest.mark.parametrize("damage", ["no config.json", "no model.safetensors", "empty model.safetensors"])
def test_an_incomplete_entry_is_named_in_one_line_and_rebuilt(cache, gguf, monkeypatch, damage):
    calls, lines = [], []
    fake_converter(monkeypatch, calls)
    folder = models.gguf_model_dir(gguf, lines.append)
    if damage == "no config.json":
        (folder / "config.json").unlink()
    elif damage == "no model.safetensors":
        (folder / "model.safetensors").unlink()
    else:
        (folder / "model.safetensors").write_bytes(b"")
    lines.clear()
    assert models.gguf_model_dir(gguf, lines.append) == folder and len(calls) == 2
    assert lines[0] == f"{folder} is incomplete ({damage}): rebuilding it" and len(lines) == 2
    assert models.model_folder_problem(folder) is None and partials(cache) == []


def test_a_process_that_loses_the_rename_keeps_the_winners_folder_and_removes_its_own(cache):
    folder = cache / "model"

    def build_while_another_writer_finishes(out: Path) -> None:  # one that took no lock (an older version)
        folder.mkdir()
        (folder / "config.json").write_text('{"winner": true}')
        (folder / "model.safetensors").write_bytes(b"theirs")
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"ours")

    assert models.cached_conversion(folder, build_while_another_writer_finishes, lambda line: None) == folder
    assert (folder / "model.safetensors").read_bytes() == b"theirs" and partials(cache) == []


def test_a_failed_conversion_leaves_nothing_and_the_next_call_converts(cache, gguf, monkeypatch):
    def broken(path: Path, out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "convert_gguf", broken)
    with pytest.raises(KeyboardInterrupt):
        models.gguf_model_dir(gguf, lambda line: None)
    assert not (cache / "gguf-model-64").exists() and partials(cache) == []
    calls = []
    fake_converter(monkeypatch, calls)
    assert models.model_folder_problem(models.gguf_model_dir(gguf, lambda line: None)) is None and len(calls) == 1


def test_a_conversion_that_writes_no_weights_is_refused_and_never_takes_the_final_name(cache):
    with pytest.raises(RuntimeError, match="incomplete model"):
        models.cached_conversion(cache / "model", lambda out: (out / "config.json").write_text("{}"), lambda line: None)
    assert not (cache / "model").exists() and partials(cache) == []


def versioned(folder: Path, version: int) -> None:
    (folder / "config.json").write_text(f'{{"version": {version}}}')
    (folder / "model.safetensors").write_bytes(b"w")


def stale_unless(version: int):
    """A ``problem``: the folder is stale unless it holds ``version`` (as an export stamped by another GenAI)."""
    return lambda folder: None if (folder / "config.json").is_file() and f'"version": {version}' in (folder / "config.json").read_text() else "stale"


@pytest.mark.parametrize("exchange", [True, False], ids=["one exchange", "two renames"])
@pytest.mark.parametrize("failure", ["the build raises", "the build is refused by its check"])
def test_a_stale_folder_stays_in_place_until_its_successor_is_built_and_checked(cache, failure, exchange, monkeypatch):
    """A complete folder that is stale (an export of another version) keeps working while its successor is
    built beside it; a build that fails or is refused leaves it as it was, one that succeeds replaces it
    (by an atomic exchange where the system has one, else by two renames)."""
    if not exchange:
        monkeypatch.setattr(models, "_exchange", lambda a, b: False)
    folder = cache / "model"
    folder.mkdir(parents=True)
    versioned(folder, 1)

    def failing(out: Path) -> None:
        if failure == "the build raises":
            raise RuntimeError("export failed")
        versioned(out, 3)  # not what the check asks for

    with pytest.raises(RuntimeError):
        models.cached_conversion(folder, failing, lambda line: None, problem=stale_unless(2))
    assert '"version": 1' in (folder / "config.json").read_text() and partials(cache) == []
    models.cached_conversion(folder, lambda out: versioned(out, 2), lambda line: None, problem=stale_unless(2))
    assert '"version": 2' in (folder / "config.json").read_text() and partials(cache) == []
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith("model")) == ["model", "model.lock"]


def test_a_swap_interrupted_between_its_renames_gets_the_old_folder_back(cache):
    aside = cache / "model.replaced"  # the old folder moved aside, the process dead before the new one took its name
    aside.mkdir(parents=True)
    versioned(aside, 1)
    assert models.cached_conversion(cache / "model", lambda out: pytest.fail("built"), lambda line: None, problem=stale_unless(1)) == cache / "model"
    assert not aside.exists() and '"version": 1' in (cache / "model" / "config.json").read_text()


def test_an_exchange_swaps_both_names_or_changes_nothing(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "from-a").write_text("")
    swapped = models._exchange(tmp_path / "a", tmp_path / "b")
    assert (tmp_path / ("b" if swapped else "a") / "from-a").is_file() and (tmp_path / "a").is_dir() and (tmp_path / "b").is_dir()
