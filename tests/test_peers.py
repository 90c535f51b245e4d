"""transformers' peers run what their rows say: a spy on transformers' own candidate generators records,
step by step, how many tokens were drafted and with which schedule and confidence threshold."""
from typing import Tuple

import pytest
from transformers.generation import candidate_generator as hf

import bench
from conftest import llama, perturbed_copy
from strategies import EVERY, RunConfig, RunContext, run_strategy, transformers_assisted_defaults

PROMPT = [5, 17, 33, 5, 17, 40, 2, 9, 5, 17, 33, 71, 5, 17, 33, 5, 17, 40]  # repeats: prompt lookup finds matches
LENGTH = 40
# every candidate generator transformers 5.23 may pick for a same-tokenizer assistant or prompt lookup
SPIED = [hf.AssistedCandidateGenerator, hf.AssistedCandidateGeneratorDifferentTokenizers, hf.PromptLookupCandidateGenerator]


@pytest.fixture
def spy(monkeypatch):
    """Each ``get_candidates`` call of transformers' candidate generators: its class, the tokens it
    drafted, and the settings in force (draft length, schedule, confidence threshold, n-gram size)."""
    steps = []
    for cls in SPIED:
        original = cls.__dict__["get_candidates"]

        def get_candidates(self, input_ids, *args, _original=original, **kwargs):
            candidates, logits = _original(self, input_ids, *args, **kwargs)
            step = {"class": type(self).__name__, "drafted": candidates.shape[-1] - input_ids.shape[-1]}
            if isinstance(self, hf.AssistedCandidateGenerator):
                step.update(num_assistant_tokens=int(self.num_assistant_tokens),
                            schedule=self.assistant_generation_config.num_assistant_tokens_schedule,
                            threshold=self.generation_config.assistant_confidence_threshold)
            else:
                step.update(num_output_tokens=self.num_output_tokens, max_matching_ngram_size=self.max_matching_ngram_size)
            steps.append(step)
            return candidates, logits

        monkeypatch.setattr(cls, "get_candidates", get_candidates)
    return steps


@pytest.fixture(scope="module")
def models():
    target = llama(seed=0)
    return target, perturbed_copy(target, 0.2, seed=1)


def settings(models, gamma: int = 4) -> Tuple[RunConfig, RunContext]:
    target, drafter = models
    return RunConfig(gamma=gamma, max_gen_len=LENGTH), RunContext(target, None, drafter=drafter)


def run(key: str, s: Tuple[RunConfig, RunContext]):
    """The row as the benchmark runs it (``Bench.run`` -> ``run_strategy``)."""
    return run_strategy(EVERY[key], PROMPT, *s)


def assistant_fields(model) -> dict:
    return {name: getattr(model.generation_config, name) for name in
            ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}


@pytest.mark.parametrize("gamma", [1, 3])
def test_same_settings_assisted_row_drafts_its_gamma_constant_without_a_confidence_stop(models, spy, gamma):
    result = run("hf_assisted", settings(models, gamma))
    assert spy and {step["class"] for step in spy} == {"AssistedCandidateGenerator"}
    assert max(step["drafted"] for step in spy) == gamma  # its gamma, never transformers' 20
    assert all(step["num_assistant_tokens"] == gamma and step["schedule"] == "constant" for step in spy)
    assert all(not step["threshold"] for step in spy)  # ConfidenceCriteria is added only for a threshold > 0
    # the benchmark's record sees the same steps, and what transformers emitted at each
    assert result.stats.drafted_by_step == [step["drafted"] for step in spy]
    assert sum(result.stats.emitted_by_step) == len(result.tokens) == LENGTH
    assert result.stats.peer_settings == {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
                                          "assistant_confidence_threshold": 0.0}
    reference = run("target", settings(models))
    assert result.tokens == reference.tokens  # greedy: still the target's own output


def test_recommended_assisted_row_runs_transformers_defaults_whatever_the_drafter_says(models, spy):
    defaults = transformers_assisted_defaults()
    s = settings(models)
    drafter = s[1].drafter
    drafter.generation_config.num_assistant_tokens = 7  # a drafter whose own config says otherwise
    try:
        result = run("hf_assisted_default", s)
    finally:
        drafter.generation_config.num_assistant_tokens = None
    first = spy[0]
    assert (first["num_assistant_tokens"], first["schedule"], first["threshold"]) == (
        defaults["num_assistant_tokens"], defaults["num_assistant_tokens_schedule"], defaults["assistant_confidence_threshold"])
    assert first["threshold"] > 0  # its confidence stop is on
    assert result.stats.peer_settings == defaults
    assert bench.Config("hf_assisted_default").label == (
        f"hf_assisted_default[{defaults['num_assistant_tokens']} {defaults['num_assistant_tokens_schedule']} "
        f"conf={defaults['assistant_confidence_threshold']}]")


def test_assistant_generation_config_is_restored_after_every_assisted_row(models, spy):
    s = settings(models, gamma=2)
    config = s[1].drafter.generation_config
    mine = {"num_assistant_tokens": 9, "num_assistant_tokens_schedule": "heuristic", "assistant_confidence_threshold": 0.25}
    for name, value in mine.items():
        setattr(config, name, value)
    try:
        before = config.to_dict()
        for key in ("hf_assisted", "hf_assisted_default", "hf_assisted"):
            run(key, s)
            assert config.to_dict() == before, key
        assert assistant_fields(s[1].drafter) == mine
    finally:
        for name in mine:
            setattr(config, name, None)
    assert "_get_candidate_generator" not in vars(s[1].target)  # the step observer is gone too


def test_prompt_lookup_row_drafts_our_pld_length_with_our_ngram_size(models, spy):
    config, context = settings(models)
    result = run("hf_prompt_lookup", (config.with_(pld_num_tokens=3, pld_max_ngram=2), context))
    assert spy and {step["class"] for step in spy} == {"PromptLookupCandidateGenerator"}
    assert all(step["num_output_tokens"] == 3 and step["max_matching_ngram_size"] == 2 for step in spy)
    assert max(step["drafted"] for step in spy) == 3  # the prompt repeats itself: full drafts occur
    assert result.stats.drafted_by_step == [step["drafted"] for step in spy]
    assert sum(result.stats.emitted_by_step) == len(result.tokens)
    assert result.stats.accepted <= result.stats.drafted
    assert bench.Config("hf_prompt_lookup").label == (
        f"hf_prompt_lookup[g={RunConfig().param('pld_num_tokens')} n<={RunConfig().param('pld_max_ngram')}]")


def test_peer_labels_say_what_ran():
    assert bench.Config("hf_assisted", gamma=4).label == "hf_assisted[g=4 constant]"
    assert bench.Config("hf_assisted", gamma=4).family == "hf_assisted[constant]"
    assert "no confidence stop" in EVERY["hf_assisted"].title and "defaults" in EVERY["hf_assisted_default"].title


@pytest.mark.needs_cxx
def test_compiled_static_cache_peer_runs_and_records_the_models_own_layers():
    """transformers compiles its own static-cache step over the model's own linear layers: the row's
    kernels are chosen as "own" and its result says so, whatever the measured plan the other rows run."""
    from measure import OWN, KernelChoice
    from strategies import row_kernels

    target = llama(layers=1)
    choice = KernelChoice({"prepacked": (1.0,) * 12, "own": (2.0,) * 12})  # prepacked measured faster everywhere
    config = RunConfig(max_gen_len=LENGTH, kernel_choice=choice, hf_compile=True)
    assert row_kernels(EVERY["hf_generate_static"], config) == OWN
    assert row_kernels(EVERY["target"], config) is None  # the model's plan, as the measurement gave it
