"""The REPL's comparison in interleaved rounds (``--rounds N``, ``/rounds N``; ``app.repl.rounds``): each row runs N
times in ABBA order, every round from the state the first round gave it, and the table shows medians with each
speedup's interval; a greedy round that differs from the first is reported; one round prints today's table. On the
embedded tiny models (fixed seed 42, greedy): no test asserts on a clock, only on what ran and what was printed."""
import dataclasses
import re
import sys
from types import SimpleNamespace

import pexpect
import pytest

from app.bench.intervals import ratio_interval
from app.repl.rounds import BOOTSTRAP_FROM, speedup
from configuration import RunConfig, RunContext
from repl_driver import GIVEN_COSTS, ROOT, spawn_env
from utils.parsing import UsageError

PROMPT = "one two three four one two three four one two three four one two"
ROWS = ("ngram", "pld", "target")  # N-gram assisted learns from the storage; Target AR last


@pytest.fixture
def repl(tiny_models, monkeypatch):
    from utils.printing import console

    monkeypatch.setattr(console, "width", 160)  # the table's cells on one line each
    from infer import Repl
    from utils.models import end_tokens, load_model

    target, tokenizer, _ = load_model(tiny_models["target"], "cpu", "auto", "none", False)
    config = RunConfig(gamma=4, max_gen_len=80, eos_tokens_id=end_tokens(target, tokenizer))
    made = Repl(config, RunContext(target=target, tokenizer=tokenizer), False, 42)
    for key in made.enabled:
        made.enabled[key] = key in ROWS
    return made


@pytest.fixture
def runs(monkeypatch):
    """Every run of a row, in the order run: (strategy key, result); ``changed`` alters a run's tokens; ``watch``
    (set by a test) reads the run's context as it starts, into ``started``: (strategy key, what it read)."""
    import strategies

    seen, real, changed, started = [], strategies.run_strategy, {}, []
    found = SimpleNamespace(seen=seen, changed=changed, started=started, watch=None)

    def spy(strategy, prompt, config, context, seed):
        if found.watch is not None:
            started.append((strategy.key, found.watch(context)))
        result = real(strategy, prompt, config, context, seed)
        if changed.get(len(seen)):
            result = dataclasses.replace(result, tokens=result.tokens[:-1] + [result.tokens[-1] + 1])
        seen.append((strategy.key, result))
        return result

    monkeypatch.setattr(strategies, "run_strategy", spy)
    return found


def table_rows(text: str) -> dict:
    """Strategy title -> the table's cells of its row."""
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) == 7:
            rows[cells[0]] = cells
    return rows


def test_three_rounds_run_each_row_three_times_in_abba_order_and_one_table_carries_intervals(repl, runs, capsys):
    repl.handle("/rounds 3")
    repl.compare(PROMPT)
    out = capsys.readouterr().out
    assert [key for key, _ in runs.seen] == list(ROWS) + list(reversed(ROWS)) + list(ROWS)
    assert out.count("speedup over target AR") == 1 and out.count("Out: ") == len(ROWS)  # one table, each output once
    assert "round 2/3 (reversed)" in out and "round 3/3 (in order)" in out
    assert "speedup: median of 3 interleaved rounds [lowest-highest]" in out
    rows = table_rows(out)
    assert rows["Target AR"][4] == "1.00x"
    for title in ("N-gram assisted", "Prompt lookup"):
        assert re.fullmatch(r"\d+\.\d\dx \[\d+\.\d\d-\d+\.\d\d\]( ~)?", rows[title][4]), rows[title]
    assert "differ from round 1" not in out  # greedy: every round repeats its first
    assert len(repl.last) == len(ROWS)  # /stats: the first round's


def test_every_round_starts_a_learning_row_from_the_storage_before_the_prompt(repl, runs, tmp_path):
    """N-gram assisted learns its prompt and output into the storage: a later round started from the first round's
    storage would draft that output; from the storage before the prompt it drafts what its first round did. And
    the REPL keeps what the first round learned, as one round does."""
    from ngram_assisted import save_storage

    repl.compare(PROMPT)
    save_storage(repl.context.storage, str(tmp_path / "one.json"))
    own = repl.context.storage
    repl.rounds = 3
    repl.compare(PROMPT)
    ngram = [result for key, result in runs.seen if key == "ngram"][1:]
    assert len(ngram) == 3 and ngram[0].stats.drafted > 0
    assert all((r.stats.drafted, r.stats.accepted, r.tokens) == (ngram[0].stats.drafted, ngram[0].stats.accepted, ngram[0].tokens)
               for r in ngram)
    save_storage(repl.context.storage, str(tmp_path / "three.json"))
    assert repl.context.storage is own and (tmp_path / "one.json").read_bytes() == (tmp_path / "three.json").read_bytes()


def test_every_round_starts_each_row_from_the_policy_memory_its_first_round_did(tiny_models, runs):
    """/memory on: the speculative row's policy remembers the drafter model after each run; a later round's row
    starts from the record its first round started from, not from what the rows before it left."""
    import copy

    from infer import Repl
    from utils.models import end_tokens, load_model

    target, tokenizer, _ = load_model(tiny_models["target"], "cpu", "auto", "none", False)
    drafter = load_model(tiny_models["drafter"], "cpu", "auto", "none", False)[0]
    config = RunConfig(gamma=4, max_gen_len=24, eos_tokens_id=end_tokens(target, tokenizer)).with_policy(
        remember=True, min_gain=1.0, row_costs=tuple(float(c) for c in GIVEN_COSTS.split(",")))
    repl = Repl(config, RunContext(target=target, tokenizer=tokenizer, drafter=drafter), False, 42, rounds=3)
    for key in repl.enabled:
        repl.enabled[key] = key in ("speculative", "chained", "target")
    runs.watch = lambda context: copy.deepcopy(context.policy_memory)
    repl.compare(PROMPT)
    started = runs.started
    firsts = dict(started[:3])
    assert firsts["chained"] and firsts["chained"] != firsts["speculative"]  # a record the speculative row left
    assert all(memory == firsts[key] for key, memory in started[3:])
    assert repl.context.policy_memory != firsts["speculative"]  # what the first round learned is kept


def test_every_round_starts_a_suffix_row_from_the_global_memory_before_the_prompt(repl, runs):
    """/suffix_global on: each suffix run adds its output to the global memory; every later round of each suffix
    row starts from the memory as it was before the prompt, and the REPL keeps what the first round's first added."""
    for key in repl.enabled:
        repl.enabled[key] = key in ("suffix", "tree_suffix", "target")
    repl.handle("/suffix_global")
    repl.rounds = 3
    runs.watch = lambda context: context.suffix_memory.describe()
    repl.compare(PROMPT)
    started = runs.started
    empty = repl.suffix_memory.__class__(repl.suffix_memory.max_depth, repl.suffix_memory.vocab_size).describe()
    assert started and all(memory == empty for key, memory in started if key != "target")
    assert repl.context.suffix_memory is repl.suffix_memory and repl.suffix_memory.describe().startswith("1 outputs")


def test_a_greedy_round_that_differs_from_the_first_is_reported(repl, runs, capsys):
    repl.rounds = 2
    runs.changed[3] = True  # round 2's first run: Target AR, reversed
    repl.compare(PROMPT)
    out = capsys.readouterr().out
    assert "Target AR: round 2's tokens differ from round 1's from new token" in out
    assert "N-gram assisted: round 2" not in out


def test_one_round_prints_todays_table(repl, runs, capsys):
    repl.compare(PROMPT)
    out = capsys.readouterr().out
    assert [key for key, _ in runs.seen] == list(ROWS) and "interleaved rounds" not in out and "round 2" not in out
    rows = table_rows(out)
    header = [cell.strip() for line in out.splitlines() if "┃ strategy" in line for cell in line.split("┃")[1:-1]]
    assert header == ["strategy", "tokens", "time (s)", "tokens/s", "speedup", "accept", "tok/step"]
    assert list(rows) == ["N-gram assisted", "Prompt lookup", "Target AR"]
    for (key, result), title in zip(runs.seen, rows):  # each cell the run's own, as before rounds
        assert rows[title][1:5] == [str(len(result.tokens)), f"{result.seconds:.2f}", f"{result.tokens_per_second:.1f}",
                                    f"{result.tokens_per_second / runs.seen[-1][1].tokens_per_second:.2f}x"]


@pytest.mark.parametrize("line", ["/rounds 0", "/rounds x", "/rounds", "/rounds 101"])
def test_a_bad_rounds_command_is_one_line_and_changes_nothing(repl, line):
    with pytest.raises(UsageError) as refused:
        repl.handle(line)
    assert "\n" not in str(refused.value) and "usage: /rounds <n>" in str(refused.value) and repl.rounds == 1


def fake(tokens: int, seconds: float):
    return SimpleNamespace(tokens=[0] * tokens, seconds=seconds, tokens_per_second=tokens / seconds)


def test_the_interval_is_the_rounds_range_below_five_and_the_benchmarks_bootstrap_from_five():
    baselines = [fake(10, s) for s in (1.0, 1.2, 0.9, 1.1, 1.0, 1.3)]
    row = [fake(10, s) for s in (0.5, 0.8, 0.6, 0.5, 0.7, 0.6)]
    three = [b.seconds / r.seconds for r, b in zip(row[:3], baselines[:3])]
    assert speedup(row[:3], baselines[:3], False) == f"{sorted(three)[1]:.2f}x [{min(three):.2f}-{max(three):.2f}]"
    cells = lambda runs: {(0, n): [len(r.tokens), r.seconds] for n, r in enumerate(runs)}  # noqa: E731
    low, high = ratio_interval(cells(row[:BOOTSTRAP_FROM]), cells(baselines[:BOOTSTRAP_FROM]))
    assert speedup(row[:BOOTSTRAP_FROM], baselines[:BOOTSTRAP_FROM], False).endswith(f"[{low:.2f}-{high:.2f}]")
    assert speedup(baselines[:3], baselines[:3], True) == "1.00x"


def test_no_ratio_without_target_ar_or_with_a_round_of_it_that_took_no_time():
    """Target AR off, or a round of it of no time (tokens/s 0): no ratio, as one round's table shows "-"; the rest
    are medians."""
    from app.repl.rounds import summary

    row, target = SimpleNamespace(key="ngram", title="N-gram assisted"), SimpleNamespace(key="target", title="Target AR")
    every = [[(row, fake(10, 0.5)), (target, fake(10, 1.0))], [(target, SimpleNamespace(tokens=[], seconds=0.0, tokens_per_second=0.0)),
                                                                (row, fake(10, 0.7))]]
    cells, legend = summary(every)
    assert cells["ngram"] == ("0.60", "17.1", "-") and "no speedup without a timed Target AR" in legend
    alone = [[pair for pair in found if pair[0] is row] for found in every]  # Target AR off
    assert summary(alone)[0]["ngram"][2] == "-"


def test_the_program_on_a_terminal_prints_the_rounds_table(tiny_models):
    child = pexpect.spawn(sys.executable, ["infer.py", "--device", "cpu", "--target", tiny_models["target"], "--row-costs", GIVEN_COSTS,
                                           "--rounds", "2", "--length", "8", "--prompt", "Hello there"],
                          cwd=str(ROOT), encoding="utf-8", timeout=120, dimensions=(60, 200), env=spawn_env())
    child.expect(r"round 2/2 \(reversed\)")
    child.expect(r"speedup: median of 2 interleaved rounds \[lowest-highest\]")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
