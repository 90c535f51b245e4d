"""Every greedy divergence is explained: a rounding near-tie (the two computations of the target's
logits order the two tokens differently, both margins within their measured difference) or a
disagreement (a bug: a token the target did not choose in the pass that verified it)."""
import csv
import json

import pytest
import torch

import bench
from conftest import PROMPT, llama
from sampling.base_decoding import generate_with
from sampling.config import GenerationConfig
from sampling.divergence import DISAGREEMENT, NEAR_TIE, PassRecorder, classify_divergence, replay, verdict
from sampling.speculative_decoding import draft_and_verify
from runners import KVCacheModel

WRONG = 3  # a token the tiny target never chooses here


class Scripted:
    """A cheap drafter proposing a fixed continuation (the target's own answer: every draft is right)."""

    cheap = True

    def __init__(self, prompt, continuation):
        self.prompt_length, self.continuation = len(prompt), continuation

    def max_drafts(self, position):
        return 1 << 30

    def propose(self, ids, tokens, k):
        drafts = self.continuation[len(tokens) - self.prompt_length :][:k]
        ids[0, len(tokens) : len(tokens) + len(drafts)] = torch.tensor(drafts, dtype=torch.long)
        return len(drafts), None

    def fetch(self, target_probs):
        return None

    def accept(self, tokens, start, n_accepted, fetched):
        pass


class Corrupting(KVCacheModel):
    """A runner whose verification passes (more than one position) put WRONG first in their first
    row: the loop then emits a token the target did not choose, as a wrong acceptance rule would."""

    shortest = 2  # passes over fewer positions are left alone

    def __call__(self, ids, n_last=1):
        logits = super().__call__(ids, n_last)
        if n_last >= self.shortest:
            logits = logits.clone()
            logits[0, WRONG] = logits[0].max() + 10.0
        return logits


def corrupt_ngram(monkeypatch, runner_class) -> None:
    """N-gram assisted decoding (that strategy only) verifies with ``runner_class`` instead of its own runner."""
    import ngram_assisted.ngram_assisted as module

    real = module.speculative
    monkeypatch.setattr(module, "speculative", lambda prompt, target, drafter, config: real(
        prompt, runner_class(target.model, True), drafter, config))


def target_ar(model, length):
    return generate_with(list(PROMPT), KVCacheModel(model, True), GenerationConfig(max_gen_len=length))


def speculative(model, continuation, length, runner=KVCacheModel, gamma=6):
    """(tokens, recorded passes) of the loop drafting ``continuation`` with ``runner``."""
    recorder = PassRecorder()
    config = GenerationConfig(max_gen_len=length, gamma=gamma, observers=(recorder,))
    return draft_and_verify(list(PROMPT), runner(model, True), Scripted(PROMPT, continuation), config), recorder.passes


def test_the_rule_on_given_logits():
    """Same order in both computations: a disagreement, however small the margin; opposite orders
    within the measured rounding: a near-tie; opposite orders with a margin beyond it: a disagreement."""
    ar = torch.tensor([0.0, 1.0, 1.0 - 1e-6, -2.0], dtype=torch.float64)
    assert verdict(ar, ar + 1e-7, 1, 2)[0] == DISAGREEMENT
    flipped = torch.tensor([0.0, 1.0, 1.0 + 1e-6, -2.0 + 3e-6], dtype=torch.float64)
    kind, ar_margin, pass_margin, rounding = verdict(ar, flipped, 1, 2)
    assert kind == NEAR_TIE and ar_margin > 0 > pass_margin and rounding == pytest.approx(3e-6)
    ar = torch.tensor([0.0, 1.0, 0.99, -2.0], dtype=torch.float64)  # margin 0.01, each logit moves 0.006: beyond the rule
    assert verdict(ar, torch.tensor([0.0, 0.994, 0.996, -2.0], dtype=torch.float64), 1, 2)[0] == DISAGREEMENT


def test_a_wrong_acceptance_is_a_disagreement():
    """A loop that emits a token its target did not choose is flagged, at that very position."""
    model = llama()
    expected = target_ar(model, 12)
    assert WRONG not in expected
    wrong, passes = speculative(model, expected, 12, runner=Corrupting, gamma=4)
    assert wrong != expected
    found = classify_divergence(model, list(PROMPT), expected, wrong, passes)
    assert found.verdict == DISAGREEMENT and found.strategy_token == WRONG and found.ar_token == expected[found.position]
    assert found.ar_margin > found.rounding  # the honest pass orders the two tokens as AR does, far apart
    assert found.line().startswith(f"diverged at token {found.position}: disagreement, margin ")


def test_a_constructed_near_tie_is_a_near_tie():
    """A float32 target whose head puts token b just below AR's token a in the one-position pass and
    just above it in the strategy's six-position pass (b's row is a's plus a vector built from the
    two computations' measured final hidden states, orthogonal to the earlier ones): the loop
    really diverges there, and the divergence is a near-tie, not a disagreement."""
    model, length = llama().float(), 7
    expected = target_ar(model, length)
    tokens, passes = speculative(model, expected, length)
    assert tokens == expected and passes[-1][1] == 6  # the last token comes from a six-position pass
    position = len(PROMPT) + length - 1
    hidden = []
    hook = model.lm_head.register_forward_pre_hook(lambda module, args: hidden.append(args[0][0].double()))
    common = list(PROMPT) + expected[:-1]
    replay(KVCacheModel(model, True), common, [(start, 1, (), 0) for start in range(len(PROMPT), position + 1)], position)
    one = [h[-1] for h in hidden]
    hidden.clear()
    replay(KVCacheModel(model, True), common, passes, position)
    six = [h for rows in hidden for h in rows]
    hook.remove()
    if torch.equal(one[-1], six[-1]):
        pytest.skip("this machine computes both pass shapes identically: no rounding to tie on")
    a, b = expected[-1], 7
    assert b not in expected and a not in expected[:-1]
    weight = model.lm_head.weight.detach().double()
    margin = 10 * max(abs(float(weight[a] @ (one[-1] - six[-1]))), 1e-8)
    constraints = torch.stack([one[-1], six[-1]] + one[:-1] + six[:-1])
    wanted = torch.zeros(len(constraints), 1, dtype=torch.float64)
    wanted[0], wanted[1] = -margin, margin
    delta = torch.linalg.lstsq(constraints, wanted, driver="gelsd").solution[:, 0]
    with torch.no_grad():
        model.lm_head.weight[b] = (weight[a] + delta).float()
    expected = target_ar(model, length)
    tokens, passes = speculative(model, expected, length)
    assert tokens[:-1] == expected[:-1] and (expected[-1], tokens[-1]) == (a, b)
    # replayed on the runner both runs had (transformers' forward): the default, the C step, rounds alike at every width
    found = classify_divergence(model, list(PROMPT), expected, tokens, passes, runner_factory=lambda m: KVCacheModel(m, True))
    assert found.verdict == NEAR_TIE and found.rows == 6 and found.position == length - 1
    assert found.ar_margin > 0 >= found.pass_margin and found.margin <= found.rounding < 1e-5
    assert found.line() == f"diverged at token {length - 1}: near-tie, margin {found.margin:.3g} vs rounding {found.rounding:.3g}"


def test_recording_and_classifying_never_change_a_token():
    """The recorder is an observer and the classifier replays on fresh runners: outputs are the
    same with and without them, before and after a classification."""
    model = llama()
    expected = target_ar(model, 12)
    plain = draft_and_verify(list(PROMPT), KVCacheModel(model, True), Scripted(PROMPT, expected[:5] + [WRONG] * 7),
                             GenerationConfig(max_gen_len=12, gamma=4))
    recorded, passes = speculative(model, expected[:5] + [WRONG] * 7, 12, gamma=4)
    assert plain == recorded == expected and any(accepted < len(drafts) for _, _, drafts, accepted in passes)
    assert classify_divergence(model, list(PROMPT), expected, recorded, passes) is None
    wrong, passes = speculative(model, expected, 12, runner=Corrupting, gamma=4)
    classify_divergence(model, list(PROMPT), expected, wrong, passes)
    assert target_ar(model, 12) == expected and speculative(model, expected, 12, gamma=4)[0] == expected


def test_the_benchmark_reports_classified_divergences_and_strict_fails_on_a_disagreement(tiny_models, tmp_path, monkeypatch):
    """N-gram assisted decoding whose verification passes are corrupted: runs.jsonl classifies each divergence,
    summary.csv and the table count near-ties and disagreements, and --strict exits non-zero."""
    corrupt_ngram(monkeypatch, Corrupting)
    common = ["--target", tiny_models["target"], "--device", "cpu", "--limit", "1", "--categories", "qa", "--strategies",
              "target,ngram", "--storages", "basic", "--max-new-tokens", "8", "--no-calibrate"]
    with pytest.raises(SystemExit) as failed:
        bench.main(common + ["--out", str(tmp_path / "strict"), "--strict"])
    assert str(failed.value).startswith("error: --strict: ") and "disagreement" in str(failed.value)
    bench.main(common + ["--out", str(tmp_path / "plain")])  # without --strict the same run only reports
    records = [json.loads(line) for line in (tmp_path / "plain" / "runs.jsonl").read_text().splitlines()]
    runs = [r for r in records if r["key"] == "ngram"]
    assert runs and all(r["divergence"]["verdict"] == DISAGREEMENT and r["divergence"]["position"] == r["diverged_at"]
                        for r in runs)
    assert all(r["divergence"] is None for r in records if r["key"] == "target")
    summary = {row["config"]: row for row in csv.DictReader((tmp_path / "plain" / "summary.csv").open()) if row["category"] == "all"}
    ngram = summary[runs[0]["config"]]
    assert {"near_ties", "disagreements", "unclassified", "max_margin", "max_rounding"} <= set(ngram)
    assert ngram["disagreements"] == str(len(runs)) and ngram["near_ties"] == "0" and float(ngram["max_margin"]) > 0
    assert summary["target"]["disagreements"] == "0" and summary["target"]["max_margin"] == ""
    assert f"{len(runs)}/{len(runs)}: {len(runs)} disagreement" in (tmp_path / "plain" / "results.md").read_text()
    with pytest.raises(SystemExit):  # --strict also gates a report re-made from runs.jsonl
        bench.main(["--from-runs", str(tmp_path / "plain" / "runs.jsonl"), "--out", str(tmp_path / "remade"), "--strict"])


def test_the_repl_says_in_one_line_why_a_greedy_strategy_diverged(tiny_models, monkeypatch, capsys):
    import infer

    class CorruptingEvery(Corrupting):  # the REPL's n-gram drafter drafts nothing on a tiny random model
        shortest = 1

    corrupt_ngram(monkeypatch, CorruptingEvery)
    infer.main(["--target", tiny_models["target"], "--device", "cpu", "--no-calibrate", "--length", "8", "--prompt", "Hello there"])
    shown = capsys.readouterr().out
    assert "N-gram assisted: diverged at token " in shown and ": disagreement, margin " in shown and " vs rounding " in shown
    assert "Prompt lookup: diverged" not in shown  # an honest strategy that matched target AR says nothing
