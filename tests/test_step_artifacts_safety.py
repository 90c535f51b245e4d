"""The compiled step's artifact file is trusted only as far as it deserves (issue 70, fault 8): a payload
torch could not load is not reported as reused, a failed save leaves no temporary file behind, and a
file that another user could have written (its payload is unpickled) is skipped with its reason. No
compilation: the files are written by hand under a key of our own."""
import hashlib
import json
import os

import pytest
import torch

import kernels.step_artifacts as artifacts

KEY = {"torch": torch.__version__, "model": "hand-written", "dtype": "torch.float32"}
GRAPHS = [(1, 256, ())]
FDOPEN = os.fdopen  # the real one: the tests below patch ``os.fdopen``


@pytest.fixture
def folder(monkeypatch, tmp_path):
    where = tmp_path / "step-artifacts"
    monkeypatch.setattr(artifacts, "artifacts_dir", lambda: where)
    return where


def write(payload: bytes, mode: int = 0o600):
    """A whole, well-formed file under KEY (its folder made private), with ``mode``."""
    path = artifacts.artifact_path(KEY)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    line = json.dumps({"key": KEY, "graphs": GRAPHS, "sha256": hashlib.sha256(payload).hexdigest()})
    path.write_bytes(line.encode() + b"\n" + payload)
    path.chmod(mode)
    return path


def test_a_payload_torch_cannot_load_is_not_reported_as_reused(folder):
    """``torch.compiler.load_cache_artifacts`` logs and returns None on a payload it cannot unpickle; the
    checksum matches (the file is whole), so only its answer tells that nothing was loaded."""
    write(b"not torch's pickle")
    graphs, problem = artifacts.load_artifacts(KEY)
    assert graphs == [] and problem.startswith("not loadable")


def test_a_load_answering_none_is_not_counted_and_one_answering_is(folder, monkeypatch):
    write(b"payload")
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: None)
    assert artifacts.load_artifacts(KEY)[0] == []
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: object())
    assert artifacts.load_artifacts(KEY) == (GRAPHS, "")


class FailingWriter:
    """A file object that writes a few bytes and then fails, as a full disk or an interrupt would."""

    def __init__(self, handle, error):
        self.out, self.error = FDOPEN(handle, "wb"), error

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.out.close()

    def write(self, data):
        self.out.write(data[:7])
        raise self.error


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_save_failing_mid_write_leaves_no_temporary_file(folder, monkeypatch, error):
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"payload", None))
    monkeypatch.setattr(artifacts.os, "fdopen", lambda handle, mode: FailingWriter(handle, error))
    if isinstance(error, OSError):
        assert artifacts.save_artifacts(KEY, GRAPHS) is None
    else:  # not the folder's fault: it goes on up, but the folder is clean
        with pytest.raises(KeyboardInterrupt):
            artifacts.save_artifacts(KEY, GRAPHS)
    assert list(folder.iterdir()) == []


def test_a_save_is_private_to_this_user_and_its_file_is_loaded_again(folder, monkeypatch):
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"payload", None))
    path = artifacts.save_artifacts(KEY, GRAPHS)
    assert path is not None and path.stat().st_mode & 0o077 == 0 and folder.stat().st_mode & 0o022 == 0
    assert artifacts.read_artifact(KEY) == (b"payload", GRAPHS, "")


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX owners and modes")
def test_a_file_others_can_write_is_skipped_with_its_reason(folder, monkeypatch):
    loaded = []
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: loaded.append(data) or object())
    path = write(b"payload", mode=0o666)
    graphs, problem = artifacts.load_artifacts(KEY)
    assert graphs == [] and problem == "skipped: the file is writable by other users (its payload is unpickled)"
    path.chmod(0o600)
    folder.chmod(0o770)
    graphs, problem = artifacts.load_artifacts(KEY)
    assert graphs == [] and problem == "skipped: its folder is writable by other users (its payload is unpickled)"
    folder.chmod(0o700)
    assert artifacts.load_artifacts(KEY) == (GRAPHS, "") and loaded == [b"payload"]


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX owners and modes")
def test_a_file_another_user_owns_is_skipped_with_its_reason(folder, monkeypatch):
    write(b"payload")
    real = os.getuid()
    monkeypatch.setattr(artifacts.os, "getuid", lambda: real + 1)  # as if another user had made it
    graphs, problem = artifacts.load_artifacts(KEY)
    assert graphs == [] and problem.startswith("skipped: ") and "another user" in problem


def test_a_link_in_place_of_the_file_is_not_followed(folder, tmp_path):
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(b"whatever")
    path = artifacts.artifact_path(KEY)
    folder.mkdir(mode=0o700)
    path.symlink_to(target)
    graphs, problem = artifacts.load_artifacts(KEY)
    assert graphs == [] and problem.startswith("skipped: ")


def test_the_steps_header_says_why_its_artifacts_were_not_loaded(folder):
    """The reason a file was skipped reaches the line that names the step (``runners.step.step_label``)."""
    from conftest import llama
    from runners.step import step_label, step_state

    model = llama(layers=1, window=512, seed=12).to(torch.float32)
    key = artifacts.artifact_key(model, torch.float32, torch.device("cpu"))
    path = artifacts.artifact_path(key)
    path.parent.mkdir(mode=0o700)
    path.write_bytes(b"anything")
    path.chmod(0o646)
    assert step_state(model).artifact_problem.startswith("skipped: the file is writable by other users")
    assert "artifacts not loaded: skipped: the file is writable by other users" in step_label(model)
