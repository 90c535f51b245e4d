"""What this CPU can do for a 135M-parameter decoding pass, kernel by kernel: memory bandwidth, the
linear layers of SmolLM2-135M's shapes (30 layers, random weights) on MKL with 1 and 2 threads, by
1 and 5 rows, in bfloat16, inductor's C++ GEMM templates against MKL, torch's int8 weight-only
kernel, and grouped-query attention over a static cache with and without SDPA's ``enable_gqa``.

    ../shared/tools/quiet -- .venv/bin/python scripts/cpu_kernels.py

Medians of repeated runs; each figure's load window (``utils.load``) ends in one QUIET/NOISY line.
"""
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, List

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from utils.load import LoadMeter, LoadSummary, cpu_flags  # noqa: E402
from measure.machine import cpu_model  # noqa: E402

SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # q k v o gate up down
LAYERS = 30
windows: List[dict] = []


def median_ms(run: Callable[[], object], repeats: int = 10) -> float:
    for _ in range(3):
        run()
    meter, times = LoadMeter(), []
    meter.start()
    for _ in range(repeats):
        clock = time.perf_counter()
        run()
        times.append(time.perf_counter() - clock)
    window = meter.stop()
    windows.append({"seconds": window.seconds, **window.record()})
    return statistics.median(times) * 1000


def layers_run(weights, rows: int, dtype=torch.float32, linear: Callable = F.linear) -> Callable[[], None]:
    inputs = {width: torch.randn(rows, width, dtype=dtype) for width in (576, 1536)}

    def run():
        for layer in weights:
            for weight in layer:
                linear(inputs[weight.shape[1]], weight)
    return run


def compiled_ms(rows: int, templates: bool) -> float:
    """8 layers of q/gate/down-sized linears with residuals, frozen, MKL or the templates autotuned against it."""
    import torch._inductor.config as inductor

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.ModuleList([torch.nn.Linear(576, 576, bias=False), torch.nn.Linear(
                576, 1536, bias=False), torch.nn.Linear(1536, 576, bias=False)]) for _ in range(8))

        def forward(self, x):
            for a, b, c in self.layers:
                x = x + a(x)
                x = x + c(F.silu(b(x)))
            return x

    torch._dynamo.reset()
    model, x = Stack().eval(), torch.randn(1, rows, 576)
    options = {"freezing": True, **({"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"} if templates else {})}
    with inductor.patch(**options):
        graph = torch.compile(model, fullgraph=True, dynamic=False)
        graph(x)
    return median_ms(lambda: graph(x), 20)


def main() -> None:
    torch.set_grad_enabled(False)
    print(f"{cpu_model()} ({cpu_flags() or 'no AVX2'}), torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    big = torch.randn(64 * 1024 * 1024)
    ms = median_ms(lambda: big.sum())
    print(f"| measure | ms | GB/s |\n| --- | ---: | ---: |\n| read 256 MB (sum) | {ms:.1f} | {big.numel() * 4 / ms / 1e6:.1f} |")
    weights = [[torch.randn(o, i) for o, i in SHAPES] for _ in range(LAYERS)]
    megabytes = sum(o * i for o, i in SHAPES) * LAYERS * 4 / 1e6
    threads = torch.get_num_threads()
    for count in sorted({1, threads}):
        torch.set_num_threads(count)
        ms = median_ms(layers_run(weights, 1))
        print(f"| 30 layers' linears ({megabytes:.0f} MB), 1 row, MKL, {count} thread(s) | {ms:.1f} | {megabytes / ms:.1f} |")
    torch.set_num_threads(threads)
    for rows in (2, 5, 8, 12):
        ms = median_ms(layers_run(weights, rows))
        print(f"| the same, {rows} rows, MKL | {ms:.1f} | {megabytes / ms:.1f} |")
    from kernels import skinny

    if skinny.available()[0]:
        for rows in (1, 2, 5, 8, 12):
            ms = median_ms(layers_run(weights, rows, linear=lambda x, w: skinny.skinny_linear(x, w, None)))
            print(f"| the same, {rows} row(s), the skinny kernel (`kernels/skinny_gemm.c`) | {ms:.1f} | {megabytes / ms:.1f} |")
    else:
        print(f"| the skinny kernel | - | - | ({skinny.available()[1]})")
    halves = [[w.to(torch.bfloat16) for w in layer] for layer in weights]
    for rows in (1, 5):
        ms = median_ms(layers_run(halves, rows, torch.bfloat16), 5)
        print(f"| the same in bfloat16, {rows} row(s) | {ms:.1f} | {megabytes / 2 / ms:.1f} |")
    head, x = torch.randn(49152, 576), torch.randn(1, 576)
    ms = median_ms(lambda: F.linear(x, head))
    print(f"| output layer (49,152 x 576), 1 row, MKL | {ms:.1f} | {head.numel() * 4 / ms / 1e6:.1f} |")
    packed, scales = torch.randint(-127, 127, (49152, 576), dtype=torch.int8), torch.rand(49152)
    ms = median_ms(lambda: torch.ops.aten._weight_int8pack_mm(x, packed, scales))
    print(f"| the same, int8 weight-only (`_weight_int8pack_mm`) | {ms:.1f} | {packed.numel() / ms / 1e6:.1f} |")
    stack = 8 * (576 * 576 + 2 * 576 * 1536) * 4 / 1e6
    for rows in (1, 8):
        for templates in (False, True):
            ms = compiled_ms(rows, templates)
            name = "inductor C++ GEMM templates autotuned against MKL" if templates else "MKL"
            print(f"| 8 compiled frozen layers ({stack:.0f} MB), {rows} row(s), {name} | {ms:.2f} | {stack / ms:.1f} |")
    for rows in (1, 8):
        query, key, value = torch.randn(1, 9, rows, 64), torch.randn(1, 3, 1024, 64), torch.randn(1, 3, 1024, 64)
        mask = torch.zeros(1, 1, rows, 1024, dtype=torch.bool)
        mask[..., :200 + rows] = True
        copied = (lambda: F.scaled_dot_product_attention(query, key.repeat_interleave(3, 1), value.repeat_interleave(3, 1),
                                                         attn_mask=mask))
        shared = (lambda: F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True))
        print(f"| attention, {rows} row(s) over a 1,024-slot cache, key/value heads copied (x30 layers) | "
              f"{30 * median_ms(copied, 100):.2f} | - |")
        print(f"| the same, heads shared in the kernel (`enable_gqa`) | {30 * median_ms(shared, 100):.2f} | - |")
    print(f"\n{LoadSummary.of(windows).line()}")


if __name__ == "__main__":
    main()
