"""Interleaved A/B on llama.cpp's kernels (one GGUF file, greedy): llama.cpp alone (llama-cpp-python's
own decoding loop, and its own prompt lookup), against this project's loops on ``LlamaCppRunner``:
target AR, prompt lookup and n-gram assisted speculative decoding (NASD). Medians of the repeats,
ratios against llama.cpp alone within the run; each row says whether its tokens are llama.cpp alone's.
Needs llama-cpp-python (make llama-cpp; docs/llama-cpp.md); run with the venv that has it:

    /work/llama-venv/bin/python scripts/llama_runner_ab.py --repeats 3 --new-tokens 128
"""
import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def chat_ids(gguf, text: str) -> List[int]:
    """``text`` as one user turn through the file's own chat template (llama.cpp's), else as it is."""
    lib = gguf_library()
    template = lib.llama_model_chat_template(gguf.handle, None)
    if not template:
        return gguf.tokenize(text)
    messages = (lib.llama_chat_message * 1)(lib.llama_chat_message(b"user", text.encode("utf-8")))
    room = 4 * len(text) + 512
    buffer = ctypes.create_string_buffer(room)
    count = lib.llama_chat_apply_template(template, messages, 1, True, buffer, room)
    return gguf.tokenize(buffer.raw[:count].decode("utf-8", "replace")) if 0 < count <= room else gguf.tokenize(text)


def gguf_library():
    from runners.llama_model import library

    return library()


def rows(path: Path, new_tokens: int, ends: List[int], vocab: int, threads: int) -> Dict[str, Callable[[List[int]], List[int]]]:
    """name -> run(prompt) -> new tokens, for each row of the A/B."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from drafters import PromptLookupSpec
    from ngram_assisted import ngram_assisted_speculative_generate
    from ngram_assisted.ngram_storage import NGramStorage
    from runners.llama_cpp import LlamaCppRunner
    from sampling import GenerationConfig, generate
    from sampling.base_decoding import generate_with

    def alone(llm) -> Callable[[List[int]], List[int]]:
        def run(prompt: List[int]) -> List[int]:
            out: List[int] = []
            for token in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
                out.append(int(token))
                if token in ends or len(out) >= new_tokens:
                    break
            return out
        return run

    options = dict(n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)
    plain = Llama(str(path), **options)
    lookup = Llama(str(path), draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10), **options)
    config = dict(max_gen_len=new_tokens, eos_tokens_id=ends, use_cache=True)
    return {
        "llama.cpp alone": alone(plain),
        "llama.cpp's prompt lookup": alone(lookup),
        "target AR (LlamaCppRunner)": lambda p: generate_with(
            p, LlamaCppRunner(path), GenerationConfig(max_gen_len=new_tokens, stop_tokens=frozenset(ends))),
        "prompt lookup (LlamaCppRunner)": lambda p: generate(p, LlamaCppRunner(path), PromptLookupSpec(num_pred_tokens=10), config)[0],
        "NASD basic n=3 (LlamaCppRunner)": lambda p: ngram_assisted_speculative_generate(
            p, NGramStorage(3, vocab), LlamaCppRunner(path), gamma=4, **config)[0],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gguf", help="the GGUF file (default: the embedded model's)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--categories", default="summarization,extraction,rag", help="prompts of bench_prompts.jsonl, one of each")
    args = p.parse_args()

    import torch

    from runners.llama_model import gguf_model, llama_cpp_missing
    from utils.models import embedded_gguf

    if llama_cpp_missing():
        sys.exit(f"error: {llama_cpp_missing()}")
    torch.set_grad_enabled(False)
    path = Path(args.gguf) if args.gguf else embedded_gguf()
    gguf, threads = gguf_model(path), torch.get_num_threads()
    wanted = args.categories.split(",")
    prompts, seen = [], set()
    for line in (ROOT / "bench_prompts.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["category"] in wanted and record["category"] not in seen:
            seen.add(record["category"])
            prompts.append(chat_ids(gguf, record["turns"][0]))
    runs = rows(path, args.new_tokens, gguf.end_tokens(), gguf.n_vocab, threads)
    speed: Dict[str, List[float]] = {name: [] for name in runs}
    same: Dict[str, bool] = {name: True for name in runs}
    for repeat in range(args.repeats + 1):  # the first round warms up, untimed
        for prompt in prompts:
            reference = None
            for name, run in runs.items():
                start = time.perf_counter()
                out = run(prompt)
                seconds = time.perf_counter() - start
                reference = out if reference is None else reference
                same[name] &= out == reference
                if repeat:
                    speed[name].append(len(out) / seconds)
    base = statistics.median(speed["llama.cpp alone"])
    print(f"{gguf.description}, {threads} threads, {len(prompts)} prompts x {args.repeats} repeats, "
          f"{args.new_tokens} new tokens at most, greedy")
    print("| row | tokens/s | vs llama.cpp alone | tokens = llama.cpp alone's |\n| --- | ---: | ---: | --- |")
    for name, values in speed.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.1f} | {median / base:.2f}x | {'yes' if same[name] else 'no'} |")


if __name__ == "__main__":
    main()
