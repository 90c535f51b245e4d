"""A drafting row's host work per step beside target AR's (issue 71): each row of the benchmark runs on one prompt
with its passes replaced by target AR's recorded logits (each row's tops kept on them, as the C step keeps them),
and a fake clock that charges each pass its start-up relative cost times ``--unit`` ms, so that the live policy
decides as in a real run. What is timed is this thread's CPU time (``time.thread_time``, one torch thread): the
loop, the policy, the drafter, the statistics, the tensors around the pass; not the pass (nor the replay's own gathering
of a wide pass's rows, which the C step writes in place: subtracted). Less sensitive to a busy
machine than a wall clock, never a result: read it as shares, interleaved, and say NOISY.

    .venv/bin/python scripts/loop_host.py --categories qa --runs 10 [--profile pld]
"""
import argparse
import cProfile
import collections
import pstats
import sys
import time
import types
from pathlib import Path
from typing import List, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

CHARGED = [0.0]  # seconds the fake clock adds: each replayed pass's cost
REPLAYED = [0.0]  # this thread's CPU seconds in the replayed passes themselves (rows gathered, tops kept): not counted


class RecordedRunner:
    """A ``runners.Runner`` answering each position with target AR's recorded logits row and its tops (a position past
    the record: the last row), charging ``unit`` seconds times ``costs[rows - 1]`` to the fake clock."""

    cache_kind, hidden_layers, hidden, hidden_start, use_cache = "static", (), None, 0, True

    def __init__(self, model, prompt_length: int, rows: torch.Tensor, tops: List[tuple], costs: Sequence[float], unit: float):
        self.model, self.device, self.cached, self.forward_passes = model, torch.device("cpu"), 0, 0
        self.prompt_length, self.rows, self.tops, self.costs, self.unit = prompt_length, rows, tops, costs, unit

    def __call__(self, ids: torch.Tensor, n_last: int = 1) -> torch.Tensor:
        from utils.logits_processor import with_tops

        started = time.thread_time()  # a wide pass's rows gathered cost the replay more than the C step's own write
        first = ids.shape[1] - n_last + 1 - self.prompt_length
        at = [min(max(first + r, 0), len(self.rows) - 1) for r in range(n_last)]
        logits = self.rows[at[0] : at[0] + 1] if n_last == 1 else self.rows[at]
        self.cached, self.forward_passes = ids.shape[1], self.forward_passes + 1
        CHARGED[0] += self.unit * self.costs[min(n_last, len(self.costs)) - 1]
        logits = with_tops(logits, [self.tops[i] for i in at])
        REPLAYED[0] += time.thread_time() - started
        return logits

    def rollback(self, length: int) -> None:
        self.cached = min(self.cached, length)


def record(model, prompt: List[int], length: int) -> Tuple[torch.Tensor, List[tuple]]:
    """Target AR's logits rows ``[length, V]`` after ``prompt`` on the lean runner, and each row's (index, top, next)."""
    from runners.lean import LeanRunner

    runner, ids, rows = LeanRunner(model), torch.tensor([prompt]), []
    with torch.no_grad():
        for _ in range(length):
            logits = runner(ids, 1)
            rows.append(logits[0].clone())
            ids = torch.cat([ids, logits.argmax(-1).view(1, 1)], 1)
    rows = torch.stack(rows)
    top2 = rows.topk(2, dim=-1)
    return rows, [(int(i[0]), float(v[0]), float(v[1])) for v, i in zip(top2.values, top2.indices)]


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="../shared/specbench/question.jsonl")
    parser.add_argument("--categories", default="qa")
    parser.add_argument("--strategies", default="target,ngram,pld,suffix")
    parser.add_argument("--runs", type=int, default=10, help="runs of each row, interleaved")
    parser.add_argument("--unit", type=float, default=19.5, help="ms the fake clock charges a one-position pass")
    parser.add_argument("--profile", nargs="*", default=[], help="labels' starts: also cProfile 20 runs of those rows")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # host work as one thread's CPU time: no reduction split across threads uncounted
    from app.bench.cli import build_parser
    from app.bench.configs import make_configs
    from app.bench.prompts import load_prompts
    from app.bench.run import Bench
    import runners
    import sampling.base_decoding as base_decoding
    import sampling.chain_decoding as chain_decoding
    from sampling.divergence import PassRecorder

    bench_args = build_parser().parse_args(["--prompts", args.prompts, "--categories", args.categories, "--limit", "1",
                                            "--max-new-tokens", "64", "--strategies", args.strategies])
    bench = Bench(bench_args, greedy=True)
    configs = make_configs(bench_args, False, bench.context.head is not None)
    prompt = bench.items(load_prompts(bench_args.prompts, bench_args.categories, 1))[0]["prompt"]
    rows, tops = record(bench.target, prompt, 70)
    runners.make_runner = lambda model, *a, **k: RecordedRunner(model, len(prompt), rows, tops, bench.row_costs, args.unit / 1e3)
    clock = types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + CHARGED[0])
    chain_decoding.time = base_decoding.time = clock  # the loops' clock readings: what the live policy weighs
    cpu, steps, emitted, seen = collections.Counter(), collections.Counter(), collections.Counter(), {}
    for _ in range(args.runs):
        for config in configs:
            recorder = PassRecorder()
            start, replayed = time.thread_time(), REPLAYED[0]
            result = bench.run(config, prompt, recorder)
            cpu[config.label] += time.thread_time() - start - (REPLAYED[0] - replayed)
            steps[config.label] += len(recorder.passes)
            emitted[config.label] += len(result.tokens)
            seen.setdefault(config.label, (result.tokens, recorder.passes))
    reference = seen[configs[0].label][0]
    print(f"NOISY: one thread's CPU time a step and a token (the replayed passes' own not counted), {args.runs} runs each, "
          f"passes replayed ({args.categories}, {len(prompt)}-token prompt)")
    for config in configs:
        tokens, passes = seen[config.label]
        widths = dict(sorted(collections.Counter(p[1] for p in passes).items()))
        print(f"{config.label}: {1e6 * cpu[config.label] / steps[config.label]:.0f} us a step, "
              f"{1e6 * cpu[config.label] / emitted[config.label]:.0f} a token, target AR's tokens: {tokens == reference}, pass widths {widths}")
    for start in args.profile:
        config = next(c for c in configs if c.label.startswith(start))
        profile = cProfile.Profile()
        profile.runcall(lambda: [bench.run(config, prompt, PassRecorder()) for _ in range(20)])
        print(f"===== {config.label}")
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
