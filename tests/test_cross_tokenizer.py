"""A drafter with its own tokenizer (drafters/cross_tokenizer.py): greedy output equals the target's
autoregressive output, sampling follows the target's distribution (chi-square with a power check),
on tiny models whose tokenizers, built here, deliberately disagree."""
from typing import Dict, List, Sequence, Tuple

import pytest
import torch
from tokenizers import Tokenizer, decoders, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from conftest import llama
from drafters.cross_tokenizer import Translation, spelled
from sampling import GenerationStats, autoregressive_generate, speculative_generate
from test_lossless_sampling import SAMPLED_GRID, chi_square_pvalue, exact_distribution as lossless_exact
from utils.logits_processor import GreedyProcessor, MultinomialProcessor, NucleusProcessor, TopKProcessor

# the power check (test_the_chi_square_test_sees_a_biased_cross_sampler) sees its bias at p = 5e-14 with
# 800 (2e-21 at 1,250, 9e-8 at 625: too close to its 1e-6); the same seed, so 800 are the first 800 of 1,250
RUNS = 800


def tokenizer(vocab: Sequence[str], merges: Sequence[Tuple[str, str]] = ()) -> PreTrainedTokenizerFast:
    """A BPE tokenizer over ``vocab`` (ids in order) with ``merges``, no pre-tokenizer, decoding by concatenation."""
    inner = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(vocab)}, merges=list(merges)))
    inner.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=inner)


# the target writes "cd" as one token the drafter does not have; the drafter has "ab" and "bc"
TARGET_TOK = tokenizer(["a", "b", "c", "d", "cd"], [("c", "d")])
DRAFTER_TOK = tokenizer(["d", "c", "b", "a", "ab", "bc"], [("a", "b"), ("b", "c")])


def bigram(vocab: Sequence[str], follows: Dict[str, str]) -> LlamaForCausalLM:
    """A real tiny llama whose greedy next token depends on the current token only: ``follows[token]``
    (attention and MLP outputs zero, embeddings one-hot, the head a map from token to successor)."""
    size = len(vocab)
    config = LlamaConfig(vocab_size=size, hidden_size=8 * ((size + 7) // 8), intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(torch.float64).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for i, text in enumerate(vocab):
            model.model.embed_tokens.weight[i, i] = 1.0
            model.lm_head.weight[vocab.index(follows[text]), i] = 10.0
    return model


def cross(prompt, drafter, target, target_tok=TARGET_TOK, drafter_tok=DRAFTER_TOK, **kwargs):
    return speculative_generate(prompt, drafter, target, target_tok, drafter_tokenizer=drafter_tok, eos_tokens_id=[], **kwargs)


def test_shared_tokens_are_those_spelled_identically():
    spelling = Translation(TARGET_TOK, DRAFTER_TOK)
    pairs = {(spelled(DRAFTER_TOK).get(t), spelled(TARGET_TOK)[t]) for t in "abcd"}
    assert set(zip(spelling.drafter_ids.tolist(), spelling.target_ids.tolist())) == pairs
    assert spelling.shared == 4  # "cd", "ab", "bc" are each one side's only


def test_a_draft_text_may_end_inside_a_target_token():
    """The trap the drafter avoids: "...c" is a target token "c" until a "d" follows and makes it "cd"."""
    spelling = Translation(TARGET_TOK, DRAFTER_TOK)
    committed = TARGET_TOK("ab").input_ids
    assert spelling.continuation(committed, "abc") == TARGET_TOK("abc").input_ids
    assert spelling.continuation(committed, "abcd") == TARGET_TOK("ab").input_ids + [TARGET_TOK.get_vocab()["cd"]]


# the drafter writes one character a pass, the target "bcda" as one token: a draft's text that stops
# after "bcd" ends inside the target's next token and must not be drafted as the token "bcd"
LONG_TARGET = ["a", "b", "c", "d", "bc", "bcd", "bcda"]
LONG_TOK = tokenizer(LONG_TARGET, [("b", "c"), ("bc", "d"), ("bcd", "a")])
CHARS_TOK = tokenizer(["a", "b", "c", "d"])


@pytest.mark.parametrize("gamma", [1, 2, 4])
@pytest.mark.parametrize("use_cache", [False, True], ids=["no_cache", "cache"])
def test_greedy_drafts_never_end_inside_a_target_token(gamma, use_cache):
    target = bigram(LONG_TARGET, {"a": "bcda", "bcda": "bcda", "b": "a", "c": "a", "d": "a", "bc": "a", "bcd": "a"})
    drafter = bigram(["a", "b", "c", "d"], {"a": "b", "b": "c", "c": "d", "d": "a"})
    prompt = LONG_TOK("a").input_ids
    stats = GenerationStats()
    out, rate = cross(prompt, drafter, target, LONG_TOK, CHARS_TOK, gamma=gamma, max_gen_len=12, use_cache=use_cache, stats=stats)
    assert out == autoregressive_generate(prompt, target, 12, eos_tokens_id=[], use_cache=use_cache)
    # a draft "bcd" (or "b" after "bcda") would have been rejected; with gamma 1 the drafter's 3 passes
    # write "bcd", inside the target's next token, so nothing is drafted
    assert stats.accepted == stats.drafted and (stats.drafted > 0) == (gamma > 1)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("use_cache", [False, True], ids=["no_cache", "cache"])
def test_greedy_output_equals_target_autoregressive(seed, gamma, use_cache):
    """Random tiny models, tokenizers that disagree on "cd", "ab", "bc": the target's own greedy output."""
    target, drafter = llama(vocab=5, init=0.3, seed=seed), llama(vocab=6, init=0.3, seed=seed + 100)
    prompt = TARGET_TOK(["abcdab", "cdcda", "dbca", "aaaacd"][seed]).input_ids
    stats = GenerationStats()
    out, _ = cross(prompt, drafter, target, gamma=gamma, max_gen_len=20, use_cache=use_cache, stats=stats)
    assert out == autoregressive_generate(prompt, target, 20, eos_tokens_id=[], use_cache=use_cache)
    assert stats.drafted > 0


def test_greedy_with_the_drafters_own_prompt_rendering():
    """``drafter_inputs``: the drafter reads its own rendering of the prompt; the output is still the target's."""
    target, drafter = llama(vocab=5, init=0.3, seed=7), llama(vocab=6, init=0.3, seed=8)
    prompt = TARGET_TOK("abcd").input_ids
    out, _ = cross(prompt, drafter, target, gamma=3, max_gen_len=15, use_cache=True, drafter_inputs=DRAFTER_TOK("bcab").input_ids)
    assert out == autoregressive_generate(prompt, target, 15, eos_tokens_id=[], use_cache=True)


def test_python_refuses_in_one_line_a_drafter_that_cannot_spell_the_prompt():
    """The drafter's tokenizer has no "d": the prompt's text cannot round-trip, nothing is generated."""
    target, drafter = llama(vocab=5, init=0.3, seed=1), llama(vocab=3, init=0.3, seed=2)
    with pytest.raises(ValueError, match=r"^the drafter '.*' cannot spell the target's text: its tokenizer turns 'd"):
        cross(TARGET_TOK("abd").input_ids, drafter, target, drafter_tok=tokenizer(["a", "b", "c"]), max_gen_len=4)
    with pytest.raises(ValueError, match="needs the target's tokenizer"):
        cross(TARGET_TOK("ab").input_ids, drafter, target, target_tok=None, max_gen_len=4)


LENGTH = 3
PROCESSORS = {"multinomial": MultinomialProcessor(1.0), "topk": TopKProcessor(0.8, 3), "nucleus": NucleusProcessor(1.2, 0.8)}


@pytest.fixture(scope="module")
def sampling_pair():
    """A target over TARGET_TOK and a drafter over DRAFTER_TOK with clearly different distributions."""
    return llama(vocab=5, init=0.3, seed=3), llama(vocab=6, init=0.3, seed=4)


def exact_distribution(model, processor, prompt: List[int], length: int = LENGTH) -> dict:
    """The target's exact distribution over its whole vocabulary (``test_lossless_sampling``'s enumeration)."""
    return lossless_exact(model, processor, prompt, length, model.config.vocab_size)


def sample_many(generate) -> list:
    torch.manual_seed(1234)
    return [tuple(generate()) for _ in range(RUNS)]


PROMPT = TARGET_TOK("abcab").input_ids


def test_the_sampled_grid_names_this_files_processors():
    """SAMPLED_GRID (test_lossless_sampling's processor x cache grid: each processor once, multinomial in both cache
    modes) meets every processor this file samples with."""
    assert {name for name, _ in SAMPLED_GRID} == set(PROCESSORS)


@pytest.mark.parametrize("name,use_cache", SAMPLED_GRID, ids=[f"{name}-{'cache' if on else 'no_cache'}" for name, on in SAMPLED_GRID])
def test_sampled_cross_drafting_follows_target_distribution(sampling_pair, name, use_cache):
    target, drafter = sampling_pair
    processor, rates = PROCESSORS[name], []

    def run():
        out, rate = cross(PROMPT, drafter, target, gamma=2, logits_processor=processor, max_gen_len=LENGTH,
                          use_cache=use_cache, first_target=False)
        rates.append(rate)
        return out

    samples = sample_many(run)
    assert sum(rates) / len(rates) > 0.1, "drafts must be accepted often for the test to mean anything"
    assert chi_square_pvalue(samples, exact_distribution(target, processor, PROMPT)) > 1e-3


def test_the_chi_square_test_sees_a_biased_cross_sampler(sampling_pair):
    """Power: the same test, without the residual (``skip_sample_adjustment``), fails."""
    target, drafter = sampling_pair
    processor = PROCESSORS["multinomial"]
    samples = sample_many(lambda: cross(PROMPT, drafter, target, gamma=2, logits_processor=processor, max_gen_len=LENGTH,
                                        use_cache=True, first_target=False, skip_sample_adjustment=True)[0])
    assert chi_square_pvalue(samples, exact_distribution(target, processor, PROMPT)) < 1e-6


# ---- the session: a drafter with its own tokenizer is accepted, or dropped in one line ----
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ["def area(r):\n    return 3.14 * r ** 2\n", "The quick brown fox jumps over the lazy dog.", "Hello, how are you?"] * 20


def byte_tokenizer(size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained here (it spells any text), with ChatML's two special tokens."""
    from tokenizers import pre_tokenizers, trainers

    inner = Tokenizer(models.BPE())
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|im_start|>", "<|im_end|>"])
    inner.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=inner, eos_token="<|im_end|>")


def save_drafter(folder, tok, chat: bool = True) -> str:
    """A tiny llama over ``tok``'s vocabulary saved in ``folder`` with ``tok`` (None: no tokenizer files)."""
    model = llama(vocab=len(tok) if tok is not None else 300, layers=1, window=4096, seed=5)
    model.to(torch.float32).save_pretrained(folder)
    if tok is not None:
        tok.chat_template = CHATML if chat else None
        tok.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def drafters(tmp_path_factory):
    root = tmp_path_factory.mktemp("cross")
    ascii_only = tokenizer([chr(c) for c in range(32, 127)] + ["\n", "<|im_start|>", "<|im_end|>"])
    return {"cross": save_drafter(root / "cross", byte_tokenizer()),
            "no_chat": save_drafter(root / "no_chat", byte_tokenizer(), chat=False),
            "ascii": save_drafter(root / "ascii", ascii_only),
            "no_tokenizer": save_drafter(root / "no_tokenizer", None)}


def load(target: str, drafter: str, lines: list):
    from app.pair import LoadOptions, load_pair

    return load_pair(target, drafter, LoadOptions("cpu", cache="dynamic", prepack="off", calibrate=False),
                     say=lambda text, style="": lines.append(text))


@pytest.mark.parametrize("kind, missing", [
    ("no_tokenizer", "has another vocabulary and no tokenizer"),
    ("no_chat", "has no chat template and the target's prompts are rendered by one"),
    ("ascii", "cannot spell the target's text"),
])
def test_a_drafter_that_cannot_translate_is_one_line_and_the_other_strategies_run(tiny_models, drafters, kind, missing):
    from app.session import build_settings, encode
    from strategies import BY_KEY, run_strategy

    lines = []
    pair = load(tiny_models["target"], drafters[kind], lines)
    said = [line for line in lines if missing in line]
    assert len(said) == 1 and drafters[kind] in said[0] and said[0].endswith("speculative decoding off")
    assert pair.drafter is None and pair.drafter_tokenizer is None
    config, context = build_settings(pair, "greedy", length=4)
    assert len(run_strategy(BY_KEY["target"], encode(pair.tokenizer, "Hi", True), config, context).tokens) == 4


def test_the_session_accepts_a_drafter_with_its_own_tokenizer(tiny_models, drafters):
    """The header says how the two relate; the drafter reads the conversation in its own template; the
    speculative row drafts across tokenizers and its greedy output is the target's."""
    from app.session import build_settings, encode
    from strategies import BY_KEY, run_strategy

    pair = load(tiny_models["target"], drafters["cross"], [])
    assert pair.drafter is not None and pair.drafter_tokenizer is not None
    shared = Translation(pair.tokenizer, pair.drafter_tokenizer).shared
    assert f"{shared} spelled identically" in pair.describe("drafter") and shared > 0
    assert "translation: text (greedy) / intersection (sampling)" in pair.describe("drafter")
    config, context = build_settings(pair, "greedy", length=12)
    prompt = encode(pair.tokenizer, "def area(r):", True)
    own = context.drafter_prompt(prompt)
    text = pair.drafter_tokenizer.apply_chat_template([{"role": "user", "content": "def area(r):"}], add_generation_prompt=True,
                                                      tokenize=False)
    assert text.startswith("<|im_start|>user\n") and own == pair.drafter_tokenizer(text, add_special_tokens=False).input_ids
    result = run_strategy(BY_KEY["speculative"], prompt, config, context)
    assert result.tokens == run_strategy(BY_KEY["target"], prompt, config, context).tokens
    assert result.stats.drafted > 0
    assert len(run_strategy(BY_KEY["drafter"], prompt, config, context).tokens) > 0  # the drafter alone, written in target tokens


def test_transformers_universal_assisted_generation_runs_our_gamma(tiny_models, drafters, monkeypatch):
    """The hf_assisted row, with a drafter of another tokenizer, is transformers' UAG drafting gamma
    assistant tokens a step, constant schedule, no confidence stop (spied on its candidate generator)."""
    from transformers.generation import candidate_generator as hf

    from app.session import build_settings, encode
    from strategies import EVERY, run_strategy

    steps = []
    original = hf.AssistedCandidateGeneratorDifferentTokenizers.get_candidates

    def spy(self, input_ids, *args, **kwargs):
        steps.append((type(self).__name__, int(self.num_assistant_tokens), self.assistant_generation_config.num_assistant_tokens_schedule,
                      self.generation_config.assistant_confidence_threshold))
        return original(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(hf.AssistedCandidateGeneratorDifferentTokenizers, "get_candidates", spy)
    pair = load(tiny_models["target"], drafters["cross"], [])
    config, context = build_settings(pair, "greedy", gamma=3, length=10)
    prompt = encode(pair.tokenizer, "Hello", True)
    result = run_strategy(EVERY["hf_assisted"], prompt, config, context)
    assert steps and set(steps) == {("AssistedCandidateGeneratorDifferentTokenizers", 3, "constant", 0.0)}
    assert result.stats.peer_settings["translation"] == "text (UAG)"
    assert result.tokens == run_strategy(EVERY["target"], prompt, config, context).tokens


def test_the_drafter_alone_runs_on_the_drafters_runner_whatever_its_tokenizer(tiny_models, drafters, monkeypatch):
    """The "Drafter AR" row runs the drafter's passes as ``drafter_runner`` says, with its own tokenizer
    too (it ran them on the target's runner before)."""
    import rows
    from app.session import build_settings, encode
    from runners import RunnerConfig
    from strategies import BY_KEY, run_strategy

    ran = []
    real = rows.autoregressive_generate
    monkeypatch.setattr(rows, "autoregressive_generate", lambda prompt, model, **kw: ran.append((model, kw["runner"])) or real(prompt, model, **kw))
    pair = load(tiny_models["target"], drafters["cross"], [])
    config, context = build_settings(pair, "greedy", length=4)
    config = config.with_(runner=RunnerConfig("static"), drafter_runner=RunnerConfig("dynamic"))
    run_strategy(BY_KEY["drafter"], encode(pair.tokenizer, "Hi", True), config, context)
    assert ran == [(pair.drafter, RunnerConfig("dynamic"))]
