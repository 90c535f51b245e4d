"""Bytes a first start holds (issue 71): a model (and a drafter) loaded, their weights copied into torch's
allocator (a model mapped from its safetensors file is not counted there: ``utils.allocations``), then
started as the programs start them (``measure.startup``, every measurement made afresh in a cache folder
of its own, so nothing saved is reused or overwritten) and run for a few tokens each; prints the most
bytes held in the kernel measurement and from the start to the last token, against the float32 weights
and the issue's limit (1.2x the float32 weights plus 1 GB; in bfloat16 half of that).
No time is printed: the figure is a count of bytes, the same on a busy machine.

    .venv/bin/python scripts/start_bytes.py                      # the embedded SmolLM2-135M
    .venv/bin/python scripts/start_bytes.py --target FOLDER      # another model
    .venv/bin/python scripts/start_bytes.py --pair [--dtype bfloat16]  # the Qwen2.5-Coder pair (make fetch-pair)
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Optional, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def fresh_cache() -> None:
    """A cache folder of this run's own, the user's converted models and built kernels linked in, no
    saved measurement: the start is a first start (set before anything reads the folder)."""
    from utils.models import cache_dir

    users, own = cache_dir(), Path(tempfile.mkdtemp(prefix="specdec-start-bytes-"))
    for entry in users.glob("*") if users.is_dir() else ():
        if entry.is_dir() and entry.name not in ("measurements", "inductor", "eagle"):
            (own / entry.name).symlink_to(entry, target_is_directory=True)
    os.environ["SPECDEC_CACHE"] = str(own)


GB = 1 << 30
LIMIT = 1.2  # the most a start may hold, in float32 weights, plus ``SLACK`` (issue 71), halved in bfloat16
SLACK = 1 * GB


def folders(args: argparse.Namespace) -> Tuple[Path, Optional[Path]]:
    """The target's folder and the drafter's (None: no drafter)."""
    from utils.models import embedded_model_dir, gguf_model_dir

    if args.pair:
        from utils import pair

        if not pair.installed():
            raise SystemExit(f"the pair is not installed: {pair.INSTALL_HINT}")
        return gguf_model_dir(pair.gguf_path(pair.TARGET)), gguf_model_dir(pair.gguf_path(pair.DRAFTER))
    return (Path(args.target) if args.target else embedded_model_dir()), (Path(args.drafter) if args.drafter else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="a model folder (default: the embedded SmolLM2-135M)")
    parser.add_argument("--drafter", help="a drafter's model folder, started beside the target")
    parser.add_argument("--pair", action="store_true", help="the Qwen2.5-Coder 1.5B target and 0.5B drafter (make fetch-pair)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--tokens", type=int, default=16, help="tokens the first run generates with each model")
    args = parser.parse_args()
    target_dir, drafter_dir = folders(args)
    fresh_cache()
    from transformers import AutoModelForCausalLM

    import measure.timing as timing
    from measure import Options, startup
    from runners import LeanRunner
    from runners.config import EAGER
    from utils.allocations import counted, tensor_bytes

    torch.set_grad_enabled(False)
    dtype = getattr(torch, args.dtype)
    models = [AutoModelForCausalLM.from_pretrained(d, dtype=dtype).eval() for d in (target_dir, drafter_dir) if d is not None]
    parts, real = [], timing.measure_kernels

    def measured(*a, **k):
        with parts[0].part("measurement"):
            return real(*a, **k)

    timing.measure_kernels = measured
    with counted() as held:
        parts.append(held)
        for model in models:
            for parameter in model.parameters():  # in the allocator, where the counter sees them (and their frees)
                parameter.data = parameter.data.clone()
        weights = tensor_bytes(*(t for model in models for t in (*model.parameters(), *model.buffers())))
        with held.part("start"):
            found = startup(models[0], EAGER, Options(say=lambda line: print(line, flush=True)), drafter=models[1] if len(models) > 1 else None)
            for model in models:
                runner, ids = LeanRunner(model), torch.tensor([[1, 2, 3, 4]])
                for _ in range(args.tokens):
                    ids = torch.cat([ids, runner(ids, 1).argmax(-1, keepdim=True)], dim=1)
                del runner
    print(found.target.kernels.line)
    float32 = weights * 4 // dtype.itemsize
    limit = (LIMIT * float32 + SLACK) * dtype.itemsize / 4
    print(f"{args.dtype} weights: {weights:,} bytes ({weights / GB:.2f} GiB; float32: {float32 / GB:.2f} GiB); "
          f"limit {limit / GB:.2f} GiB (1.2x the float32 weights + 1 GiB{', halved' if dtype == torch.bfloat16 else ''})")
    for name in ("measurement", "start"):
        if name in held.parts:
            peak = held.parts[name]
            print(f"{name}: at most {peak:,} bytes held ({peak / GB:.2f} GiB), {peak / weights:.3f}x the {args.dtype} weights, "
                  f"{'within' if peak <= limit else 'OVER'} the limit")


if __name__ == "__main__":
    main()
