"""The EAGLE-3 head as strategy rows (``eagle`` chains, ``eagle_tree`` dynamic trees, a source of
``merged``): greedy exact through ``run_strategy``, its measured step cost the policy's per-draft
cost, ``--head`` loaded or refused in one line in the REPL and the benchmark, rows that need a head
refused or skipped without one."""
from argparse import Namespace
from types import SimpleNamespace

import pytest
import torch

from conftest import EOS_NEVER, PROMPT, llama, save_tiny
from eagle.format import save_head
from eagle.head import HeadConfig
from eagle.loop import initial_head


def head_for(target, draft_vocab: int = 48):
    """A head made as training starts it (its layer the target's last): drafts some tokens the target keeps."""
    vocab = target.config.vocab_size
    config = HeadConfig.for_target(target, draft_vocab_size=draft_vocab)
    return initial_head(target, config, torch.arange(vocab - draft_vocab, vocab)).to(target.dtype).eval()


@pytest.fixture(scope="module")
def pair():
    target = llama(layers=4, init=0.1, seed=5)
    return target, head_for(target)


@pytest.mark.parametrize("key", ["eagle", "eagle_tree", "merged"])
@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_each_row_with_the_head_is_greedy_exact_and_drafts_with_it(pair, key, cache, monkeypatch):
    from drafters.eagle import EagleDrafter
    from runners import RunnerConfig
    from strategies import BY_KEY, RunConfig, RunContext, run_strategy

    target, head = pair
    asked = []
    for name in ("propose", "propose_tree"):  # a spy: the row drafts with this head
        method = getattr(EagleDrafter, name)
        monkeypatch.setattr(EagleDrafter, name, lambda self, *a, _m=method: asked.append(self.head) or _m(self, *a))
    config = RunConfig(max_gen_len=24, eos_tokens_id=EOS_NEVER, runner=RunnerConfig(cache))
    context = RunContext(target=target, tokenizer=None, head=head)
    expected = run_strategy(BY_KEY["target"], PROMPT, config, context).tokens
    assert asked == []
    result = run_strategy(BY_KEY[key], PROMPT, config, context)
    assert result.tokens == expected and result.stats.drafted > 0
    assert asked and all(h is head for h in asked)


def test_the_policy_counts_the_heads_measured_step_cost_not_the_drafter_models(pair):
    from drafters.eagle import EagleDrafter
    from eagle.cost import measure_step_cost
    from sampling import DraftPolicy
    from utils.logits_processor import GreedyProcessor

    target, head = pair
    cost = measure_step_cost(head, target, context=16, repeats=3)
    assert cost > 0
    head.step_cost = cost
    try:
        drafter = EagleDrafter(head, GreedyProcessor())
        policy = DraftPolicy(draft_cost=0.7)
        policy.start(4, drafter.cheap, drafter.memory_key, drafter.step_cost)
        assert policy.per_draft == cost
        policy.start(4, False, None)
        assert policy.per_draft == 0.7
    finally:
        head.step_cost = None


def test_the_repl_toggle_refuses_without_a_head_and_turns_on_with_one(pair):
    from app.repl.commands import COMMANDS
    from strategies import RunConfig, RunContext
    from utils.parsing import UsageError

    target, head = pair
    repl = SimpleNamespace(config=RunConfig(), context=RunContext(target=target, tokenizer=None), enabled={})
    for key in ("/eagle", "/eagle_tree"):
        with pytest.raises(UsageError) as refused:
            COMMANDS[key](repl, [])
        assert "--head PATH" in str(refused.value) and "\n" not in str(refused.value)
    assert repl.enabled == {}
    repl.context.head = head
    assert COMMANDS["/eagle"](repl, []) == "EAGLE-3 head: on" and repl.enabled["eagle"]


def test_the_benchmark_skips_rows_that_need_a_head_without_one(capsys):
    from app.bench.configs import make_configs

    args = Namespace(strategies="target,eagle,eagle_tree,pld", gamma=[4], ngram_n=[3], storages="basic", top_k_filler=[3])
    assert [c.key for c in make_configs(args, False)] == ["target", "pld"]
    assert capsys.readouterr().err.count("no draft head (--head PATH)") == 2
    assert [c.key for c in make_configs(args, False, have_head=True)] == ["target", "eagle", "eagle_tree", "pld"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny target with SmolLM2's tokenizer, a head saved for it, and a head for another target."""
    root = tmp_path_factory.mktemp("eagle-row")
    target = llama(vocab=49152, window=4096, layers=4, init=0.1, seed=3)
    target.config.eos_token_id = 2
    other = llama(vocab=1000, window=4096, layers=4, seed=4)  # another vocabulary
    save_head(head_for(target.float()), root / "head")
    save_head(head_for(other.float()), root / "other-head")
    return {"target": save_tiny(root / "target", target), "head": str(root / "head"), "other": str(root / "other-head")}


@pytest.fixture(scope="module")
def starts(folders):
    """The file's REPL starts, each a process of its own forked from one Python that imported the libraries once
    (``repl_driver.run_forked``; one such Python for the four, not a fresh one for the first): "head" (the head
    loaded, its row run), "off" (``--head none``, then /eagle), "other" and "missing" (refused heads)."""
    from repl_driver import run_forked

    common = ["--no-calibrate", "--target", folders["target"], "--head"]
    cases = {"head": ([*common, folders["head"], "--prompt", "Hi", "--length", "6", "--verbose"], ""),
             "off": ([*common, "none"], "/eagle\n"), "other": ([*common, folders["other"]], ""),
             "missing": ([*common, "/nonexistent/head"], "")}
    return dict(zip(cases, run_forked([args for args, _ in cases.values()], [text for _, text in cases.values()])))


def test_the_repl_loads_the_head_says_it_and_runs_the_eagle_row(starts):
    result = starts["head"]
    assert result.returncode == 0, result.stderr
    head_line = next(line for line in result.stdout.splitlines() if line.startswith("Head:"))
    assert "EAGLE-3" in head_line and "draft vocabulary 48" in head_line and "draft step: " in head_line and "of a target pass" in head_line
    assert "EAGLE-3 head" in result.stdout.split(head_line)[1]  # its row ran


def test_no_head_or_a_head_for_another_target_is_one_line(starts):
    off, refusals = starts["off"], (starts["other"], starts["missing"])
    assert off.returncode == 0 and "Head: none (--head none)" in off.stdout and "restart with --head PATH" in off.stdout
    for refused, words in zip(refusals, ("could not load the head", "could not load the head")):
        assert refused.returncode == 1 and words in refused.stdout, refused.stdout
        assert "Traceback" not in refused.stdout + refused.stderr
        assert len([line for line in refused.stdout.splitlines() if line.startswith("error:")]) == 1


def test_the_benchmark_runs_the_head_rows_names_the_head_and_reports_acceptance_by_depth(folders, tmp_path):
    import json

    import bench

    out = tmp_path / "results"
    bench.main(["--target", folders["target"], "--head", folders["head"], "--device", "cpu", "--limit", "1", "--categories",
                "summarization", "--strategies", "target,eagle,eagle_tree,merged", "--max-new-tokens", "8", "--no-calibrate",
                "--out", str(out)])
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert {r["key"] for r in records} == {"target", "eagle", "eagle_tree", "merged"}
    assert all(r["diverged_at"] is None for r in records)
    assert all((r["head"] is None) == (r["key"] == "target") for r in records)  # each row that drafted with it names it
    assert all("draft vocabulary 48" in r["head"] for r in records if r["head"])
    report = (out / "results.md").read_text()
    assert " + head " in report.splitlines()[0] and "## acceptance by draft depth" in report
    depth_rows = report.split("## acceptance by draft depth")[1]
    assert "| eagle |" in depth_rows or "| eagle[g=4] |" in depth_rows


def test_the_heads_step_cost_is_read_from_least_samples_so_a_loaded_target_pass_does_not_cheapen_it():
    from eagle.cost import least_ratio

    quiet = least_ratio([1.0, 1.1, 1.05], [10.0, 10.2, 10.1])
    # another process stole time from most target passes (two threads wait on each other), not from the head's step
    loaded = least_ratio([1.0, 1.1, 1.05], [10.0, 45.0, 50.0])
    assert quiet == loaded == 0.1
