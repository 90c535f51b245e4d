"""A cached one-position pass with its KV cache (and kept key blocks) on 2 MB pages against one on the allocator's
4 KB pages (``kernels.huge_pages.CACHE``), on the embedded SmolLM2-135M, float32 and bfloat16: two runners of the
same model, one made with the advice off, each ``--context`` positions cached, their passes interleaved in each round
(medians and the fastest), their logits compared (the same bits: only the pages differ), and the cache's bytes on
huge pages (``/proc/self/smaps``' AnonHugePages over the cache's tensors).

    ../shared/tools/quiet -- .venv/bin/python scripts/cache_pages.py --context 800 2000
"""
import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def huge_kb(tensors: list) -> int:
    """AnonHugePages (KB) of the mappings that overlap the tensors' bytes."""
    spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors]
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            low, high = (int(x, 16) for x in head.split("-"))
            inside = any(low < end and start < high for start, end in spans)
        elif inside and line.startswith("AnonHugePages:"):
            total += int(line.split()[1])
    return total


def cache_tensors(runner) -> list:
    kept = getattr(runner.cache, "kept_keys", None)
    return [t for layer in runner.cache.layers for t in (layer.keys, layer.values)] + ([kept.blocks] if kept else [])


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, nargs="+", default=[800])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16"], default=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=0, help="the team's size (default: torch's)")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    from kernels import huge_pages
    from runners import LeanRunner
    from utils.models import load_embedded

    base, tokenizer = load_embedded(torch.float32)
    for context in args.context:
        ids = torch.randint(len(tokenizer), (1, context + 1), generator=torch.Generator().manual_seed(0))
        for name in args.dtypes:
            model = copy.deepcopy(base).to(torch.bfloat16) if name == "bfloat16" else base
            runners = {}
            for pages in ("2 MB", "4 KB"):
                huge_pages.CACHE = pages == "2 MB"
                runners[pages] = LeanRunner(model)
                runners[pages](ids[:, :context], 1)
            huge_pages.CACHE = True
            times, logits = {k: [] for k in runners}, {}
            for round_ in range(args.rounds + 1):  # round 0 warms up
                for pages in runners if round_ % 2 else reversed(list(runners)):
                    runner = runners[pages]
                    runner.rollback(context)
                    start = time.perf_counter()
                    logits[pages] = runner(ids, 1)
                    if round_:
                        times[pages].append(time.perf_counter() - start)
            same = torch.equal(logits["2 MB"], logits["4 KB"])
            for pages, runner in runners.items():
                tensors = cache_tensors(runner)
                mb = sum(t.numel() * t.element_size() for t in tensors) / 1e6
                print(f"{name} context {context}, cache on {pages} pages: pass {statistics.median(times[pages]) * 1e3:.2f} ms "
                      f"(fastest {min(times[pages]) * 1e3:.2f}); {huge_kb(tensors) / 1e3:.0f} of {mb:.0f} MB on huge pages")
            print(f"  logits {'the same' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
