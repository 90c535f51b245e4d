"""The REPL's comparison in interleaved rounds (``--rounds N``, ``/rounds N``): the enabled rows run N times, the
order reversed every other round (ABBA: a drift in the memory's speed, which moves from minute to minute on these
machines, weighs on every row alike), every round of every row from the state the first round gave it; the table
then shows each row's median over rounds, its speedup with an interval (``app.bench.intervals``, as the benchmark's),
and a greedy row whose tokens differ between rounds is reported, never averaged over."""
import copy
import statistics
from typing import Dict, List, Optional, Tuple

from rich.text import Text

from app.bench.intervals import NO_DIFFERENCE, RESAMPLES, ratio_cell, ratio_interval
from utils.printing import console

BOOTSTRAP_FROM = 5  # rounds from which the speedup's interval is the bootstrap's; fewer: the lowest-highest of the rounds


def run_rounds(repl, enabled: list, prompt: List[int], results: list) -> Optional[List[list]]:
    """Run ``enabled`` (strategies) on ``prompt`` ``repl.rounds`` times, in order then reversed, alternately.

    The first round runs as a single comparison does: its rows print their output and fill ``results`` (the
    ``(strategy, result)`` pairs), the first row drafting from the n-gram storage (or the suffix memory) learns into
    the REPL's own, kept for the next prompt, and every other such row starts from a copy of it as it was before the
    prompt. In every later round every such row starts from that copy too, and every row from the policy memory
    the first round gave it; a later round prints one line. Returns every round's pairs, in the order run; None when
    a run was interrupted or refused."""
    context, later = repl.context, repl.rounds > 1
    learning = [strategy for strategy in enabled if strategy.takes_storage]
    suffixes = [strategy for strategy in enabled if strategy.suffix]
    own, memory, policy_own = context.storage, context.suffix_memory, context.policy_memory
    before = copy.deepcopy(own) if len(learning) > 1 or (later and learning) else None
    memory_before = copy.deepcopy(memory) if memory is not None and (len(suffixes) > 1 or (later and suffixes)) else None
    policy_at: Dict[str, dict] = {}  # strategy key -> the policy memory its first round started from
    every: List[list] = []
    try:
        for number in range(repl.rounds):
            first, found = number == 0, results if number == 0 else []
            for strategy in enabled if number % 2 == 0 else enabled[::-1]:
                # a row drafting from the storage starts from it as it was before this prompt
                copied = strategy in (learning[1:] if first else learning)
                context.storage = copy.deepcopy(before) if copied else own
                shared = strategy in (suffixes[1:] if first else suffixes) and memory is not None
                context.suffix_memory = copy.deepcopy(memory_before) if shared else memory
                if later and first:
                    policy_at[strategy.key] = copy.deepcopy(policy_own)
                elif later:
                    context.policy_memory = copy.deepcopy(policy_at[strategy.key])
                if not repl.run(strategy, prompt, found, quiet=not first):
                    return None
            every.append(found)
            if not first:
                console.print(Text(round_line(number, repl.rounds, found), style="dim"))
    finally:
        context.storage, context.suffix_memory, context.policy_memory = own, memory, policy_own
    return every


def round_line(number: int, rounds: int, found: list) -> str:
    """A later round's line: ``round 2/3 (reversed): Target AR 1.20 s · N-gram assisted 0.61 s``."""
    times = " · ".join(f"{strategy.title} {result.seconds:.2f} s" for strategy, result in found)
    return f"round {number + 1}/{rounds} ({'reversed' if number % 2 else 'in order'}): {times}"


def by_row(every: List[list]) -> Dict[str, list]:
    """Strategy key -> its result in each round, in round order."""
    rows: Dict[str, list] = {}
    for found in every:
        for strategy, result in found:
            rows.setdefault(strategy.key, []).append(result)
    return rows


def divergence_lines(every: List[list]) -> List[str]:
    """Greedy: a line for each later round whose tokens of a row differ from that row's first round's (a greedy row
    is lossless and deterministic: the same state, the same tokens)."""
    titles = {strategy.key: strategy.title for strategy, _ in every[0]}
    lines = []
    for key, results in by_row(every).items():
        first = results[0].tokens
        for number, result in enumerate(results[1:], start=2):
            if result.tokens != first:
                at = next((i for i, (a, b) in enumerate(zip(first, result.tokens)) if a != b), min(len(first), len(result.tokens)))
                lines.append(f"{titles[key]}: round {number}'s tokens differ from round 1's from new token {at} "
                             f"({len(result.tokens)} tokens against {len(first)}): a greedy row must repeat itself")
    return lines


def speedup(results: list, baselines: list, exact: bool) -> str:
    """The median over rounds of a row's tokens/s over that round's target AR's, with its interval: the benchmark's
    bootstrap (``ratio_interval``, one prompt, the rounds as repeats) from ``BOOTSTRAP_FROM`` rounds, else the
    lowest-highest of the rounds' ratios."""
    ratios = [r.tokens_per_second / b.tokens_per_second for r, b in zip(results, baselines)]
    if len(ratios) >= BOOTSTRAP_FROM:
        cells = lambda runs: {(0, n): [len(r.tokens), r.seconds] for n, r in enumerate(runs)}  # noqa: E731
        interval = ratio_interval(cells(results), cells(baselines))
    else:
        interval = (min(ratios), max(ratios))
    return ratio_cell(statistics.median(ratios), interval, exact=exact)


def summary(every: List[list]) -> Tuple[Dict[str, tuple], str]:
    """Each row's (time, tokens/s, speedup) cells, medians over the rounds, and the line under the table saying so."""
    rows = by_row(every)
    baselines = next((rows[strategy.key] for strategy, _ in every[0] if strategy.key == "target"), None)
    if baselines is not None and not all(b.tokens_per_second > 0 for b in baselines):
        baselines = None  # a Target AR round of no tokens or no time: no ratio, as one round shows "-"
    cells = {}
    for strategy, _ in every[0]:
        results = rows[strategy.key]
        ratio = speedup(results, baselines, strategy.key == "target") if baselines else "-"
        cells[strategy.key] = (f"{statistics.median(r.seconds for r in results):.2f}",
                               f"{statistics.median(r.tokens_per_second for r in results):.1f}", ratio)
    rounds = len(every)
    spread = (f"[95% bootstrap interval, {RESAMPLES} resamples]" if rounds >= BOOTSTRAP_FROM else "[lowest-highest]")
    if baselines is None:
        return cells, f"time and tokens/s: median of {rounds} interleaved rounds (no speedup without a timed Target AR)"
    return cells, (f"speedup: median of {rounds} interleaved rounds {spread}, each round's over its Target AR; "
                   f"time and tokens/s: medians; {NO_DIFFERENCE}: the interval includes 1.00x")
