"""Answer tokens per second of the head's answer writers on the embedded model: ours
(``eagle.writer``, refilled static-cache rows) against transformers' ``generate`` in left-padded
batches (``eagle.data._generate``, the writer before it), on the same questions, greedy, in float32
and bfloat16 at batch sizes 16 and 64. Each timed run's load window (``utils.load``) ends the
table in one QUIET/NOISY line; "rows equal" counts the answers ours writes token for token as
transformers' did (a near-tie may flip in bfloat16).

    ../shared/tools/quiet -- .venv/bin/python scripts/answer_rate.py --questions 128

The questions are each of ``eagle.data.OPENERS`` followed by a topic of ours, in the chat template.
"""
import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Callable, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle.data import OPENERS, _batches, _generate  # noqa: E402
from eagle.writer import write_answers  # noqa: E402
from utils.load import LoadMeter, LoadSummary  # noqa: E402

TOPICS = ("the sea", "a small town", "prime numbers", "a broken clock", "bees", "the moon landing", "a sorting list",
          "rain in spring", "a chess game", "bread", "the printing press", "a lost key", "volcanoes", "a budget")


def questions(tokenizer, count: int) -> List[List[int]]:
    """``count`` chat prompts (ids): opener ``i % len(OPENERS)`` on topic ``i % len(TOPICS)``."""
    out = []
    for i in range(count):
        text = f"{OPENERS[i % len(OPENERS)]} {TOPICS[i % len(TOPICS)]}."
        chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        out.append(tokenizer(chat, add_special_tokens=False).input_ids)
    return out


def timed(run: Callable[[], List[List[int]]], windows: list):
    meter = LoadMeter()
    meter.start()
    clock = time.perf_counter()
    answers = run()
    seconds = time.perf_counter() - clock
    window = meter.stop()
    windows.append({"seconds": window.seconds, **window.record()})
    return answers, seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", type=int, default=128)
    p.add_argument("--answer-tokens", type=int, default=192)
    p.add_argument("--batches", default="16,64")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--compile", action="store_true", help="compile our decoding pass (CUDA graphs on CUDA)")
    args = p.parse_args()
    from measure.machine import cpu_model
    from utils.models import end_tokens, load_model

    torch.set_grad_enabled(False)
    model, tokenizer, label = load_model(None, device=args.device, dtype="float32", say=lambda text: None)
    stop, prompts, windows = end_tokens(model, tokenizer), questions(tokenizer, args.questions), []
    print(f"{label} on {args.device} ({cpu_model()}, {torch.get_num_threads()} threads), torch {torch.__version__}; "
          f"{len(prompts)} questions, at most {args.answer_tokens} answer tokens each\n")
    print("| dtype | batch | writer | answer tokens | seconds | tokens/s | x transformers | rows equal |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for dtype in args.dtypes.split(","):
        writer = copy.deepcopy(model).to(getattr(torch, dtype))
        for batch in map(int, args.batches.split(",")):
            def theirs():
                return [a for group in _batches(prompts, batch) for a in _generate(writer, list(group), args.answer_tokens, None, stop)]

            def ours():
                return write_answers(writer, prompts, args.answer_tokens, stop, batch, compile=args.compile)

            reference, seconds = timed(theirs, windows)
            base = sum(map(len, reference)) / seconds
            print(f"| {dtype} | {batch} | transformers | {sum(map(len, reference))} | {seconds:.1f} | {base:.1f} | 1.00 | - |")
            answers, seconds = timed(ours, windows)
            rate, equal = sum(map(len, answers)) / seconds, sum(a == b for a, b in zip(answers, reference))
            print(f"| {dtype} | {batch} | ours | {sum(map(len, answers))} | {seconds:.1f} | {rate:.1f} | {rate / base:.2f} | "
                  f"{equal}/{len(prompts)} |", flush=True)
        del writer
    print(f"\n{LoadSummary.of(windows).line()}")


if __name__ == "__main__":
    main()
