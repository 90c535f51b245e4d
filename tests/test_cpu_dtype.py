"""EAGLE training's dtype by one matmul of the model's shape (``measure.dtype``; the programs' --dtype auto times the model's own pass: tests/test_pass_dtype.py): bfloat16 only when measured clearly faster, and the choice named."""
import torch

from measure.dtype import CLEARLY_FASTER, choose_cpu_dtype


def clock(bf16_share: float):
    """A fake timer: a bfloat16 matmul takes ``bf16_share`` of a float32 one."""
    return lambda dtype, rows, inner, outer, prepacked: 1e-3 * (bf16_share if dtype == torch.bfloat16 else 1.0)


def test_bfloat16_only_when_clearly_faster():
    assert choose_cpu_dtype(64, 128, seconds=clock(0.5))[0] == "bfloat16"
    assert choose_cpu_dtype(64, 128, seconds=clock(CLEARLY_FASTER + 0.05))[0] == "float32"
    assert choose_cpu_dtype(64, 128, seconds=clock(3.0))[0] == "float32"


def test_the_choice_and_its_reason_are_named():
    dtype, reason = choose_cpu_dtype(64, 128, seconds=clock(0.5))
    assert reason.startswith("bfloat16 by measurement") and "0.50 of float32's time" in reason and "64x128" in reason
    dtype, reason = choose_cpu_dtype(64, 128, seconds=clock(1.2))
    assert reason.startswith("float32 by measurement") and "not clearly faster" in reason


def test_the_real_measurement_chooses_one_and_says_which():
    dtype, reason = choose_cpu_dtype(64, 256)  # whatever this machine's clock says
    assert dtype in ("bfloat16", "float32") and reason.startswith(f"{dtype} by measurement")


def test_float32_is_timed_under_both_kernels_and_the_faster_counts():
    """Each row of a comparison runs float32 on its faster kernel, so bfloat16 must beat that one."""
    asked = []
    choose_cpu_dtype(64, 128, prepacked=True, seconds=lambda *a: asked.append(a) or 1e-3)
    assert asked == [(torch.float32, 4, 64, 128, False), (torch.float32, 4, 64, 128, True), (torch.bfloat16, 4, 64, 128, False)]

    def slow_own(dtype, rows, inner, outer, prepacked):  # own float32 2x slower than prepacked; bfloat16 between
        return {torch.bfloat16: 1.0, torch.float32: 1.0 if prepacked else 2.0}[dtype] * 1e-3 * (0.9 if dtype == torch.bfloat16 else 1)

    dtype, reason = choose_cpu_dtype(64, 128, prepacked=True, seconds=slow_own)
    assert dtype == "float32" and "0.90 of the faster float32 kernel's (prepacked) time" in reason
    assert choose_cpu_dtype(64, 128, prepacked=False, seconds=slow_own)[0] == "bfloat16"  # against own float32 only
