"""Bytes a first start holds (issue 71): a float32 model loaded, its weights copied into torch's
allocator (a model mapped from its safetensors file is not counted there: ``utils.allocations``), then
started as the programs start it (``measure.startup``, every measurement made afresh in a cache folder
of its own, so nothing saved is reused or overwritten) and run for a few tokens; prints the most
bytes held in the kernel measurement and from the start to the last token, against the float32 weights.
No time is printed: the figure is a count of bytes, the same on a busy machine.

    .venv/bin/python scripts/start_bytes.py                      # the embedded SmolLM2-135M
    .venv/bin/python scripts/start_bytes.py --target FOLDER      # another model (the pair's target)
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="a model folder (default: the embedded SmolLM2-135M)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens the first run generates")
    args = parser.parse_args()
    from utils.models import embedded_model_dir

    folder = Path(args.target) if args.target else embedded_model_dir()
    fresh_cache()
    from transformers import AutoModelForCausalLM

    import measure.timing as timing
    from measure import Options, startup
    from runners import LeanRunner
    from runners.config import EAGER
    from utils.allocations import counted, tensor_bytes

    torch.set_grad_enabled(False)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    parts, real = [], timing.measure_kernels

    def measured(*a, **k):
        with parts[0].part("measurement"):
            return real(*a, **k)

    timing.measure_kernels = measured
    with counted() as held:
        parts.append(held)
        for parameter in model.parameters():  # in the allocator, where the counter sees them (and their frees)
            parameter.data = parameter.data.clone()
        weights = tensor_bytes(*model.parameters(), *model.buffers())
        with held.part("start"):
            found = startup(model, EAGER, Options(say=lambda line: print(line, flush=True)))
            runner, ids = LeanRunner(model), torch.tensor([[1, 2, 3, 4]])
            for _ in range(args.tokens):
                ids = torch.cat([ids, runner(ids, 1).argmax(-1, keepdim=True)], dim=1)
    print(found.target.kernels.line)
    print(f"float32 weights: {weights:,} bytes")
    for name in ("measurement", "start"):
        if name in held.parts:
            print(f"{name}: at most {held.parts[name]:,} bytes held, {held.parts[name] / weights:.3f}x the float32 weights")


if __name__ == "__main__":
    main()
