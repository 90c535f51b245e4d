"""Code written for the reference (romsto/Speculative-Decoding, HEAD db7db67) runs here unchanged.

(a) every public name of the reference imports from the reference's module path, with its
parameter names, order and defaults (written down below from the reference's source);
(b) the reference README's usage examples run, with tiny models in place of the Hub models;
(c) an n-gram storage written against the reference's interface drafts for NASD;
(d) beam search returns the reference's sequences, except where the reference's own bugs
decide, which an oracle written from the reference's source names;
(e) the REPL keeps the reference's commands, arguments and defaults.
"""
import importlib
import inspect
import itertools

import pytest
import torch

from conftest import PROMPT, gpt2, llama, t5
from drafters import ChainedSpec, DraftContext
from ngram_assisted import INgramStorage, NGramStorage, OneLevelNGramStorage
from ngram_assisted import ngram_assisted_speculative_generate
from sampling import autoregressive_generate, beam_search_generate, generate
from utils.logits_processor import GreedyProcessor

REQUIRED = inspect.Parameter.empty


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from threads, and on a shared machine they cost ten times the time."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

# ---- (a) the reference's public surface, from its source -------------------------------------
_GENERATE = [("inputs", REQUIRED), ("model", REQUIRED), ("max_gen_len", 40), ("logits_processor", GreedyProcessor()),
             ("eos_tokens_id", 1), ("pad_token_id", 0), ("use_cache", False), ("debug", False)]
_SPECULATIVE = [("inputs", REQUIRED), ("drafter", REQUIRED), ("target", REQUIRED), ("tokenizer", None), ("gamma", 5),
                ("logits_processor", GreedyProcessor()), ("max_gen_len", 40), ("eos_tokens_id", 1), ("pad_token_id", 0),
                ("use_cache", False), ("skip_sample_adjustment", False), ("first_target", True), ("debug", False)]
_PRUNE = [("cache", REQUIRED), ("num_tokens_to_discard", REQUIRED)]
_STORAGE_METHODS = {"__init__": [("self", REQUIRED), ("n", REQUIRED), ("vocab_size", REQUIRED)],
                    "next_token": [("self", REQUIRED), ("input_ids", REQUIRED)],
                    "has_gram": [("self", REQUIRED), ("ngram", REQUIRED)],
                    "update": [("self", REQUIRED), ("input_ids", REQUIRED), ("next_tokens", REQUIRED)],
                    "initialize": [("self", REQUIRED), ("input_ids", REQUIRED)],
                    "reset": [("self", REQUIRED)]}
_PROCESSOR_METHODS = {"__call__": [("self", REQUIRED), ("logits", REQUIRED)], "_process": [("self", REQUIRED), ("logits", REQUIRED)],
                      "sample": [("self", REQUIRED), ("probs", REQUIRED)]}

# (module, name): parameters of a function, or {method: parameters} of a class
REFERENCE = {
    ("sampling", "autoregressive_generate"): _GENERATE,
    ("sampling", "speculative_generate"): _SPECULATIVE,
    ("sampling", "beam_search_generate"): [
        ("inputs", REQUIRED), ("model", REQUIRED), ("max_gen_len", 40), ("num_beams", 4), ("top_k", 3), ("min_length", 5.0),
        ("alpha", 1.2), ("eos_tokens_id", 1), ("pad_token_id", 0), ("debug", False), ("tokenizer", None)],
    ("sampling", "autoregressive_generate_encoder_decoder"): _GENERATE,
    ("sampling", "speculative_generate_encoder_decoder"): _SPECULATIVE,
    ("sampling.base_decoding", "autoregressive_generate"): _GENERATE,
    ("sampling.base_decoding", "beam_search_generate"): "sampling.beam_search_generate",
    ("sampling.speculative_decoding", "speculative_generate"): _SPECULATIVE,
    ("sampling.speculative_decoding", "max_fn"): [("x", REQUIRED)],
    ("sampling.codec_base_decoding", "autoregressive_generate_encoder_decoder"): _GENERATE,
    ("sampling.codec_speculative_decoding", "speculative_generate_encoder_decoder"): _SPECULATIVE,
    ("sampling.codec_speculative_decoding", "max_fn"): [("x", REQUIRED)],
    ("ngram_assisted", "ngram_assisted_speculative_generate"): [
        ("inputs", REQUIRED), ("ngramstorage", REQUIRED), ("target", REQUIRED), ("tokenizer", None), ("gamma", 5),
        ("filler_top_k", 3), ("logits_processor", GreedyProcessor()), ("max_gen_len", 40), ("eos_tokens_id", 1),
        ("pad_token_id", 0), ("use_cache", False), ("first_target", True), ("stop_if_unknown", False), ("debug", False)],
    ("ngram_assisted.ngram_assisted", "ngram_assisted_speculative_generate"): "ngram_assisted.ngram_assisted_speculative_generate",
    ("ngram_assisted", "INgramStorage"): _STORAGE_METHODS,
    ("ngram_assisted", "NGramStorage"): _STORAGE_METHODS,
    ("ngram_assisted", "OneLevelNGramStorage"): _STORAGE_METHODS,
    ("ngram_assisted.ngram_storage", "INgramStorage"): _STORAGE_METHODS,
    ("ngram_assisted.ngram_storage", "NGramStorage"): _STORAGE_METHODS,
    ("ngram_assisted.ngram_storage", "OneLevelNGramStorage"): _STORAGE_METHODS,
    ("utils.caching", "prune_cache"): _PRUNE,
    ("utils.caching", "prune_tuple_cache"): _PRUNE,
    ("utils.caching", "prune_dynamic_cache"): _PRUNE,
    ("utils.logits_processor", "LogitsProcessor"): {"__init__": [("self", REQUIRED), ("temperature", REQUIRED)], **_PROCESSOR_METHODS},
    ("utils.logits_processor", "GreedyProcessor"): {"__init__": [("self", REQUIRED), ("temperature", 1)], **_PROCESSOR_METHODS},
    ("utils.logits_processor", "MultinomialProcessor"): {"__init__": [("self", REQUIRED), ("temperature", REQUIRED)], **_PROCESSOR_METHODS},
    ("utils.logits_processor", "TopKProcessor"): {
        "__init__": [("self", REQUIRED), ("temperature", REQUIRED), ("top_k", REQUIRED)], **_PROCESSOR_METHODS},
    ("utils.logits_processor", "NucleusProcessor"): {
        "__init__": [("self", REQUIRED), ("temperature", REQUIRED), ("top_p", REQUIRED)], **_PROCESSOR_METHODS},
    ("utils.logits_processor", "TopKNucleusProcessor"): {
        "__init__": [("self", REQUIRED), ("temperature", REQUIRED), ("top_k", REQUIRED), ("top_p", REQUIRED)], **_PROCESSOR_METHODS},
    ("utils.printing", "token_ids_to_string"): [("token_ids", REQUIRED), ("tokenizer", REQUIRED)],
    ("utils.printing", "end_token_found"): [("location", REQUIRED)],
    ("utils.printing", "initial_step"): [("token", REQUIRED), ("tokenizer", REQUIRED)],
    ("utils.printing", "speculative_step"): [
        ("tokenizer", REQUIRED), ("current_inputs", REQUIRED), ("inputs", REQUIRED), ("n", REQUIRED), ("prompt_end", REQUIRED),
        ("current_position", REQUIRED), ("corrected_gamma", REQUIRED)],
    ("utils.printing", "beam_search_step"): [("possibilities", REQUIRED), ("current_position", REQUIRED), ("tokenizer", REQUIRED)],
    ("infer", "InferenceCLI"): {"__init__": [("self", REQUIRED), ("device", "cuda")]},
}
# the reference's README imports from a module its code does not have; it is an alias here
README_ONLY = {("utils.logits_processors", name) for name in ("NucleusProcessor", "GreedyProcessor", "TopKProcessor")}
# parameters the reference requires and this project lets be left out (the tokenizer is only for display)
RELAXED = {("utils.printing", "token_ids_to_string", "tokenizer"), ("utils.printing", "initial_step", "tokenizer"),
           ("utils.printing", "beam_search_step", "tokenizer")}


def _same_default(ours, theirs) -> bool:
    if isinstance(theirs, GreedyProcessor):
        return type(ours) is GreedyProcessor and ours.temperature == theirs.temperature
    return type(ours) is type(theirs) and ours == theirs


def _check_parameters(where: str, function, expected) -> None:
    params = list(inspect.signature(function).parameters.values())
    names = [p.name for p in params]
    assert names[: len(expected)] == [name for name, _ in expected], f"{where}: parameters {names}"
    for param, (name, default) in zip(params, expected):
        if default is REQUIRED:
            assert param.default is REQUIRED or (*where.rsplit(".", 1), name) in RELAXED, f"{where}: {name} should be required"
        else:
            assert _same_default(param.default, default), f"{where}: {name}={param.default!r}, the reference has {default!r}"
    for param in params[len(expected):]:  # ours come after the reference's, and may be left out
        assert param.default is not REQUIRED or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD), f"{where}: {param.name}"


@pytest.mark.parametrize("module, name", sorted(REFERENCE))
def test_every_public_name_of_the_reference_imports_from_its_path_with_its_signature(module, name):
    expected = REFERENCE[(module, name)]
    obj = getattr(importlib.import_module(module), name)
    if isinstance(expected, str):  # the same object as exported elsewhere
        other_module, other_name = expected.rsplit(".", 1)
        assert obj is getattr(importlib.import_module(other_module), other_name)
        return
    if isinstance(expected, dict):
        assert inspect.isclass(obj)
        for method, params in expected.items():
            _check_parameters(f"{module}.{name}.{method}", getattr(obj, method), params)
    else:
        _check_parameters(f"{module}.{name}", obj, expected)


def test_the_readme_module_name_of_the_reference_is_an_alias():
    import utils.logits_processor as real

    for module, name in README_ONLY:
        assert getattr(importlib.import_module(module), name) is getattr(real, name)


def test_the_storage_interface_is_the_references_five_abstract_methods():
    assert INgramStorage.__abstractmethods__ == {"next_token", "has_gram", "update", "initialize", "reset"}


def test_max_fn_is_the_normalised_positive_part():
    from sampling.codec_speculative_decoding import max_fn as codec_max_fn
    from sampling.speculative_decoding import max_fn

    x = torch.tensor([[0.2, -0.1, 0.6, 0.0], [-1.0, 3.0, 1.0, -2.0]])
    expected = torch.tensor([[0.25, 0.0, 0.75, 0.0], [0.0, 0.75, 0.25, 0.0]])
    assert torch.allclose(max_fn(x), expected) and torch.allclose(codec_max_fn(x), expected)


def test_prune_helpers_work_on_the_caches_they_were_written_for():
    from transformers import DynamicCache

    from runners.cache_kind import cache_keyword, returned_cache
    from utils.caching import prune_cache, prune_dynamic_cache, prune_tuple_cache

    model = llama()
    out = model(torch.tensor([PROMPT]), use_cache=True)
    cache = returned_cache(out)
    assert isinstance(cache, DynamicCache)
    assert prune_dynamic_cache(cache, 3) is cache and cache.get_seq_length() == len(PROMPT) - 3
    assert prune_cache(cache, 2) is cache and cache.get_seq_length() == len(PROMPT) - 5
    assert prune_dynamic_cache(None, 1) is None and prune_cache(None, 1) is None
    # a pruned cache continues as if the pruned tokens had never been fed
    kept = PROMPT[: len(PROMPT) - 5]
    logits = model(torch.tensor([PROMPT[len(kept):len(kept) + 1]]), **{cache_keyword(model): cache}, use_cache=True).logits[0, -1]
    fresh = model(torch.tensor([kept + PROMPT[len(kept):len(kept) + 1]])).logits[0, -1]
    assert torch.allclose(logits, fresh, atol=1e-9)

    # legacy tuple caches: decoder-only (2 tensors a layer) and encoder-decoder (4: self, then cross attention)
    k = torch.randn(1, 2, 7, 4)
    legacy = ((k, k + 1), (k + 2, k + 3))
    pruned = prune_tuple_cache(legacy, 3)
    assert isinstance(pruned, tuple) and all(t.shape[2] == 4 for layer in pruned for t in layer)
    assert torch.equal(pruned[1][1], (k + 3)[:, :, :4])
    assert prune_cache(legacy, 3)[0][0].shape[2] == 4
    cross = torch.randn(1, 2, 11, 4)
    seq2seq = prune_tuple_cache(((k, k, cross, cross),), 2)
    assert seq2seq[0][0].shape[2] == 5 and seq2seq[0][2].shape[2] == 11  # the encoder's positions stay
    # the reference's t[:, :, :-0] emptied the cache when nothing was to be discarded
    assert prune_tuple_cache(legacy, 0)[0][0].shape[2] == 7
    with pytest.raises(ValueError):
        prune_cache(object(), 1)


def test_printing_helpers_take_the_references_arguments(capsys):
    import utils.printing as printing

    current = torch.tensor([[5, 6, 7, 8, 9, 10, 0]])
    final = torch.tensor([[5, 6, 7, 8, 42, 0, 0]])
    printing.speculative_step(None, current, final, 2, 1, 2, 4)  # prompt [5], text 6, drafts 7 8 accepted, 9 10 rejected, 42
    printing.initial_step(torch.tensor([[6]]), None)
    printing.beam_search_step([(-1.5, torch.tensor([5, 6, 7]), torch.zeros(3), -1)], 3, None)
    printing.end_token_found(4)
    shown = capsys.readouterr().out
    assert "2 drafts + 1 token" in shown and "6 7 8 9 10 42" in shown
    assert "-1.500" in shown and "5 6 7" in shown and "position 4" in shown
    assert printing.token_ids_to_string(torch.tensor([[3, 4]]), None) == "3 4"


# ---- (b) the reference README's usage examples ---------------------------------------------
README_LOAD = '''
from transformers import AutoTokenizer, AutoModelForCausalLM

# We will use the Google Llama-3.2 3B Instruct as the model we want to accelerate (3B parameters)
target_model_name = "{target}"
target = AutoModelForCausalLM.from_pretrained(target_model_name)

# We will use the Google Llama-3.2 1B Instruct as the drafter model (1B parameters)
drafter_model_name = "{drafter}"
drafter = AutoModelForCausalLM.from_pretrained(drafter_model_name)

# Don't forget to load the tokenizer
tokenizer = AutoTokenizer.from_pretrained(target_model_name)
'''
README_INPUT = '''
prefix = "Translate to English: Je m'appelle Romain. N'hésitez pas à contribuer à mon projet !"

chat_templated = f"<bos><start_of_turn>user\\n{prefix}<end_of_turn>\\n<start_of_turn>model\\n" # Gemma chat template
input_ids = tokenizer(chat_templated, return_tensors="pt").input_ids
input_ids = input_ids[0].tolist() # Generation methods require a list of ids
'''
README_GENERATE = '''
from sampling import speculative_generate, autoregressive_generate
# from sampling import speculative_generate_encoder_decoder, autoregressive_generate_encoder_decoder
from utils.logits_processors import NucleusProcessor

# Parameters
gen_len = 100       # Maximum number of tokens generated (could over pass when using speculative decoding)
gamma = 4           # Number of drafts generated by the drafter model at each step
logits_processor = NucleusProcessor(temperature=.6, top_p=.9) # Nucleus sampling with p=0.9 and T=0.6

# Generate text using the classic auto-regressive decoding (slow)
output_ids_ar = autoregressive_generate( # or autoregressive_generate_encoder_decoder for encoder-decoder models
                input_ids,
                target,
                logits_processor=logits_processor,
                max_gen_len=gen_len,
                end_tokens_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
output_ar = tokenizer.decode(output_ids_ar, skip_special_tokens=True)

# Generate text using the speculative decoding (faster)
output_ids_sd, alpha = speculative_generate( # or speculative_generate_encoder_decoder for encoder-decoder models
                input_ids,
                drafter,
                target,
                logits_processor=logits_processor,
                gamma=gamma,
                max_gen_len=gen_len,
                end_tokens_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
output_sd = tokenizer.decode(output_ids_sd, skip_special_tokens=True)

print("Auto-regressive decoding:", output_ar)
print("Speculative decoding:", output_sd)
print("Acceptance rate:", alpha) # Number of drafts accepted by the target model divided by the number of drafts generated
'''
README_BEAM = '''
from sampling import beam_search_generate # Beam Search Decoding is not compatible with encoder-decoder models yet.

output_ids_bs = beam_search_generate(
                input_ids,
                target,
                max_gen_len=gen_len,
                end_tokens_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                top_k=3,
                num_beams=5,
                min_length=5,
                alpha=1.2,
            )
'''


def _is_token_list(value, most: int) -> bool:
    return isinstance(value, list) and 0 < len(value) <= most and all(type(t) is int for t in value)


def test_the_reference_readme_examples_run_unchanged(tiny_models, capsys):
    """The README's blocks as written (its spelling end_tokens_id= and its module utils.logits_processors
    included, which the reference's own code refuses), the Hub names replaced by tiny models and
    100 new tokens by 16 (the reference's default use_cache=False feeds the whole text each step)."""
    namespace = {}
    code = README_LOAD.format(target=tiny_models["target"], drafter=tiny_models["drafter"]) + README_INPUT + README_GENERATE
    code = code.replace("gen_len = 100 ", "gen_len = 16 ")
    torch.manual_seed(0)
    exec(compile(code + README_BEAM, "reference-README", "exec"), namespace)
    assert _is_token_list(namespace["output_ids_ar"], 16) and _is_token_list(namespace["output_ids_sd"], 16)
    assert type(namespace["alpha"]) is float and 0.0 <= namespace["alpha"] <= 1.0
    assert _is_token_list(namespace["output_ids_bs"], 16)
    assert "Acceptance rate:" in capsys.readouterr().out
    # the same README code with the greedy processor: speculative decoding is exactly the target's greedy output
    greedy = code.replace("NucleusProcessor(temperature=.6, top_p=.9)", "__import__('utils.logits_processor').logits_processor.GreedyProcessor()")
    exec(compile(greedy, "reference-README-greedy", "exec"), namespace)
    assert namespace["output_ids_sd"] == namespace["output_ids_ar"]


def test_the_readme_encoder_decoder_variant_runs(tiny_models):
    """The README's commented alternative: the same calls with the encoder-decoder functions."""
    code = (README_LOAD.replace("AutoModelForCausalLM", "AutoModelForSeq2SeqLM").format(target=tiny_models["t5"], drafter=tiny_models["t5_drafter"])
            + README_INPUT + README_GENERATE.replace("# from sampling import speculative_generate_encoder_decoder",
                                                     "from sampling import speculative_generate_encoder_decoder")
            .replace("= autoregressive_generate(", "= autoregressive_generate_encoder_decoder(")
            .replace("= speculative_generate(", "= speculative_generate_encoder_decoder(")
            .replace("gen_len = 100 ", "gen_len = 12 ")
            .replace("NucleusProcessor(temperature=.6, top_p=.9)", "__import__('utils.logits_processor').logits_processor.GreedyProcessor()"))
    namespace = {}
    exec(compile(code, "reference-README-encoder-decoder", "exec"), namespace)
    assert _is_token_list(namespace["output_ids_ar"], 12) and type(namespace["alpha"]) is float
    assert namespace["output_ids_sd"] == namespace["output_ids_ar"]


def test_the_reference_repls_calls_run_as_written(tiny_models):
    """The calls of the reference's infer.py, keyword for keyword, on a tiny model pair."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sampling import speculative_generate
    from utils.logits_processor import TopKProcessor

    target = AutoModelForCausalLM.from_pretrained(tiny_models["target"])
    drafter = AutoModelForCausalLM.from_pretrained(tiny_models["drafter"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["target"])
    prefix = tokenizer.apply_chat_template([{"role": "user", "content": "Repeat: a b c a b c"}], add_generation_prompt=True, tokenize=False)
    tokenized = tokenizer(prefix, return_tensors="pt").input_ids[0].tolist()
    end_tokens = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    ngram = NGramStorage(n=3, vocab_size=target.config.vocab_size)
    for processor in (TopKProcessor(temperature=0.7, top_k=20),):
        torch.manual_seed(42)
        output_ids, accept_rate = speculative_generate(
            tokenized, drafter, target, tokenizer=tokenizer, logits_processor=processor, gamma=4, max_gen_len=12,
            eos_tokens_id=end_tokens, debug=False, use_cache=False)
        assert _is_token_list(output_ids, 12) and type(accept_rate) is float
        ngram.reset()
        output_ids, accept_rate = ngram_assisted_speculative_generate(
            tokenized, ngram, target, tokenizer=tokenizer, gamma=4, filler_top_k=3, logits_processor=processor, max_gen_len=12,
            eos_tokens_id=end_tokens, debug=False, use_cache=False, first_target=True, stop_if_unknown=True)
        assert _is_token_list(output_ids, 12) and type(accept_rate) is float
        output_ids = autoregressive_generate(tokenized, target, use_cache=False, max_gen_len=12, eos_tokens_id=end_tokens,
                                             logits_processor=processor, debug=False)
        assert _is_token_list(output_ids, 12)


# ---- (c) a storage written against the reference's interface -------------------------------
class BigramTable(INgramStorage):
    """A user's own storage, written for the reference: exactly its five methods, on tensors.
    Predicts the token that most recently followed the last token."""

    def __init__(self, n: int, vocab_size: int):
        super().__init__(n, vocab_size)
        self.last = {}
        self.calls = {"next_token": 0, "update": 0, "initialize": 0}

    def next_token(self, input_ids):
        self.calls["next_token"] += 1
        out = torch.zeros(input_ids.shape[0], dtype=torch.long)
        known = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        for i, seq in enumerate(input_ids):
            previous = seq[-1].item()
            if previous in self.last:
                out[i], known[i] = self.last[previous], True
        return out, known

    def has_gram(self, ngram):
        return self.last.get(ngram[-2].item()) == ngram[-1].item()

    def update(self, input_ids, next_tokens):
        self.calls["update"] += 1
        for seq, tokens in zip(input_ids, next_tokens):
            self.last[seq[-1].item()] = tokens[0].item()

    def initialize(self, input_ids):
        self.calls["initialize"] += 1
        for seq in input_ids:
            for a, b in zip(seq[:-1].tolist(), seq[1:].tolist()):
                self.last[a] = b

    def reset(self):
        self.last = {}


class ReferenceInterfaceNGram(INgramStorage):
    """This project's NGramStorage reached only through the reference's five tensor methods."""

    def __init__(self, n: int, vocab_size: int):
        super().__init__(n, vocab_size)
        self.inner = NGramStorage(n, vocab_size)

    def next_token(self, input_ids):
        return self.inner.next_token(input_ids)

    def has_gram(self, ngram):
        return self.inner.has_gram(ngram)

    def update(self, input_ids, next_tokens):
        self.inner.update(input_ids, next_tokens)

    def initialize(self, input_ids):
        self.inner.initialize(input_ids)

    def reset(self):
        self.inner.reset()


@pytest.mark.parametrize("use_cache, stop_if_unknown", [(False, False), (True, True), (True, False)])
def test_a_reference_interface_storage_drafts_for_nasd_greedy_exact(use_cache, stop_if_unknown):
    target = llama()
    expected = autoregressive_generate(PROMPT, target, max_gen_len=14, eos_tokens_id=[], use_cache=use_cache)
    storage = BigramTable(2, target.config.vocab_size)
    out, acceptance = ngram_assisted_speculative_generate(PROMPT, storage, target, gamma=4, max_gen_len=14, eos_tokens_id=[],
                                                          use_cache=use_cache, stop_if_unknown=stop_if_unknown)
    assert out == expected
    assert type(acceptance) is float and 0.0 < acceptance <= 1.0
    assert storage.calls["initialize"] == 1 and storage.calls["next_token"] > 0 and storage.calls["update"] > 0


def test_a_reference_interface_storage_learns_and_drafts_as_the_native_one():
    """The same counts behind the reference's tensor methods give the same tokens and the same acceptance."""
    target = llama()
    runs = []
    for storage in (NGramStorage(3, target.config.vocab_size), ReferenceInterfaceNGram(3, target.config.vocab_size)):
        torch.manual_seed(0)
        runs.append(ngram_assisted_speculative_generate(PROMPT, storage, target, gamma=3, filler_top_k=2, max_gen_len=24,
                                                        eos_tokens_id=[], use_cache=True, stop_if_unknown=True))
    assert runs[0] == runs[1] and runs[0][1] > 0


def test_a_reference_interface_storage_drafts_for_chained_drafting():
    target = llama()
    from conftest import perturbed_copy

    drafter = perturbed_copy(target, 0.2, seed=1)
    expected = autoregressive_generate(PROMPT, target, max_gen_len=16, eos_tokens_id=[], use_cache=True)
    out, acceptance = generate(PROMPT, target, ChainedSpec(), dict(gamma=3, max_gen_len=16, eos_tokens_id=[], use_cache=True),
                               DraftContext(storage=BigramTable(2, target.config.vocab_size), drafter=drafter))
    assert out == expected and type(acceptance) is float


def test_own_storages_keep_the_int_path_and_overridden_tensor_methods_are_honoured():
    from ngram_assisted import NGramDrafter, TensorStorageDrafter, ngram_drafter

    for storage in (NGramStorage(3, 96), OneLevelNGramStorage(3, 96)):
        drafter = ngram_drafter(storage, PROMPT)
        assert type(drafter) is NGramDrafter and storage.predict(PROMPT[:2]) == PROMPT[2]

    class Vetoed(NGramStorage):  # a user's subclass changing what next_token says
        def next_token(self, input_ids):
            token, known = super().next_token(input_ids)
            return torch.full_like(token, 7), torch.zeros_like(known)

    assert type(ngram_drafter(Vetoed(3, 96), PROMPT)) is TensorStorageDrafter
    target = llama()
    out, acceptance = ngram_assisted_speculative_generate(PROMPT, Vetoed(3, 96), target, gamma=3, max_gen_len=8, eos_tokens_id=[],
                                                          use_cache=True, stop_if_unknown=True)
    assert acceptance == 0.0 and out == autoregressive_generate(PROMPT, target, max_gen_len=8, eos_tokens_id=[], use_cache=True)


# ---- (d) beam search against the reference's algorithm --------------------------------------
@torch.no_grad()
def reference_beam_search(inputs, model, max_gen_len=40, num_beams=4, top_k=3, min_length=5.0, alpha=1.2, eos_tokens_id=1,
                          pad_token_id=0, prompt_logprob=1.0, penalty_lag=1, first_token_ends=False):
    """The reference's beam_search_generate (sampling/base_decoding.py at db7db67), re-written from
    its source as an oracle, without a cache, float32 scores, with its three errors as switches:

    * ``prompt_logprob=1.0``: the prompt's positions get a log-probability of 1.0
      (``probs[:, :prompt_len] = 1.0``), so every score is ``(1 + log P) / penalty``; right: 0 (log 1).
    * ``penalty_lag=1``: from the second token on the penalty is taken for one token less than
      the beam holds (``_length_penalty_fn(curr - prompt_len, ...)`` for ``curr - prompt_len + 1``
      tokens); right: 0.
    * ``first_token_ends=False``: the first tokens (chosen at the prefill) are never checked for
      an end token, so a beam generates past an end token that comes first; right: True.
    """
    def penalty(length):
        return ((min_length + length) / (min_length + 1)) ** alpha

    prompt_len = len(inputs)
    total_len = min(model.config.max_position_embeddings if hasattr(model.config, "max_position_embeddings") else 1024,
                    prompt_len + max_gen_len)
    stops = set(eos_tokens_id if isinstance(eos_tokens_id, list) else [eos_tokens_id])
    ids = torch.full((num_beams, total_len), pad_token_id, dtype=torch.long)
    ids[:, :prompt_len] = torch.tensor(inputs)
    sums = torch.full((num_beams, total_len), torch.finfo(torch.float).min, dtype=torch.float)
    scores = torch.full((num_beams,), torch.finfo(torch.float).min, dtype=torch.float)
    last = [-1] * num_beams
    sums[:, :prompt_len] = prompt_logprob
    first = torch.log_softmax(model(ids[:1, :prompt_len]).logits[0, -1], dim=-1)
    values, tokens = torch.topk(first, num_beams)
    ids[:, prompt_len] = tokens
    sums[:, prompt_len] = sums[:, prompt_len - 1] + values
    scores[:] = sums[:, prompt_len] / penalty(1)
    if first_token_ends:
        last = [prompt_len if int(t) in stops or int(t) == pad_token_id else -1 for t in tokens]
    for curr in range(prompt_len + 1, total_len):
        if all(index != -1 for index in last):
            break
        logprobs = torch.log_softmax(model(ids[:, :curr]).logits[:, -1], dim=-1)
        values, tokens = torch.topk(logprobs, top_k, dim=-1)
        possibilities = []
        for beam in range(num_beams):
            if last[beam] != -1:
                possibilities.append((scores[beam].clone(), ids[beam].clone(), sums[beam].clone(), last[beam]))
                continue
            for j in range(top_k):
                new = sums[beam, curr - 1] + values[beam, j]
                lp = penalty(curr - prompt_len + 1 - penalty_lag)
                summed = sums[beam].clone()
                summed[curr] = new
                seq = ids[beam].clone()
                seq[curr] = tokens[beam, j]
                index = curr if int(seq[curr]) in stops or int(seq[curr]) == pad_token_id else -1
                if not any(torch.equal(p[1], seq) for p in possibilities):
                    possibilities.append((new / (lp if lp != 0 else 1), seq, summed, index))
        possibilities.sort(key=lambda p: p[0], reverse=True)
        for beam, (score, seq, summed, index) in enumerate(possibilities[:num_beams]):
            scores[beam], ids[beam], sums[beam], last[beam] = score, seq, summed, index
    end = last[0] if last[0] != -1 else total_len - 1
    return ids[0, prompt_len:end + 1].tolist()


FIXED = dict(prompt_logprob=0.0, penalty_lag=0, first_token_ends=True)
BEAM_SETTINGS = [(4, 3), (5, 3), (3, 5), (2, 2)]
BEAM_MODELS = {"llama": llama, "gpt2": gpt2}


@pytest.fixture(scope="module")
def beam_models():
    return {name: build() for name, build in BEAM_MODELS.items()}


def _end_token_choices(model, prompt, num_beams, top_k):
    """No end token; the second most probable first token; a token the reference's beam emits mid-way."""
    first = torch.topk(torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1], -1), 2).indices.tolist()
    plain = reference_beam_search(prompt, model, 6, num_beams, top_k, eos_tokens_id=[])
    return {"none": [], "first": [first[1]], "mid": [plain[min(3, len(plain) - 1)]]}


@pytest.mark.parametrize("family", sorted(BEAM_MODELS))
@pytest.mark.parametrize("num_beams, top_k", BEAM_SETTINGS)
def test_beam_search_is_the_references_algorithm_and_differs_only_where_its_first_token_bug_decides(beam_models, family, num_beams, top_k):
    model = beam_models[family]
    for name, eos in _end_token_choices(model, PROMPT, num_beams, top_k).items():
        ours = beam_search_generate(PROMPT, model, 6, num_beams, top_k, eos_tokens_id=eos)
        # the reference's algorithm with its three errors corrected is ours, always
        assert ours == reference_beam_search(PROMPT, model, 6, num_beams, top_k, eos_tokens_id=eos, **FIXED), name
        reference = reference_beam_search(PROMPT, model, 6, num_beams, top_k, eos_tokens_id=eos)
        if reference == ours:
            continue
        # where they differ, an end token (or the pad token) is among the first tokens the reference
        # starts its beams from and never checks, and correcting that error alone gives ours
        first = torch.topk(model(torch.tensor([PROMPT])).logits[0, -1], num_beams).indices.tolist()
        assert set(first) & (set(eos) | {0}), (name, reference, ours)
        assert ours == reference_beam_search(PROMPT, model, 6, num_beams, top_k, eos_tokens_id=eos, first_token_ends=True), name


def test_beam_search_starts_num_beams_beams_as_the_reference_does():
    """With top_k < num_beams the reference still starts num_beams beams (the most probable first
    tokens); here the best sequence starts with a first token ranked below top_k, which a search
    starting top_k beams never reaches."""
    model, prompt = llama(vocab=16, init=0.3, seed=11), [1, 7, 3]
    ours = beam_search_generate(prompt, model, 5, 4, 2, eos_tokens_id=[])
    assert ours == reference_beam_search(prompt, model, 5, 4, 2, eos_tokens_id=[])
    ranked = torch.argsort(model(torch.tensor([prompt])).logits[0, -1], descending=True).tolist()
    assert 2 <= ranked.index(ours[0]) < 4


def test_reference_error_generating_past_an_end_token_that_comes_first():
    """The reference never checks the tokens its beams start from: with one of them as the end token,
    its best beam can be that end token followed by more tokens; ours stops at an end token."""
    model = gpt2()
    firsts = torch.topk(model(torch.tensor([PROMPT])).logits[0, -1], 2).indices.tolist()
    past = []
    for eos in firsts:
        reference = reference_beam_search(PROMPT, model, 6, 2, 2, eos_tokens_id=[eos])
        ours = beam_search_generate(PROMPT, model, 6, 2, 2, eos_tokens_id=[eos])
        assert eos not in ours[:-1]
        if reference[0] == eos and len(reference) > 1:
            past.append(reference)
    assert past  # the reference returned text after its end token


def _penalised_score(model, prompt, seq, alpha=1.2, min_length=5.0):
    logprob = sum(torch.log_softmax(model(torch.tensor([prompt + seq[:i]])).logits[0, -1], -1)[seq[i]].item() for i in range(len(seq)))
    return logprob / ((min_length + len(seq)) / (min_length + 1)) ** alpha


@pytest.mark.parametrize("error, value", [("prompt_logprob", 1.0), ("penalty_lag", 1)])
def test_reference_scoring_errors_choose_a_worse_sequence(error, value):
    """Each of the reference's scoring errors alone (prompt log-probability 1.0 instead of 0; the length
    penalty of one token less) makes it keep a sequence whose length-penalised log-probability, the
    objective it documents, is lower than that of the sequence ours returns."""
    model, prompt = llama(vocab=12, init=0.3, seed=1), [1, 7, 3]
    options = dict(eos_tokens_id=[5], pad_token_id=0)
    ours = beam_search_generate(prompt, model, 6, 3, 2, **options)
    assert ours == reference_beam_search(prompt, model, 6, 3, 2, **options, **FIXED)
    with_error = reference_beam_search(prompt, model, 6, 3, 2, **options, **{**FIXED, error: value})
    assert with_error != ours
    assert _penalised_score(model, prompt, ours) > _penalised_score(model, prompt, with_error)


def test_without_end_tokens_beam_search_returns_the_references_sequence_on_every_configuration(beam_models):
    """Where no end token is in play (the pad token aside), the reference's errors change nothing: its
    sequence is ours on every configuration of the grid, e.g. it starts num_beams beams, not top_k."""
    for family, (num_beams, top_k) in itertools.product(sorted(BEAM_MODELS), BEAM_SETTINGS):
        model = beam_models[family]
        ours = beam_search_generate(PROMPT, model, 6, num_beams, top_k, eos_tokens_id=[])
        assert ours == reference_beam_search(PROMPT, model, 6, num_beams, top_k, eos_tokens_id=[]), (family, num_beams, top_k)


# ---- (e) the reference's REPL ----------------------------------------------------------------
REFERENCE_COMMANDS = {  # command: (arguments as the reference takes them, the setting it changes)
    "/quit": [], "/debug": [], "/clear": [], "/speculative": [], "/target": [], "/drafter": [], "/cache": [], "/chat": [],
    "/length": ["20"], "/gamma": ["3"], "/processor": ["nucleus", "0.6", "0.9"], "/ngram": [], "/top_k_filler": ["1"],
    "/set_ngramstorage": ["onelevel", "4"], "/reset_in_between": [],
}


@pytest.fixture(scope="module")
def repl(tiny_models):
    from infer import Repl
    from strategies import RunConfig, RunContext
    from utils.models import end_tokens, load_model

    target, tokenizer, _ = load_model(tiny_models["target"], "cpu", "auto", "none", False)
    drafter = load_model(tiny_models["drafter"], "cpu", "auto", "none", False)[0]
    config = RunConfig(eos_tokens_id=end_tokens(target, tokenizer))
    return Repl(config, RunContext(target=target, tokenizer=tokenizer, drafter=drafter), True, 42)


def test_the_repl_starts_with_the_references_defaults(repl):
    s = repl.config
    assert (s.gamma, s.max_gen_len, s.debug, s.param("top_k_filler")) == (4, 35, False, 3)
    assert repl.enabled["speculative"] and repl.enabled["ngram"] and repl.enabled["target"] and not repl.enabled["drafter"]
    # on purpose different: an 8-gram storage (the reference's 3 cut the pair's copies short; docs/reference.md)
    assert (repl.storage_kind, repl.storage_n, type(repl.context.storage)) == ("basic", 8, NGramStorage)
    assert repl.reset_in_between and repl.chat and repl.seed == 42
    assert (repl.processor_name, repl.processor_args, type(s.logits_processor())) == ("greedy", {"temperature": 1.0}, GreedyProcessor)
    assert s.use_cache  # the one default on purpose different: the reference's cache was broken, this one is exact


def test_every_reference_command_takes_the_references_arguments(repl):
    s = repl.config
    before = {key: repl.enabled[key] for key in ("speculative", "target", "drafter", "ngram")}
    flags = (s.debug, s.use_cache, repl.chat, repl.reset_in_between)
    for name, words in REFERENCE_COMMANDS.items():
        assert name in repl.commands
        if name == "/quit":
            with pytest.raises(EOFError):
                repl.handle(name)
            continue
        repl.handle(" ".join([name] + words))
    s, storage, processor = repl.config, repl.context.storage, repl.config.logits_processor()  # a command replaces the config
    assert (s.max_gen_len, s.gamma, s.param("top_k_filler"), repl.storage_kind, repl.storage_n) == (20, 3, 1, "onelevel", 4)
    assert type(storage) is OneLevelNGramStorage and storage.n == 4
    assert (type(processor).__name__, processor.temperature, processor.top_p) == ("NucleusProcessor", 0.6, 0.9)
    assert {key: not value for key, value in before.items()} == {key: repl.enabled[key] for key in before}
    assert (s.debug, s.use_cache, repl.chat, repl.reset_in_between) == tuple(not f for f in flags)
    repl.handle("/processor greedy 1.0")  # the reference requires the temperature; it is accepted too
    assert type(repl.config.logits_processor()) is GreedyProcessor
    for name, words in REFERENCE_COMMANDS.items():  # back to the defaults
        if not words and name not in ("/quit", "/clear"):
            repl.handle(name)
    for line in ("/length 35", "/gamma 4", "/top_k_filler 3", "/set_ngramstorage basic 3"):
        repl.handle(line)


def test_the_repl_runs_nasd_as_the_reference_experiment_does(repl, monkeypatch):
    """The reference's REPL calls NASD with first_target=True and stop_if_unknown=True: a draft ends
    where the storage does not know the context, so the acceptance rate counts only real drafts."""
    import rows  # the strategies' run functions

    seen = {}
    real = rows.ngram_assisted_speculative_generate

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(rows, "ngram_assisted_speculative_generate", spy)
    for key in ("speculative", "target", "pld"):
        monkeypatch.setitem(repl.enabled, key, False)
    monkeypatch.setattr(repl, "config", repl.config.with_(max_gen_len=4))
    repl.compare("Hi")
    assert seen["first_target"] is True and seen["stop_if_unknown"] is True
    assert (seen["gamma"], seen["filler_top_k"]) == (repl.config.gamma, repl.config.param("top_k_filler"))


def test_inference_cli_is_the_references_entry_point(monkeypatch):
    import infer

    called = []
    monkeypatch.setattr(infer, "main", lambda argv=None: called.append(argv))
    cli = infer.InferenceCLI(device="cpu")
    assert cli.device == "cpu" and called == [["--preset", "reference", "--device", "cpu"]]
