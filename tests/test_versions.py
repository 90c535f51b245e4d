"""The programs refuse, in one line at start, a torch older than the floor (transformers 5.24 needs 2.6,
and the lean forward's SDPA call ``enable_gqa`` 2.5), before anything loads a model."""
import pytest
import torch

import bench
import infer


@pytest.mark.parametrize("main", [bench.main, infer.main], ids=["bench", "infer"])
@pytest.mark.parametrize("version", ["2.4.1+cu121", "2.5.0", "1.13.1"])
def test_a_torch_below_the_floor_is_refused_in_one_line_at_start(main, version, monkeypatch):
    monkeypatch.setattr(torch, "__version__", version)
    with pytest.raises(SystemExit) as caught:
        main(["--device", "cpu", "--target", "/nonexistent/model"])
    said = caught.value.code  # the one line Python prints on stderr, unwrapped
    assert isinstance(said, str) and said.startswith(f"error: torch {version} is installed;") and ">= 2.6" in said and "\n" not in said


@pytest.mark.parametrize("version", ["2.6.0", "2.6.0+cpu", "2.13.0+cpu", "2.7.0.dev20250101", "3.0.0"])
def test_a_torch_at_or_above_the_floor_passes(version, monkeypatch):
    from utils.versions import torch_problem

    monkeypatch.setattr(torch, "__version__", version)
    assert torch_problem() is None


def test_requirements_state_the_floor():
    from pathlib import Path

    from utils.versions import TORCH_FLOOR

    floor = ".".join(map(str, TORCH_FLOOR))
    assert f"torch>={floor}" in (Path(__file__).resolve().parents[1] / "requirements.txt").read_text()
