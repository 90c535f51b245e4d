"""Every combination of processor, drafter, policy control, cache and model kind: never a crash,
greedy exact, at most gamma drafts per step; each control keeps sampled output distributed as
the target's (chi-square against exact enumeration), and the test sees a known bias."""
import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM

from conftest import examples, llama, perturbed_copy
import sampling
from drafters import ChainedSpec, DraftContext, PromptLookupSpec
from ngram_assisted import NGramStorage, OneLevelNGramStorage, ngram_assisted_speculative_generate
from sampling import (
    DraftPolicy,
    GenerationStats,
    autoregressive_generate,
    plausible_row_costs,
    speculative_generate,
)
from sampling.config import GenerationConfig
from sampling.speculative_decoding import ModelDrafter, draft_and_verify
from test_lossless_sampling import LENGTH, PROMPT as TINY_PROMPT, chi_square_pvalue, exact_distribution
from runners import LeanRunner, RunnerConfig
from utils.logits_processor import (
    GreedyProcessor,
    MultinomialProcessor,
    NucleusProcessor,
    TopKNucleusProcessor,
    TopKProcessor,
)

VOCAB = 24
PROMPTS = ([3, 5, 7, 3, 5, 9, 2, 3, 5, 7, 11, 3], [1, 2, 1, 2, 1, 2, 4, 1, 2])
GEN = 22  # past the sliding window of 8 positions: rollbacks reach behind it
PROCESSORS = {
    "greedy": GreedyProcessor(),
    "multinomial": MultinomialProcessor(1.0),
    "topk": TopKProcessor(0.8, 3),
    "nucleus": NucleusProcessor(1.1, 0.8),
    "topknucleus": TopKNucleusProcessor(0.9, 3, 0.9),
}
SAMPLING = [name for name in PROCESSORS if name != "greedy"]
COSTS = (1.0, 1.4, 1.3, 1.2, 1.3, 1.5)  # a pass over 4 positions is cheaper than over 2 or 3: padding
CONTROLS = {
    "adaptive": dict(adaptive=True),
    "min_draft": dict(min_draft=2),
    "p_min": dict(p_min=0.6),
    "pause": dict(pause_after=1, pause_steps=2),
    "min_gain": dict(min_gain=1.5, pause_steps=2),
    "row_costs": dict(row_costs=COSTS),
    "draft_cost": dict(row_costs=COSTS, draft_cost=0.5, min_gain=1.0, pause_steps=2),
    "auto": dict(row_costs=COSTS, auto=True),
    "remember": dict(remember=True, min_gain=1.2, pause_steps=2),
    "live": dict(row_costs=COSTS, live=True, min_gain=1.0, pause_steps=2),  # costs measured in the loop (clock-driven lengths)
    "gate": dict(row_costs=COSTS, min_gain=1.0),  # with a cheap drafter that reports evidence: the gate cuts its drafts
}
README_POLICY = dict(adaptive=True, min_draft=2, pause_after=3, pause_steps=8, p_min=0.3)  # the example of docs/python.md's first steps
DRAFTERS = ("model", "ngram_basic", "ngram_onelevel", "pld", "chained")


def mistral(vocab=VOCAB, window=8, seed=0):
    """A Mistral with sliding-window attention (its cache keeps only the last ``window`` positions)."""
    torch.manual_seed(seed)
    config = MistralConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, sliding_window=window, tie_word_embeddings=False,
    )
    return MistralForCausalLM(config).to(torch.float64).eval()


def gemma3(vocab=VOCAB, window=8, seed=0):
    """Gemma 3's hybrid of sliding-window and full-attention layers."""
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256, sliding_window=window,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    )
    return Gemma3ForCausalLM(config).to(torch.float64).eval()


KINDS = {"llama": lambda: llama(vocab=VOCAB), "sliding": mistral, "hybrid": gemma3}


@functools.lru_cache(maxsize=None)
def pair(kind: str):
    target = KINDS[kind]()
    return target, perturbed_copy(target, 0.2, seed=1)


@functools.lru_cache(maxsize=None)
def reference(kind: str, prompt: int):
    return autoregressive_generate(list(PROMPTS[prompt]), pair(kind)[0], max_gen_len=GEN, eos_tokens_id=[], use_cache=False)


def generate(drafter: str, target, model, prompt, processor, policy, use_cache, gamma, stats, length=GEN, cache=None):
    common = dict(logits_processor=processor, max_gen_len=length, eos_tokens_id=[], use_cache=use_cache, stats=stats, policy=policy,
                  runner=RunnerConfig(cache=cache))
    vocab = target.config.vocab_size
    if drafter == "model":
        return speculative_generate(prompt, model, target, gamma=gamma, **common)[0]
    if drafter == "pld":
        return sampling.generate(prompt, target, PromptLookupSpec(num_pred_tokens=gamma), common)[0]
    if drafter == "chained":
        return sampling.generate(prompt, target, ChainedSpec(), {**common, "gamma": gamma},
                                 DraftContext(storage=NGramStorage(2, vocab), drafter=model))[0]
    storage = (NGramStorage if drafter == "ngram_basic" else OneLevelNGramStorage)(3, vocab)
    return ngram_assisted_speculative_generate(prompt, storage, target, gamma=gamma, **common)[0]


def policy_of(controls) -> DraftPolicy:
    options = {}
    for name in sorted(controls):
        options.update(CONTROLS[name])
    return DraftPolicy(**options)


@settings(max_examples=examples(120), suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(sorted(KINDS)),
    drafter=st.sampled_from(DRAFTERS),
    processor=st.sampled_from(sorted(PROCESSORS)),
    controls=st.sets(st.sampled_from(sorted(CONTROLS)), max_size=4),
    cache=st.sampled_from(["off", "dynamic", "static"]),
    gamma=st.integers(1, 5),
    prompt=st.integers(0, len(PROMPTS) - 1),
)
def test_every_combination_runs_is_greedy_exact_and_drafts_at_most_gamma(kind, drafter, processor, controls, cache, gamma, prompt):
    target, model = pair(kind)
    policy, stats = policy_of(controls), GenerationStats()
    torch.manual_seed(0)
    out = generate(drafter, target, model, list(PROMPTS[prompt]), PROCESSORS[processor], policy, cache != "off", gamma, stats,
                   cache=None if cache == "off" else cache)
    assert len(out) == GEN and all(0 <= t < VOCAB for t in out)
    if processor == "greedy":
        assert out == reference(kind, prompt)
    if not policy.auto:
        assert len(stats.drafted_at) <= gamma, "a number means at most that many drafts per step"


def test_auto_drafts_past_gamma_only_when_asked():
    """The same cheap drafter and costs: gamma 2 is a bound, auto fills the cheaper padded pass."""
    target, _ = pair("llama")
    most = {}
    for auto in (False, True):
        stats = GenerationStats()
        generate("pld", target, None, list(PROMPTS[1]), GreedyProcessor(), DraftPolicy(row_costs=COSTS, auto=auto), True, 2, stats)
        most[auto] = len(stats.drafted_at)
    assert most[False] <= 2 < most[True]


def test_auto_is_refused_without_measured_costs():
    with pytest.raises(ValueError, match="row_costs"):
        DraftPolicy(auto=True)


# ---- sampled output: one chi-square test per control and processor --------------------------
RUNS = 300


@pytest.fixture(scope="module")
def tiny_pair():
    """A 4-token target and a drafter chosen so that a draft kept or dropped after sampling biases
    the first token strongly: at p_min 0.6 the drafter is confident after some first drafts and
    not after others (found by computing that bias exactly over drafter seeds)."""
    return llama(vocab=4, init=0.3, seed=3), llama(vocab=4, init=0.3, seed=27)


def pvalue(samples, exact: dict) -> float:
    """The smaller of two chi-square p-values: the whole continuation's, and its first token's
    (a bias of the first step shows most clearly there)."""
    first = {}
    for cell, mass in exact.items():
        first[cell[:1]] = first.get(cell[:1], 0.0) + mass
    return min(chi_square_pvalue(samples, exact), chi_square_pvalue([s[:1] for s in samples], first))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: a second thread only adds synchronisation (and the suite runs 2.5x faster)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def sampled(tiny_pair, processor, policy_factory, drafter="model", gamma=3, runs=RUNS, length=LENGTH + 2):
    """The first LENGTH tokens of ``runs`` generations of ``length`` tokens (room for the control to
    act) from a fixed seed, and what the first ``RUNS // 4`` of them did (drafted, accepted, target
    passes, paused steps, longest draft), summed."""
    target, model = tiny_pair
    stats, did = GenerationStats(), None
    torch.manual_seed(1234)
    samples = []
    for run in range(runs):
        out = generate(drafter, target, model, list(TINY_PROMPT), processor, policy_factory(), True, gamma, stats, length)
        samples.append(tuple(out[:LENGTH]))
        if run + 1 == RUNS // 4:
            did = (stats.drafted, stats.accepted, stats.target_forward_passes, stats.paused_steps, len(stats.drafted_at))
    return samples, did


def _single(name):
    return lambda: DraftPolicy(**CONTROLS[name])


def _shared(name):
    one = DraftPolicy(**CONTROLS[name])  # reused across generations: what memory is for
    return lambda: one


FACTORIES = {name: (_shared(name) if name == "remember" else _single(name)) for name in CONTROLS}
FACTORIES["readme"] = lambda: DraftPolicy(**README_POLICY)
FACTORIES["min_draft+p_min"] = lambda: DraftPolicy(min_draft=2, p_min=0.6)


@functools.lru_cache(maxsize=None)
def _exact(tiny_target, name):
    return exact_distribution(tiny_target, PROCESSORS[name])


@functools.lru_cache(maxsize=None)
def _plain(tiny_pair, processor: str, drafter: str, gamma: int, length: int) -> tuple:
    """What the first ``RUNS // 4`` generations did without a policy (the same seed, so the same
    draws until a control acts): shared by every control with these settings."""
    return sampled(tiny_pair, PROCESSORS[processor], lambda: None, drafter, gamma, RUNS // 4, length)[1]


# The chi-square grid of control x processor. A control that reads the drafter's processed
# distribution (p_min, and min_draft only beside it: drafters/model.py stops a draft on q.max()) meets
# every processor. The others decide from counts alone (drafted, accepted, rows, costs), the same code
# whatever the processor: each meets multinomial (no token truncated) and one truncating processor, in
# turn, so every truncating processor still meets several controls (test_the_grid_covers...).
READS_Q = ("p_min", "min_draft+p_min", "readme")
TRUNCATING = [name for name in SAMPLING if name != "multinomial"]
_COUNTING = sorted(name for name in FACTORIES if name not in READS_Q)
CONTROL_GRID = [(control, processor) for control in sorted(READS_Q) for processor in SAMPLING] + [
    (control, processor) for i, control in enumerate(_COUNTING) for processor in ("multinomial", TRUNCATING[i % len(TRUNCATING)])]
# the README policy with deterministic drafters: p_min does not act on them (drafters/model.py alone
# reads it), so the processor enters only through verification (test_lossless_sampling's n-gram
# chi-square); the chained drafter holds a drafter model, p_min acts: it meets every processor
README_GRID = [("chained", processor) for processor in SAMPLING] + [
    (drafter, processor) for i, drafter in enumerate(("ngram_basic", "pld")) for processor in ("multinomial", TRUNCATING[i])]


def test_the_grids_cover_every_control_drafter_and_processor():
    """The reduced grids keep: every control and every processor; each control with multinomial and
    with a truncating processor; the controls that read q with all four; each truncating processor
    with at least three counting controls; every README drafter with multinomial and a truncating one."""
    assert {c for c, _ in CONTROL_GRID} == set(FACTORIES) and {p for _, p in CONTROL_GRID} == set(SAMPLING)
    assert len(set(CONTROL_GRID)) == len(CONTROL_GRID)
    for control in FACTORIES:
        met = {p for c, p in CONTROL_GRID if c == control}
        assert "multinomial" in met and met & set(TRUNCATING), control
        assert control not in READS_Q or met == set(SAMPLING), control
    for processor in TRUNCATING:
        assert sum(1 for c, p in CONTROL_GRID if p == processor and c not in READS_Q) >= 3, processor
    assert {p for d, p in README_GRID if d == "chained"} == set(SAMPLING)
    for drafter in ("ngram_basic", "pld"):
        met = {p for d, p in README_GRID if d == drafter}
        assert "multinomial" in met and met & set(TRUNCATING), drafter
    assert {p for _, p in README_GRID} == set(SAMPLING)


@pytest.mark.parametrize("control,processor", CONTROL_GRID)
def test_each_control_keeps_sampled_output_distributed_as_the_target(tiny_pair, control, processor):
    gamma = 1 if control in ("pause", "auto") else 3  # where the control has room to act (adaptive never drafts past gamma)
    # auto fills padded passes for cheap drafters; the gate cuts a cheap drafter's drafts by their evidence
    drafter = "ngram_basic" if control == "auto" else "pld" if control == "gate" else "model"
    # adaptive acts from a step's outcome: at LENGTH + 2 tokens the cap of the last step hides it (the
    # runs equal the plain ones); from LENGTH + 3 it shortens the step that writes token 3 after a
    # fruitless first step, so the chi-square sees it; more tokens only cost time
    length = LENGTH + (3 if control == "adaptive" else 2)
    samples, did = sampled(tiny_pair, PROCESSORS[processor], FACTORIES[control], drafter, gamma, length=length)
    assert did != _plain(tiny_pair, processor, drafter, gamma, length), "the control must change what happens, or this test proves nothing"
    assert pvalue(samples, _exact(tiny_pair[0], processor)) > 1e-4


@pytest.mark.parametrize("drafter,processor", README_GRID)
def test_the_readme_policy_keeps_every_drafters_sampled_output_distributed_as_the_target(tiny_pair, drafter, processor):
    samples, did = sampled(tiny_pair, PROCESSORS[processor], FACTORIES["readme"], drafter=drafter)
    assert did[0] > 0, "some drafts must be verified for the test to mean anything"
    assert pvalue(samples, _exact(tiny_pair[0], processor)) > 1e-4


class DropsAfterSampling(ModelDrafter):
    """The old, biased form of min_draft with p_min: drafts are drawn, then dropped when fewer than 2."""

    def propose(self, ids, tokens, k):
        count, q = super().propose(ids, tokens, k)
        return (count, q) if count >= 2 else (0, None)


def test_the_chi_square_test_rejects_dropping_drafts_after_sampling(tiny_pair):
    """The power check: the same count and seed as the cells see the biased drafter (p 2e-13). Both
    models run on the lean runner, as the cells' do (``make_runner``'s default for a cached Llama): it
    computes transformers' logits bit for bit, so the samples are those of ``KVCacheModel``, at 3/4 of
    its cost."""
    target, model = tiny_pair
    processor = PROCESSORS["multinomial"]
    torch.manual_seed(1234)
    samples = []
    for _ in range(RUNS):
        drafter = DropsAfterSampling(LeanRunner(model), processor, 4, None, p_min=0.6)
        config = GenerationConfig(processor=processor, gamma=3, max_gen_len=LENGTH, vocab_size=4, first_target=False)
        samples.append(tuple(draft_and_verify(list(TINY_PROMPT), LeanRunner(target), drafter, config)))
    assert pvalue(samples, _exact(target, "multinomial")) < 1e-6


# ---- state across generations ---------------------------------------------------------------
def test_a_reused_policy_gives_the_same_result_whatever_ran_before():
    """Without memory (the default), an easy prompt after hard ones costs what it costs fresh."""
    target, model = pair("llama")
    hard, easy = [7, 19, 2, 14, 21, 5, 11, 16], list(PROMPTS[1])
    calibrated = dict(row_costs=COSTS, draft_cost=0.5, min_gain=1.0)

    def passes(policy, prompt):
        stats = GenerationStats()
        out = generate("model", target, model, prompt, GreedyProcessor(), policy, True, 4, stats)
        return out, stats.target_forward_passes, stats.drafted

    fresh = passes(DraftPolicy(**calibrated), easy)
    reused = DraftPolicy(**calibrated)
    for _ in range(3):
        passes(reused, hard)
    assert passes(reused, easy) == fresh and reused.remembered == 0
    remembering = DraftPolicy(remember=True, **calibrated)
    for _ in range(3):
        passes(remembering, hard)
    assert remembering.remembered == 1
    remembering.forget()
    assert passes(remembering, easy) == fresh


# ---- calibration ----------------------------------------------------------------------------
def test_implausible_verification_costs_are_measured_again_then_not_used(monkeypatch):
    from measure import timing
    from sampling import calibrated_policy

    assert plausible_row_costs((1.0, 1.1, 1.3, 1.2)) and not plausible_row_costs((1.0, 1.1, 0.3, 0.13))
    measured = iter([(1.0, 0.39, 0.13), (1.0, 0.2, 0.3)])
    monkeypatch.setattr(timing, "measure_row_costs", lambda model, **kwargs: next(measured))
    policy = calibrated_policy(pair("llama")[0])
    assert policy.row_costs is None and "not plausible" in policy.calibration
    measured = iter([(1.0, 0.39, 0.13), (1.0, 1.1, 1.2)])
    assert calibrated_policy(pair("llama")[0]).row_costs == (1.0, 1.1, 1.2)
