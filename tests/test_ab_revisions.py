"""The revision A/B (``scripts/ab_revisions.py``) on another device: both sides get the same device,
compilation and dtype, the CPU default stays as it was, and ``--device cuda`` is refused in one line
where there is no CUDA (before any checkout is made)."""
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import ab_revisions  # noqa: E402


def test_the_ab_passes_device_compile_and_dtype_to_both_sides_and_keeps_the_cpu_default():
    default = json.loads(ab_revisions.workload_args(ab_revisions.parse([])))
    assert (default["device"], default["compile"], default["dtype"]) == ("cpu", False, "float32")
    cuda = json.loads(ab_revisions.workload_args(ab_revisions.parse(["--device", "cuda", "--compile", "--dtype", "bfloat16"])))
    assert (cuda["device"], cuda["compile"], cuda["dtype"]) == ("cuda", True, "bfloat16")


@pytest.mark.skipif(torch.cuda.is_available(), reason="refuses only where CUDA is absent")
def test_the_ab_refuses_cuda_in_one_line_where_there_is_none():
    with pytest.raises(SystemExit) as refused:
        ab_revisions.check_device("cuda")
    message = str(refused.value)
    assert message.startswith("error: --device cuda") and "\n" not in message
    ab_revisions.check_device("cpu")
