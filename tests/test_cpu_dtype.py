"""--dtype auto for the pair on CPU: bfloat16 only when measured clearly faster, and the choice named."""
import torch

from utils.cpu_dtype import CLEARLY_FASTER, choose_cpu_dtype


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


def test_float32_is_timed_as_the_model_would_run_it():
    asked = []
    choose_cpu_dtype(64, 128, prepacked=True, seconds=lambda *a: asked.append(a) or 1e-3)
    assert asked == [(torch.float32, 4, 64, 128, True), (torch.bfloat16, 4, 64, 128, False)]
    assert "prepacked float32's" in choose_cpu_dtype(64, 128, prepacked=True, seconds=clock(0.5))[1]
