"""The benchmark's llama.cpp peer: llama-bench's plain decoding of a GGUF, alternated with target AR."""
import json
import statistics
from pathlib import Path
from typing import List

from app.bench.configs import baseline


def llama_cpp_tokens_per_s(binary: str, gguf: str, new_tokens: int, depth: int, threads: int) -> float:
    """llama.cpp's plain decoding speed (llama-bench's text-generation test, one repetition), tokens/s."""
    import subprocess

    base = [binary, "-m", gguf, "-p", "0", "-n", str(new_tokens), "-r", "1", "-t", str(threads), "-o", "json"]
    for command in (base + ["-d", str(depth)], base):  # -d (context depth) only in newer llama-bench
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode == 0:
            rows = json.loads(done.stdout)
            return float(next(r["avg_ts"] for r in rows if r.get("n_gen", 0) > 0))
    raise RuntimeError(f"{binary} failed: {' '.join(done.stderr.strip()[-300:].split())}")


def llama_cpp_report(bench, args, prompt: List[int]) -> str:
    """Target AR and llama.cpp's decoding of the same GGUF, alternated ``--repeats`` times (at least 3); a
    llama-bench that fails (or answers no text-generation row) is a line of the section, with its reason."""
    import torch

    from utils.models import embedded_gguf

    gguf = args.gguf or str(embedded_gguf())
    threads = args.threads or torch.get_num_threads()
    ours, theirs = [], []
    title = f"\n## llama.cpp, plain decoding of {Path(gguf).name} ({threads} threads), alternating with target AR\n\n"
    for _ in range(max(3, args.repeats)):
        ours.append(bench.run(baseline(), prompt).tokens_per_second)
        try:
            theirs.append(llama_cpp_tokens_per_s(args.llama_cpp, gguf, args.max_new_tokens, len(prompt), threads))
        except (RuntimeError, OSError, ValueError, KeyError, StopIteration) as error:  # the peer's failure: said, not the end
            return title + f"llama.cpp failed: {type(error).__name__}: {' '.join(str(error).split())}\n"
    ratio = statistics.median(a / b for a, b in zip(ours, theirs))
    return (title + "| | tokens/s |\n| --- | ---: |\n"
            f"| llama.cpp | {statistics.median(theirs):.1f} |\n| target AR | {statistics.median(ours):.1f} |\n"
            f"| target AR / llama.cpp | {ratio:.2f}x |\n")
