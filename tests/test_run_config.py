"""A run's values (``RunConfig``) and live objects (``RunContext``), apart: the values print, compare,
hash and go to JSON and back equal; a REPL command that changes one replaces the config, never
changes it; built-in and registered rows' parameters live in the one mapping; a drafter spec is a
value too, its checks made once, in one line."""
import dataclasses
import json
from types import SimpleNamespace

import pytest

from conftest import llama
from configuration import BUILT_IN_PARAMS, PARAMS, RunConfig, RunContext
from drafters import ChainedSpec, MergedSpec, NGramSpec, NGramTreeSpec, PromptLookupSpec, RecyclingSpec, SuffixSpec
from drafters.eagle import EagleSpec
from runners import RunnerConfig
from measure.kernels import KernelChoice
from sampling.draft_policy import DraftPolicy
from sampling.policy_settings import PolicySettings
from utils.parsing import LIMITS


def full_config() -> RunConfig:
    return RunConfig(processor="nucleus 0.6 0.9", gamma=6, max_gen_len=12, eos_tokens_id=[2, 7], use_cache=False, debug=True,
                     stop_if_unknown=True, hf_compile=True,
                     policy=PolicySettings(adaptive=True, row_costs=(1, 1.1, 1.3), auto=True, min_gain=1.0, calibration="measured"),
                     kernel_choice=KernelChoice({"own": (1.0, 1.2), "prepacked": (0.9, 1.3)}), runner=RunnerConfig("static", True),
                     drafter_runner=RunnerConfig("dynamic")).with_(tree_size=8, pld_num_tokens=5, max_spec_factor=2.5)


def test_the_config_is_a_value_that_goes_to_json_and_back_equal():
    config = full_config()
    back = RunConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert back == config and hash(back) == hash(config) and repr(back) == repr(config)
    assert back.policy.row_costs == (1.0, 1.1, 1.3) and back.eos_tokens_id == (2, 7)
    assert {config: 1}[back] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.gamma = 3


def test_equal_settings_make_equal_configs():
    assert RunConfig().with_(tree_size=16) == RunConfig()  # a parameter at its default is not kept apart
    assert RunConfig(processor="greedy 1.0") == RunConfig() and RunConfig(processor="topk 0.7 20").processor == "topk 0.7 20"
    assert RunConfig().with_(tree_size=9) != RunConfig() and RunConfig().with_(tree_size=9).param("tree_size") == 9


def test_bad_values_are_refused_in_one_line():
    for bad in (dict(processor="beam 3"), dict(params=(("nope", 1),))):
        with pytest.raises(ValueError) as refused:
            RunConfig(**bad)
        assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="auto draft lengths need measured row_costs"):
        RunConfig().with_policy(auto=True)


def test_every_row_parameter_is_a_param_in_one_table_with_its_limits():
    assert all(PARAMS[p.name] is p and LIMITS[p.name if p.name in LIMITS else "pld_ngram"] == (p.low, p.high) for p in BUILT_IN_PARAMS)
    config = RunConfig()
    assert config.suffix.max_tree_depth == 24 and config.param("pld_num_tokens") == 10 and config.param("top_k_filler") == 3


def test_the_policy_values_are_the_draft_policys_and_its_memory_is_the_contexts():
    assert [f.name for f in dataclasses.fields(PolicySettings)] == [f.name for f in dataclasses.fields(DraftPolicy)]
    policy = DraftPolicy(adaptive=True, min_draft=2, row_costs=(1.0, 1.2), remember=True, min_gain=0.5)
    values = PolicySettings.of(policy)
    assert dataclasses.asdict(values.policy()) == dataclasses.asdict(policy)
    context = RunContext(target=llama(), tokenizer=None)
    first, second = (context.policy(RunConfig(policy=values)) for _ in range(2))
    first._memory["drafter"] = (1.0, 2.0, 8, True)  # what a generation's policy remembers, the run keeps
    assert second.remembered == 1 and context.policy_memory == {"drafter": (1.0, 2.0, 8, True)}


def test_a_repl_command_replaces_the_config_and_leaves_the_old_one_as_it_was():
    from app.repl.commands import COMMANDS

    before = RunConfig()
    repl = SimpleNamespace(config=before, context=RunContext(target=llama(), tokenizer=None), enabled={})
    for line in ("/gamma 7", "/length 9", "/cache", "/tree_size 5", "/pld_params 2 4 6", "/adaptive", "/pause 3 5", "/min_gain 1.5",
                 "/top_k_filler 1", "/suffix_params 8 6 2 0 0.2"):
        name, *words = line.split()
        if name == "/suffix_params":
            repl.suffix_memory = SimpleNamespace(set_depth=lambda depth: None)
        COMMANDS[name](repl, words)
    assert before == RunConfig()
    after = repl.config
    assert (after.gamma, after.max_gen_len, after.use_cache, after.param("tree_size"), after.param("top_k_filler")) == (7, 9, False, 5, 1)
    assert [after.param(f"pld_{n}") for n in ("min_ngram", "max_ngram", "num_tokens")] == [2, 4, 6]
    assert (after.policy.adaptive, after.policy.pause_after, after.policy.pause_steps, after.policy.min_gain) == (True, 3, 5, 1.5)
    assert after.suffix.arguments() == dict(max_tree_depth=8, max_spec_tokens=6, max_spec_factor=2.0, max_spec_offset=0.0,
                                            min_token_prob=0.2)


def test_specs_are_values_checked_once_in_one_line():
    specs = [PromptLookupSpec(), NGramSpec(), NGramTreeSpec(), ChainedSpec(), SuffixSpec(trees=True), RecyclingSpec(), MergedSpec(),
             EagleSpec(trees=True)]
    assert len(set(specs)) == len(specs) and all(json.loads(json.dumps(s.to_dict()))["spec"] == type(s).__name__ for s in specs)
    assert [s.trees for s in specs] == [False, False, True, False, True, True, True, True]
    assert PromptLookupSpec(num_pred_tokens=4).prepare(None, None) == {"trees": False, "gamma": 4}
    for make, message in ((lambda: PromptLookupSpec(num_pred_tokens=0), "num_pred_tokens must be an integer >= 1"),
                          (lambda: PromptLookupSpec(min_ngram_size=3, max_ngram_size=2), "min_ngram_size (3) must be <= max_ngram_size"),
                          (lambda: SuffixSpec(max_tree_depth=65), "max_tree_depth must be an integer from 1 to 64"),
                          (lambda: RecyclingSpec(tree_size=0), "tree_size must be an integer >= 1"),
                          (lambda: MergedSpec(model_depth=-1), "model_depth must be an integer >= 1")):
        with pytest.raises(ValueError) as refused:
            make()
        assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_spec_needing_a_live_object_says_which_in_one_line():
    from sampling import generate

    with pytest.raises(ValueError) as refused:
        generate([1, 2, 3], llama(), NGramSpec(), dict(max_gen_len=2))
    assert str(refused.value) == "n-gram drafting needs DraftContext.storage"
