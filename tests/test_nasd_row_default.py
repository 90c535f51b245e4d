"""The REPL's N-gram assisted row under gamma auto when no gamma is given (``RunConfig.auto_rows``,
``strategies.row_config``; docs/reference.md): only that row, only with measured costs, named in the output,
``--gamma 4`` / ``/gamma 4`` the old row; its greedy output is target AR's; and on a copy-heavy prompt it takes
fewer target passes than gamma 4 (counts, on a synthetic runner: no model, no clock)."""
import json
import random
from typing import List

import pytest

from app.repl.repl import AUTO_ROWS
from configuration import RunConfig, RunContext
from ngram_assisted import NGramStorage
from sampling import GenerationStats
from strategies import BY_KEY, STRATEGIES, auto_rows_line, row_config, row_setting
from utils.replayed_runner import ReplayedRunner

COSTS = (1.0, 1.04, 1.08, 1.11, 1.14, 1.17, 1.2, 1.22, 1.25, 1.28, 1.31, 1.34)  # by positions: 5 and 8 as measured on the pair
GIVEN_COSTS = ",".join(str(c) for c in COSTS)
VOCAB = 500


def _config(**changes) -> RunConfig:
    return RunConfig(gamma=4, stop_if_unknown=True, **changes).with_policy(row_costs=COSTS, min_gain=1.0)


def test_only_the_named_row_runs_under_auto_and_only_with_measured_costs():
    assert AUTO_ROWS == ("speculative", "ngram")  # the speculative row's: tests/test_speculative_row_default.py
    config = _config(auto_rows=AUTO_ROWS)
    ngram = row_config(BY_KEY["ngram"], config)
    assert ngram.policy.auto and ngram.gamma == 4 and ngram.policy.bound() == len(COSTS) - 1
    for key in ("pld", "chained", "target"):
        assert row_config(BY_KEY[key], config) is config and row_setting(BY_KEY[key], config) == ""
    assert row_setting(BY_KEY["ngram"], config) == "gamma auto"
    assert auto_rows_line(STRATEGIES, config) == "Speculative, N-gram assisted: gamma auto (4 first, up to 11)"
    for plain in (_config(), RunConfig(gamma=4, auto_rows=AUTO_ROWS), _config(auto_rows=AUTO_ROWS).with_policy(auto=True)):
        assert row_config(BY_KEY["ngram"], plain) is plain and auto_rows_line(STRATEGIES, plain) == ""  # no costs, or all auto
    assert RunConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def _copy_heavy(seed: int = 0):
    """A prompt of 240 random ids, and an output that copies three 22-token stretches of it, each after a
    few new ids (a code edit: most of the answer is the prompt's own text)."""
    rng = random.Random(seed)
    prompt = [rng.randrange(3, VOCAB) for _ in range(240)]
    ref: List[int] = []
    for start in (20, 90, 170):
        ref += [rng.randrange(3, VOCAB) for _ in range(3)] + prompt[start : start + 22]
    return prompt, ref


def _passes(config: RunConfig, prompt: List[int], ref: List[int]) -> int:
    """The target passes the REPL's NASD row function (``rows._ngram``) takes with ``config`` as its row takes it."""
    from rows import _ngram

    runner, stats = ReplayedRunner(prompt, ref, VOCAB, {i: [t, (t + 1) % VOCAB] for i, t in enumerate(ref)}), GenerationStats()
    context = RunContext(target=runner, tokenizer=None, storage=NGramStorage(8, VOCAB))
    out = _ngram(prompt, row_config(BY_KEY["ngram"], config.with_(max_gen_len=len(ref), eos_tokens_id=(1,))), context, stats)
    assert out == ref  # greedy: the target's own tokens
    return runner.forward_passes


def test_the_default_takes_fewer_passes_than_gamma_4_on_a_copy_heavy_prompt():
    for seed in (0, 1):
        prompt, ref = _copy_heavy(seed)
        old, new = _passes(_config(), prompt, ref), _passes(_config(auto_rows=AUTO_ROWS), prompt, ref)
        assert new < old, (seed, new, old)


@pytest.fixture(scope="module")
def repl(tiny_models):
    from infer import Repl
    from utils.models import end_tokens, load_model

    target, tokenizer, _ = load_model(tiny_models["target"], "cpu", "auto", "none", False)
    config = _config(auto_rows=AUTO_ROWS, max_gen_len=80, eos_tokens_id=end_tokens(target, tokenizer))
    made = Repl(config, RunContext(target=target, tokenizer=tokenizer), False, 42)
    for key in made.enabled:
        made.enabled[key] = key in ("ngram", "target")
    return made


def test_the_repl_row_under_its_default_is_target_ar_named_and_gamma_4_gives_the_old_row(repl, monkeypatch, capsys):
    import rows

    seen = []
    real = rows.ngram_assisted_speculative_generate

    def spy(*args, **kwargs):
        seen.append((kwargs["gamma"], kwargs["policy"].auto))
        return real(*args, **kwargs)

    monkeypatch.setattr(rows, "ngram_assisted_speculative_generate", spy)
    prompt = "one two three four one two three four one two three four one two"
    for line, label, policy in ((None, "N-gram assisted (gamma auto)", (4, True)), ("/gamma 4", "N-gram assisted", (4, False))):
        if line:
            repl.handle(line)
        repl.compare(prompt)
        shown = " ".join(capsys.readouterr().out.split())
        by_key = {strategy.key: result for strategy, result in repl.last}
        assert by_key["ngram"].tokens == by_key["target"].tokens and seen[-1] == policy
        assert by_key["ngram"].stats.accepted > 0  # drafts were verified: the equality says something
        assert f"─ {label} ─" in shown and "diverged" not in shown
        assert ("gamma <= 4 (N-gram assisted: gamma auto (4 first, up to 11))" in shown) == (line is None)
    assert repl.config.auto_rows == () and "(gamma auto)" not in repl.title(BY_KEY["ngram"])


def test_the_program_names_the_rows_setting_and_an_explicit_gamma_gives_the_old_row(tiny_models, capsys):
    """``infer.py`` without ``--gamma``: the start-up's Policy line, the row's label and the table's title say
    N-gram assisted ran under gamma auto; with ``--gamma 4`` none does (every row at most 4)."""
    import infer
    from app.repl.cli import own_gamma

    config = _config()
    assert own_gamma(config, 4) == (config, "") and own_gamma(config, "auto") == (config, "")
    assert own_gamma(config, None) == (config.with_(auto_rows=AUTO_ROWS), "N-gram assisted: gamma auto (4 first, up to 11)")
    base = ["--target", tiny_models["target"], "--device", "cpu", "--row-costs", GIVEN_COSTS, "--length", "6", "--verbose", "--prompt", "Hi"]
    for extra, named in (([], True), (["--gamma", "4"], False)):
        infer.main(base + extra)
        shown = " ".join(capsys.readouterr().out.split())
        assert ("per unit of cost · N-gram assisted: gamma auto (4 first, up to 11)" in shown) == named  # the Policy line
        assert ("gamma <= 4 (N-gram assisted: gamma auto (4 first, up to 11))" in shown) == named  # the table's title
        assert ("─ N-gram assisted (gamma auto) ─" in shown) == named and "─ N-gram assisted " in shown
        assert "gamma <= 4" in shown
