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


def test_each_round_reverses_the_order_before_it_so_no_side_always_runs_first():
    assert ab_revisions.round_orders(["a", "b"], 4) == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    orders = ab_revisions.round_orders(["a", "b", "c"], 2)
    assert orders == [["a", "b", "c"], ["c", "b", "a"]]


def test_the_series_table_gives_each_revisions_rounds_median_and_ratio_to_the_first():
    samples = {"old": [{"target AR": 40.0}, {"target AR": 50.0}, {"target AR": 44.0}],
               "new": [{"target AR": 55.0}, {"target AR": 49.5}, {"target AR": 60.0}]}
    rows = ab_revisions.series_table(samples).splitlines()[2:]
    assert rows[0] == "| target AR | old | 40.0, 50.0, 44.0 | 44.0 | 1.000 |"
    assert rows[1] == "| target AR | new | 55.0, 49.5, 60.0 | 55.0 | 1.250 |"


def test_a_series_of_one_revision_is_refused_in_one_line_before_any_checkout():
    args = ab_revisions.parse(["--series", "HEAD"])
    with pytest.raises(SystemExit) as refused:
        ab_revisions.run_series(args, ab_revisions.workload_args(args))
    assert str(refused.value).startswith("error: --series") and "\n" not in str(refused.value)
