"""The row-invariance and forward-equality checks the step's tests share (tests/test_c_step.py,
tests/test_c_step_bf16.py, tests/test_families.py, tests/test_lean_runner.py)."""
import torch

from runners import KVCacheModel, LeanRunner, kernels


def lean_equals_transformers(model, dtype, ids, passes) -> None:
    """Prompt, decoding and verification ``passes`` ((length, positions fed) pairs over ``ids``) of the
    lean forward on the model's own linears, cast to ``dtype``: transformers' logits over its dynamic
    cache, exactly; the model goes back to float64 after."""
    model = model.to(dtype)
    try:
        with kernels(model, False):
            lean, own = LeanRunner(model), KVCacheModel(model, cache="dynamic")
            for length, n in passes:
                assert torch.equal(lean(ids[:, :length], n), own(ids[:, :length], n)), (length, n)
            assert lean.step_passes == 0
    finally:
        model.to(torch.float64)


def widths_agree(runner: LeanRunner, ids: torch.Tensor) -> torch.Tensor:
    """Positions 20..31 of ``ids`` fed one at a time after a 20-position prompt, then in passes of 2..12:
    the same logits bit for bit at every width. Returns the one-at-a-time logits ``[12, V]``, the
    runner rolled back to the prompt."""
    runner(ids[:, :20], 1)
    alone = torch.cat([runner(ids[:, : 21 + i], 1) for i in range(12)])
    for width in range(2, 13):
        runner.rollback(20)
        got = torch.cat([runner(ids[:, : min(20 + w0 + width, 32)], min(width, 12 - w0)) for w0 in range(0, 12, width)])
        assert torch.equal(got, alone), width
    runner.rollback(20)
    return alone
