"""Where a pass's time goes: one decoding pass (1 position) and one verification pass (5 positions)
after a cached context, on our eager runner (the model's own linears, and prepacked), our compiled
runner and transformers' compiled static-cache forward (what ``generate`` compiles), by operator
group (torch.profiler, self CPU time), the embedded SmolLM2-135M in float32.

    .venv/bin/python scripts/profile_passes.py --out docs/profile.md

"ms a pass" is timed without the profiler (median); the groups are the profiler's self times per
pass, and "Python and framework" is the profiled wall time per pass less every operator's self time
(our runner's per-pass code, dynamo's guards, transformers' Python between the operators).
"""
import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GROUPS = ("linear layers", "output layer", "attention", "cache writes", "other operators", "Python and framework")
_LINEAR = re.compile(r"linear|addmm|aten::mm$|gemm|matmul")
_ATTENTION = re.compile(r"scaled_dot_product|flash_attention|sdpa|softmax|bmm|amax")
_CACHE = re.compile(r"index_copy|index_put|aten::cat$|scatter")


def group(name: str, shapes: list, vocab: int) -> str:
    """The table's group of one profiled operator (by its name; the output layer by a vocabulary-sized input)."""
    lowered = name.lower()
    if _LINEAR.search(lowered):
        wide = any(vocab in (dims or []) for dims in shapes if isinstance(dims, list))
        return "output layer" if wide else "linear layers"
    if _ATTENTION.search(lowered):
        return "attention"
    if _CACHE.search(lowered):
        return "cache writes"
    return "other operators"


class Pass:
    """One runner over a cached context of ``context`` tokens: ``step(rows)`` feeds ``rows`` more
    positions and forgets them again, so every repeat times the same pass."""

    def __init__(self, name: str, setup: Callable[[], None], step: Callable[[int], None]):
        self.name, self.setup, self.step = name, setup, step


def our_pass(name: str, runner, ids) -> Pass:
    context = ids.shape[1] - 16

    def setup():
        runner(ids[:, :context], 1)

    def step(rows: int):
        runner(ids[:, : context + rows], rows)
        runner.rollback(context)

    return Pass(name, setup, step)


def transformers_pass(model, ids) -> Pass:
    """transformers' compiled forward as ``generate`` builds it (``get_compiled_call`` with the
    ``CompileConfig`` of ``peers.hf_generate_static``), over its ``StaticCache``, ``logits_to_keep``
    as ``generate`` (1) and assisted generation (the candidates + 1) pass it."""
    import torch
    from transformers import CompileConfig, StaticCache

    from runners import static
    from runners.cache_kind import cache_keyword

    context = ids.shape[1] - 16
    cache = StaticCache(config=model.config, max_cache_len=1024)
    call = model.get_compiled_call(CompileConfig(fullgraph=False, dynamic=False, mode="default"))

    keyword = cache_keyword(model)

    def setup():
        model(input_ids=ids[:, :context], attention_mask=torch.ones_like(ids[:, :context]), **{keyword: cache},
              use_cache=True, logits_to_keep=1)

    def step(rows: int):
        length = context + rows
        call(input_ids=ids[:, context:length], attention_mask=torch.ones((1, length), dtype=torch.long),
             position_ids=torch.arange(context, length).unsqueeze(0), **{keyword: cache}, use_cache=True,
             logits_to_keep=rows)
        static.set_length(cache, context)

    return Pass("transformers compiled", setup, step)


def unfrozen_runner(model):
    """Our compiled runner over a copy of ``model`` whose graphs are built without inductor's freezing."""
    import copy

    import runners.compiled as compiled
    from runners import CompiledRunner, set_prepack

    compiled.FREEZING = False  # read when a graph is built: set by every path that builds one
    twin = copy.deepcopy(model)
    set_prepack(twin, False)
    return CompiledRunner(twin)


def measure(one: Pass, rows: int, repeats: int, vocab: int, windows: List[dict]) -> Dict[str, float]:
    """ms a pass without the profiler (median of ``repeats``), then the groups' ms a pass under it;
    the timed passes' load window (``utils.load``) is appended to ``windows``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from utils.load import LoadMeter

    for _ in range(3):  # builds (compiled paths) and warms up
        one.step(rows)
    times, meter = [], LoadMeter()
    meter.start()
    for _ in range(repeats):
        clock = time.perf_counter()
        one.step(rows)
        times.append(time.perf_counter() - clock)
    window = meter.stop()
    windows.append({"seconds": window.seconds, **window.record()})
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        clock = time.perf_counter()
        for _ in range(repeats):
            one.step(rows)
        wall = time.perf_counter() - clock
    found = {name: 0.0 for name in GROUPS}
    for event in prof.key_averages(group_by_input_shape=True):
        found[group(event.key, event.input_shapes, vocab)] += event.self_cpu_time_total / 1000 / repeats
    found["Python and framework"] = max(0.0, wall * 1000 / repeats - sum(found.values()))
    found["ms a pass"] = statistics.median(times) * 1000
    found["profiled ms a pass"] = wall * 1000 / repeats
    del torch
    return found


def top_operators(one: Pass, rows: int, count: int = 12) -> List[str]:
    """The ``count`` operators with the most self time over 3 passes (for the table's notes)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            one.step(rows)
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:count]
    return [f"{e.key} {e.self_cpu_time_total / 3000:.2f} ms ({e.count // 3}x)" for e in events]


def table(results: Dict[str, Dict[str, float]]) -> str:
    names = list(results)
    lines = ["| ms a pass | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    for row in ("ms a pass", "profiled ms a pass", *GROUPS):
        label = f"**{row}** (no profiler)" if row == "ms a pass" else row
        lines.append(f"| {label} | " + " | ".join(f"{results[n][row]:.1f}" for n in names) + " |")
    return "\n".join(lines)


def machine() -> str:
    from utils.load import cpu_flags

    model = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")), "unknown CPU")
    return f"{model} ({cpu_flags() or 'no AVX2'}), load average {Path('/proc/loadavg').read_text().split()[0]}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=10, help="passes timed, and passes profiled")
    p.add_argument("--context", type=int, default=200, help="cached positions before the pass")
    p.add_argument("--verify", type=int, default=5, help="positions of the verification pass")
    p.add_argument("--paths", default="eager,eager_prepacked,compiled,compiled_unfrozen,compiled_prepacked,transformers")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--top", action="store_true", help="also list each path's heaviest operators")
    p.add_argument("--out", help="write the tables (markdown) here, else print them")
    args = p.parse_args()

    import torch
    import torch._inductor.config

    import runners.compiled as compiled
    from runners import CompiledRunner, KVCacheModel, set_prepack
    from utils.load import LoadSummary
    from utils.models import load_embedded

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    torch._inductor.config.cpp.enable_kernel_profile = True  # inductor's fused kernels by name in the profile
    model, tokenizer = load_embedded()
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    ids = torch.tensor([tokenizer(text).input_ids[: args.context + 16]])
    vocab = model.config.vocab_size
    makers = {
        "eager": lambda: (set_prepack(model, False), our_pass("eager (own linears)", KVCacheModel(model), ids))[-1],
        "eager_prepacked": lambda: (set_prepack(model, True), our_pass("eager (prepacked)", KVCacheModel(model), ids))[-1],
        "compiled": lambda: (set_prepack(model, False), setattr(compiled, "FREEZING", True), our_pass("ours compiled", CompiledRunner(model), ids))[-1],
        "compiled_unfrozen": lambda: our_pass("ours compiled (own linears, not frozen)", unfrozen_runner(model), ids),
        "compiled_prepacked": lambda: (set_prepack(model, True),
                                       our_pass("ours compiled (prepacked)", CompiledRunner(model), ids))[-1],
        "transformers": lambda: (set_prepack(model, False), transformers_pass(model, ids))[-1],
    }
    sections, notes, started = [], [], time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before, windows = machine(), []
    for rows in (1, args.verify):
        results = {}
        for key in args.paths.split(","):
            one = makers[key]()
            one.setup()
            results[one.name] = measure(one, rows, args.repeats, vocab, windows)
            if args.top:
                notes.append(f"- {one.name}, {rows} position(s): " + "; ".join(top_operators(one, rows)))
            print(f"{one.name}, {rows} position(s): {results[one.name]['ms a pass']:.1f} ms", file=sys.stderr)
        sections.append(f"### {'Decoding pass (1 position)' if rows == 1 else f'Verification pass ({rows} positions)'}\n\n"
                        + table(results))
    command = "`.venv/bin/python scripts/profile_passes.py " + " ".join(sys.argv[1:]) + "`"
    text = (f"Measured {started}, {args.context} cached positions, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads; {load_before} at the start, {machine().rsplit(', ', 1)[1]} at the end:\n"
            f"{command}\n\n{LoadSummary.of(windows).line()}\n\n" + "\n\n".join(sections) + ("\n\nHeaviest operators:\n\n" + "\n".join(notes) if notes else "") + "\n")
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
