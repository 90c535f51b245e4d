"""A new drafter is one file plus one strategy row: "repeat the last n-gram", defined and registered
here alone, runs through the library, the REPL's commands and the benchmark, and leaves no trace."""
import json
from types import SimpleNamespace
from typing import List

import pytest

from conftest import EOS_NEVER, PROMPT, llama
from drafters import Drafter, write_drafts
from drafting import assert_greedy_exact


class RepeatNgram(Drafter):
    """Drafts the tokens that followed the latest earlier occurrence of the last ``n`` tokens."""

    def __init__(self, n: int = 2):
        self.n = n

    def propose(self, ids, tokens: List[int], k: int):
        tail = tokens[-self.n :]
        for start in range(len(tokens) - self.n - 1, -1, -1):
            if tokens[start : start + self.n] == tail:
                return write_drafts(ids, len(tokens), tokens[start + self.n : start + self.n + k]), None
        return 0, None


@pytest.fixture
def row():
    import strategies
    from strategies import Param, Strategy

    strategy = Strategy("repeat_ngram", "Repeat n-gram", "cyan", False, True, True,
                        drafter=lambda prompt, s: RepeatNgram(s.param("repeat_n")), takes_gamma=True,
                        params=(Param("repeat_n", int, 2, 1, 8, "tokens matched before repeating what followed them"),),
                        help="draft what followed the last n tokens before")
    with strategies.register(strategy):
        yield strategy
    assert "repeat_ngram" not in strategies.EVERY and "repeat_n" not in strategies.PARAMS


@pytest.mark.parametrize("n", [1, 2, 3])
def test_greedy_output_equals_target_autoregressive(n):
    assert_greedy_exact(lambda prompt, config: RepeatNgram(n))


def test_the_row_runs_with_its_parameter(row):
    from strategies import BY_KEY, RunConfig, RunContext, run_strategy

    model = llama()
    config, context = RunConfig(max_gen_len=16, eos_tokens_id=EOS_NEVER), RunContext(target=model, tokenizer=None)
    target = run_strategy(BY_KEY["target"], PROMPT, config, context)
    for n in (2, 3):
        result = run_strategy(row, PROMPT, config.with_(repeat_n=n), context)
        assert result.tokens == target.tokens and result.stats.drafted > 0
    assert row.label_words == "repeat_n=2"


def test_the_repl_gets_a_toggle_and_a_limited_parameter_command(row):
    from app.repl.commands import COMMANDS
    from strategies import RunConfig, RunContext
    from utils.parsing import LIMITS, UsageError

    assert LIMITS["repeat_n"] == (1, 8)
    repl = SimpleNamespace(config=RunConfig(), context=RunContext(target=llama(), tokenizer=None), enabled={})
    assert COMMANDS["/repeat_ngram"](repl, []) == "Repeat n-gram: on" and repl.enabled["repeat_ngram"]
    assert COMMANDS["/repeat_n"](repl, ["3"]) == "repeat_n: 3" and repl.config.param("repeat_n") == 3
    for bad in ("0", "9", "two", "1.5"):
        with pytest.raises(UsageError) as refused:
            COMMANDS["/repeat_n"](repl, [bad])
        assert "\n" not in str(refused.value) and "usage: /repeat_n <n>" in str(refused.value) and "1 to 8" in str(refused.value)
    assert repl.config.param("repeat_n") == 3
    help_lines = {command.usage: command.what for command in COMMANDS.values()}
    assert help_lines["/repeat_n <n>"].startswith("tokens matched") and help_lines["/repeat_ngram"].startswith("draft what")
    assert COMMANDS["/repeat_n"].value(repl) == 3


def test_no_trace_once_unregistered():
    from app.repl.commands import COMMANDS
    from utils.parsing import LIMITS

    assert "/repeat_ngram" not in COMMANDS and "/repeat_n" not in COMMANDS and "repeat_n" not in LIMITS


def test_the_benchmark_runs_the_row(row, tiny_models, tmp_path):
    import bench

    out = tmp_path / "plugin"
    bench.main(["--target", tiny_models["target"], "--device", "cpu", "--limit", "1", "--categories", "summarization",
                "--strategies", "target,repeat_ngram", "--gamma", "3", "--max-new-tokens", "8", "--param", "repeat_n=1,3",
                "--out", str(out)])
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert {r["key"] for r in records} == {"target", "repeat_ngram"}
    assert all(r["diverged_at"] is None for r in records)
    swept = {r["config"]: r["params"] for r in records if r["key"] == "repeat_ngram"}
    assert swept == {"repeat_ngram[g=3 repeat_n=1]": {"repeat_n": 1}, "repeat_ngram[g=3 repeat_n=3]": {"repeat_n": 3}}, (
        "the grid runs each value of the row's parameter, and the label says which")


def test_the_benchmark_refuses_an_unknown_or_out_of_range_parameter_in_one_line(row, capsys):
    import bench

    for bad in ("repeat_n=0", "repeat_n=9", "nope=1", "repeat_n="):
        with pytest.raises(SystemExit):
            bench.main(["--strategies", "repeat_ngram", "--param", bad])
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert "--param" in error, error
