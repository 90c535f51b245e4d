"""The speculative row on the pair's terms: under gamma auto when no gamma is given (``app.repl.repl.AUTO_ROWS``,
named only where a drafter runs), the drafter model's greedy drafts drawn without their probabilities
(``ModelDrafter.draws_only``), and the drafter's own dtype (``--drafter-dtype``, ``app.drafter_dtype``). Every
greedy row still emits target AR's tokens; the counts are passes, never clocks."""
import pytest

from app.drafter_dtype import drafter_dtype, measures
from app.repl.cli import own_gamma
from app.repl.repl import AUTO_ROWS
from app.session import SetupError
from conftest import EOS_NEVER, PROMPT, perturbed_copy
from configuration import RunConfig, RunContext
from drafters.model import ModelDrafter
from measure.record import Finding
from repl_driver import run
from sampling import GenerationStats, autoregressive_generate, speculative_generate
from strategies import BY_KEY, run_strategy, row_config
from utils.logits_processor import GreedyProcessor, MultinomialProcessor

COSTS = (1.0, 0.96, 0.99, 0.98, 0.91, 0.86, 0.95, 0.95, 1.07, 1.08, 1.20, 1.19)  # by positions: the pair's, bfloat16
LENGTH = 48


def _config(**changes) -> RunConfig:
    return RunConfig(gamma=4, max_gen_len=LENGTH, eos_tokens_id=(), **changes).with_policy(row_costs=COSTS, min_gain=1.0,
                                                                                           draft_cost=0.25)


def test_the_speculative_row_runs_under_auto_and_is_named_only_with_a_drafter():
    assert AUTO_ROWS == ("speculative", "ngram")
    config = _config(auto_rows=AUTO_ROWS)
    for key in ("speculative", "ngram"):
        assert row_config(BY_KEY[key], config).policy.auto
    assert row_config(BY_KEY["pld"], config) is config
    assert own_gamma(_config(), None, drafter=True)[1] == "Speculative, N-gram assisted: gamma auto (4 first, up to 11)"
    assert own_gamma(_config(), None)[1] == "N-gram assisted: gamma auto (4 first, up to 11)"  # no drafter: not named
    assert own_gamma(_config(), 4, drafter=True) == (_config(), "")  # a gamma given: every row bounded by it


def test_auto_drafts_longer_and_takes_fewer_passes_when_the_drafter_agrees(pair):
    """A drafter that agrees with the target nearly always: gamma 4 pays a pass every 5 tokens at best, the row
    under auto drafts past 4 (its verification costs flat, a draft a quarter of a pass) and takes fewer; both exact."""
    target, _ = pair
    drafter = perturbed_copy(target, 0.01, seed=1)
    expected = autoregressive_generate(PROMPT, target, max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=True)
    passes = {}
    for name, config in (("gamma 4", _config()), ("auto", _config(auto_rows=AUTO_ROWS))):
        result = run_strategy(BY_KEY["speculative"], PROMPT, config, RunContext(target=target, tokenizer=None, drafter=drafter))
        assert result.tokens == expected, name
        passes[name] = result.stats.target_forward_passes
        if name == "auto":
            assert max(result.stats.drafted_by_step) > 4
    assert passes["auto"] < passes["gamma 4"], passes


def test_greedy_drafts_skip_the_probabilities_and_are_the_same_drafts(pair, monkeypatch):
    """Greedy with no confidence cutoff draws each draft as ``GreedyProcessor.choose`` does (no softmax over
    the vocabulary): the same drafts, steps and output as through the probabilities (a subclass goes that way)."""
    target, drafter = pair

    class ThroughProbabilities(GreedyProcessor):
        pass

    calls = []
    real = ModelDrafter._greedy
    monkeypatch.setattr(ModelDrafter, "_greedy", lambda self, *a: calls.append(a[-1]) or real(self, *a))
    runs, taken = [], []
    for processor in (GreedyProcessor(), ThroughProbabilities()):
        stats = GenerationStats()
        out, _ = speculative_generate(PROMPT, drafter, target, gamma=4, logits_processor=processor, max_gen_len=LENGTH,
                                      eos_tokens_id=EOS_NEVER, use_cache=True, stats=stats)
        runs.append((out, stats.drafted_by_step, stats.emitted_by_step))
        taken.append(len(calls))
        calls.clear()
    assert taken[0] > 0 and taken[1] == 0  # greedy drew without probabilities, the subclass through them
    assert runs[0] == runs[1] and 0 < sum(runs[0][1]) and sum(runs[0][2]) == LENGTH
    assert runs[0][0] == autoregressive_generate(PROMPT, target, max_gen_len=LENGTH, eos_tokens_id=EOS_NEVER, use_cache=True)
    model = type("Runner", (), {"model": None})()  # the drafter's runner: only its model's identity is read here
    assert ModelDrafter(model, GreedyProcessor(), 96, None).draws_only
    assert not ModelDrafter(model, GreedyProcessor(), 96, None, p_min=0.4).draws_only  # the cutoff reads q
    assert not ModelDrafter(model, MultinomialProcessor(1.0), 96, None).draws_only  # sampling verifies with q


def test_the_drafters_dtype_rule():
    def measure(answer):
        return Finding(answer, f"{answer} by measurement: a matmul took 0.46")

    assert measures(None, "float32", "d.gguf", "cpu", True) and measures("auto", "float32", "d", "cpu", True)
    chosen = drafter_dtype(None, "float32", "d.gguf", "cpu", True, measure("bfloat16"))
    assert chosen.value == "bfloat16"
    assert "bfloat16 drafter for the float32 target, bfloat16 by measurement" in chosen.note and "lossless" not in chosen.short
    assert "--drafter-dtype float32" in chosen.note and chosen.short == "drafts in bfloat16 by measurement"
    assert drafter_dtype("auto", "float32", "d", "cpu", True, measure("float32")).value == "float32"  # not clearly faster
    for target, device, preset in (("float32", "cpu", False), ("bfloat16", "cpu", True), ("float32", "cuda", True), ("auto", "cpu", False)):
        assert not measures(None, target, "d", device, preset)  # measured only where it may choose
        assert drafter_dtype(None, target, "d", device, preset, measure("bfloat16")) == type(chosen)(target)  # the target's
    assert not measures("bfloat16", "float32", "d", "cpu", True) and not measures(None, "float32", "layers:2", "cpu", True)
    given = drafter_dtype("bfloat16", "float32", "d", "cpu", False, measure("float32"))
    assert given.value == "bfloat16" and given.note.startswith("bfloat16 drafter (--drafter-dtype)")
    assert drafter_dtype("float32", "float32", "d", "cpu", True, measure("bfloat16")).note == ""
    assert drafter_dtype(None, "float32", "layers:2", "cpu", True, measure("bfloat16")).value == "float32"
    with pytest.raises(SetupError, match="layers:N"):
        drafter_dtype("bfloat16", "float32", "layers:2", "cpu", True, measure("bfloat16"))


def test_a_bfloat16_drafter_for_a_float32_target_is_named_and_every_row_is_target_ar(tiny_models):
    result = run("--target", tiny_models["target"], "--drafter", tiny_models["drafter"], "--dtype", "float32",
                 "--drafter-dtype", "bfloat16", "--prompt", "Hi there, count with me: one two three", "--length", "12",
                 "--no-calibrate", "--verbose")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    lines = {role: next(line for line in result.stdout.splitlines() if line.startswith(role)) for role in ("Target:", "Drafter:")}
    assert "float32" in lines["Target:"] and "bfloat16" not in lines["Target:"]
    assert "torch.bfloat16" in lines["Drafter:"] and "bfloat16 drafter (--drafter-dtype)" in lines["Drafter:"], lines
    assert "Speculative" in result.stdout and "diverged" not in result.stdout
