"""Issue 72's CPU table: each family at a published config (``scripts/family_shapes.py``: Qwen3-0.6B,
Gemma-3-270M and 1B, OLMo-2-1B, SmolLM3-3B), random weights (transformers' own initialization, seed
0), float32, one model at a time (each freed, and checked freed, before the next is built), on the C
step. Prints a markdown table, one line a shape:

- the bytes a pass reads of the weights (the step's blocked linears, q/k/v and gate/up fused, and its
  output layer's copy);
- the C step's decoding: target AR on the lean runner, greedy, the ``--tokens - 1`` one-position passes
  after the prompt's pass, in ms a token and tokens/s (median of ``--repeats``);
- a torch read of the same bytes: a plain float32 sum over those very tensors (``step_bound.py``'s
  read, over the step's own weights rather than a buffer of their size: a second copy of SmolLM3-3B,
  12 GB, would not fit beside it), the median of ``READS`` a repeat;
- decode / read: the median over repeats of each repeat's ratio (a decode and a read interleaved),
  with its 95% bootstrap interval over the repeats (``app.bench.intervals``);
- the greedy drafting rows (prompt lookup, NASD, an n-gram tree) on the step against target AR: the
  prompts on which a row's tokens differ (0 expected: the step is row-invariant), each with where and
  by how much target AR's logit of its own token beat the row's (a near-tie flip has a tiny margin),
  and the row's acceptance rate (a row that accepted nothing verified nothing).

    ../shared/tools/quiet -- .venv/bin/python scripts/family_table.py       # the figures (a timing: run alone)
    .venv/bin/python scripts/family_table.py --tiny --tokens 8 --repeats 2  # a rehearsal: tiny sizes, no figure
"""
import argparse
import gc
import statistics
import sys
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from family_shapes import SHAPES, asked_shapes, build, first_difference, prompt_ids  # noqa: E402
from step_bound import median_seconds  # noqa: E402  (its warm call, then the median of ``rounds``)

READS = 5  # plain sums a repeat; their median is that repeat's read
ROWS = ("prompt lookup", "NASD", "n-gram tree")


@dataclass
class Row:
    """One shape's line: ``decode`` in seconds a token and ``read`` in seconds, per repeat; ``rows``: each
    greedy row's cell; ``refused``: why the C step cannot take the model (then nothing else is set)."""

    shape: str
    family: str
    how: str = ""  # how the greedy rows' passes run (the header's words)
    size: int = 0  # bytes a pass reads of the weights
    decode: Tuple[float, ...] = ()
    read: Tuple[float, ...] = ()
    rows: Optional[Dict[str, str]] = None
    refused: str = ""


def step_tensors(runner) -> List[Tensor]:
    """What a C step pass reads of the weights (after the runner's first pass made the step): each layer's
    blocked q/k/v, o, gate/up and down, and the output layer's blocked copy."""
    from kernels.one_copy import group_blocks, groups

    model = runner.model
    found = [group_blocks(g) for layer in model.model.layers[: model.config.num_hidden_layers] for g in groups(layer)]
    if any(t is None for t in found):  # the step then reads copies of its own beside the weights (no oneDNN here)
        raise SystemExit("the layers' weights were not released into the step's blocked copies: no read of the same bytes")
    return found + [runner.step.head]


def decode(runner, prompt: List[int], tokens: int) -> Tuple[List[int], float]:
    """Target AR on ``runner`` from an empty cache: the prompt's pass (untimed), then ``tokens - 1``
    one-position passes, timed; the ``tokens`` new tokens and the seconds a timed pass."""
    length = len(prompt)
    ids = torch.zeros((1, length + tokens), dtype=torch.long)  # written in place: no allocation a step
    ids[0, :length] = torch.tensor(prompt)
    runner.rollback(0)
    ids[0, length] = runner(ids[:, :length])[-1].argmax()
    start = time.perf_counter()
    for at in range(length + 1, length + tokens):
        ids[0, at] = runner(ids[:, :at])[-1].argmax()
    return ids[0, length:].tolist(), (time.perf_counter() - start) / (tokens - 1)


def greedy_rows(model, prompt: List[int], tokens: int) -> Tuple[List[int], Dict[str, Tuple[List[int], float]]]:
    """Target AR and each drafting row (as ``tests/test_families.py`` drives them), greedy, on the
    model's default CPU runner (the C step): target AR's tokens, each row's tokens and acceptance rate."""
    from drafters import DraftContext, NGramTreeSpec, PromptLookupSpec
    from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
    from sampling import autoregressive_generate, generate

    common, vocab = dict(max_gen_len=tokens, eos_tokens_id=[], use_cache=True), model.config.vocab_size
    reference = autoregressive_generate(prompt, model, **common)
    runs = (generate(prompt, model, PromptLookupSpec(), common),
            ngram_assisted_speculative_generate(prompt, NGramStorage(2, vocab), model, gamma=4, **common),
            generate(prompt, model, NGramTreeSpec(tree_size=4), common, DraftContext(storage=NGramStorage(2, vocab))))
    return reference, dict(zip(ROWS, runs))


def margin(model, prompt: List[int], reference: List[int], tokens: List[int]) -> str:
    """Where ``tokens`` leave target AR's ``reference``, and target AR's logit of its own token there
    minus its logit of the row's (a fresh lean runner's pass)."""
    from runners import LeanRunner

    i = first_difference(tokens, reference)
    if i >= min(len(tokens), len(reference)):
        return f"ends at token {i}"
    logits = LeanRunner(model)(torch.tensor([prompt + reference[:i]]))[-1]
    return f"token {i}, margin {(logits[reference[i]] - logits[tokens[i]]).item():.2e}"


def cells(model, prompts: List[List[int]], tokens: int, timed: List[int]) -> Dict[str, str]:
    """Each row's cell over ``prompts``: "0 (accept 0.42)", or the count with each flip's place and margin.
    ``timed``: the timed loop's tokens on the first prompt, which must be target AR's (else the table
    would time another sequence than the rows check)."""
    flips: Dict[str, List[str]] = {row: [] for row in ROWS}
    rates: Dict[str, List[float]] = {row: [] for row in ROWS}
    for k, prompt in enumerate(prompts):
        reference, runs = greedy_rows(model, prompt, tokens)
        if k == 0 and reference != timed:
            raise SystemExit(f"target AR's tokens are not the timed loop's (from token {first_difference(reference, timed)})")
        for row, (out, rate) in runs.items():
            rates[row].append(rate)
            if out != reference:
                flips[row].append(margin(model, prompt, reference, out))
    return {row: f"{len(flips[row])}{': ' + '; '.join(flips[row]) if flips[row] else ''} (accept {statistics.mean(rates[row]):.2f})"
            for row in ROWS}


def measure(name: str, args) -> Tuple[Row, "weakref.ref"]:
    """One shape: built, timed, its rows checked; the row and a weak reference to the model (dead once
    this returns, or the next shape would not fit beside it)."""
    from kernels.c_step import step_unsupported
    from models.layer_spec import family_name
    from runners import LeanRunner, RunnerConfig, lean_unsupported

    model = build(name, args.tiny, torch.float32, "cpu")
    row, alive = Row(name + (" (tiny)" if args.tiny else ""), family_name(model)), weakref.ref(model)
    refused = lean_unsupported(model) or step_unsupported(model)
    if refused is not None:
        row.refused = refused
        return row, alive
    row.how = RunnerConfig().describe(model)
    prompts = [prompt_ids(model.config.vocab_size, args.prompt, seed=1 + k) for k in range(args.prompts)]
    runner = LeanRunner(model)
    timed, _ = decode(runner, prompts[0], args.tokens)  # warm: the step made, the weights released into it
    tensors = step_tensors(runner)
    row.size = sum(t.numel() * t.element_size() for t in tensors)
    read = lambda: [t.sum() for t in tensors]  # noqa: E731
    times = [(median_seconds(read, READS), decode(runner, prompts[0], args.tokens)[1]) for _ in range(args.repeats)]
    if runner.step_passes != runner.forward_passes:
        raise SystemExit(f"{name}: {runner.forward_passes - runner.step_passes} passes left the C step")
    row.read, row.decode = tuple(r for r, _ in times), tuple(d for _, d in times)
    del runner, tensors, read
    row.rows = cells(model, prompts, args.tokens, timed)
    return row, alive


def table(found: List[Row]) -> List[str]:
    """The markdown table's lines."""
    from app.bench.intervals import ratio_cell, ratio_interval

    lines = ["| shape | family | weights read a pass (MB) | decode (ms/token) | tokens/s | read (ms) | decode / read [95%] | "
             + " | ".join(ROWS) + " |", "|---" * (7 + len(ROWS)) + "|"]
    for row in found:
        if row.refused:
            lines.append(f"| {row.shape} | {row.family} | the C step refuses it: {row.refused} |")
            continue
        ratios = [d / r for d, r in zip(row.decode, row.read)]
        interval = ratio_interval({(0, i): [1, r] for i, r in enumerate(row.read)}, {(0, i): [1, d] for i, d in enumerate(row.decode)})
        ms, read = 1e3 * statistics.median(row.decode), 1e3 * statistics.median(row.read)
        lines.append(f"| {row.shape} | {row.family} | {row.size / 1e6:.1f} | {ms:.2f} | {1e3 / ms:.1f} | {read:.2f} | "
                     f"{ratio_cell(statistics.median(ratios), interval)} | " + " | ".join(row.rows[r] for r in ROWS) + " |")
    return lines


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)} (default: all)")
    p.add_argument("--tokens", type=int, default=32, help="new tokens a generation (default 32)")
    p.add_argument("--prompt", type=int, default=32, help="prompt positions (default 32; its second half repeats the first)")
    p.add_argument("--repeats", type=int, default=3, help="timed decodes and reads, interleaved (default 3)")
    p.add_argument("--prompts", type=int, default=1, help="prompts the greedy rows run on (default 1)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes with each shape's features: a rehearsal, no figure")
    return p


def main(argv: Optional[List[str]] = None) -> None:
    args = parser().parse_args(argv)
    from kernels import skinny
    from measure.machine import busy_note, cpu_model

    asked_shapes(args.shapes)
    if args.tokens < 2 or args.repeats < 1 or args.prompts < 1:
        raise SystemExit("error: --tokens must be at least 2, --repeats and --prompts at least 1")
    if not skinny.available()[0]:
        raise SystemExit(f"the skinny kernel is not built here: {skinny.available()[1]}")
    torch.set_grad_enabled(False)
    print(f"CPU: {cpu_model()} · {torch.get_num_threads()} threads · torch {torch.__version__} · float32, random weights "
          f"(seed 0) · prompt of {args.prompt} positions, {args.tokens} tokens, median of {args.repeats} repeats "
          f"({READS} reads each) · greedy rows on {args.prompts} prompt(s) {busy_note()}".rstrip(), flush=True)
    found = []
    for name in args.shapes.split(","):
        clock = time.perf_counter()
        row, alive = measure(name, args)
        gc.collect()
        if alive() is not None:
            raise SystemExit(f"{name}: the model is still held after its row: the next one would not fit beside it")
        found.append(row)
        print(f"{row.shape}: done in {time.perf_counter() - clock:.0f} s; passes: {row.how or row.refused}", flush=True)
    print("\n" + "\n".join(table(found)))


if __name__ == "__main__":
    main()
