"""Which models the lean forward (``models.llama``) admits, and what the headers say it runs: the flags refuse
``--forward lean`` in one line for a model outside the family, with or without ``--compile``."""
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaForCausalLM

from conftest import llama, t5
from models.llama import ATTENTION
from runners import EAGER, KVCacheModel, LeanRunner, lean_unsupported, make_runner


def test_forward_lean_with_compile_refuses_a_model_that_neither_compiles_nor_takes_the_lean_forward():
    """T5 cannot compile (encoder-decoder) and is outside the Llama family: ``--compile --forward lean``
    falls back to eager passes, so the lean forward's refusal must come at load, in one line."""
    from app.pair import LoadOptions, SetupError, _runners

    said = []
    with pytest.raises(SetupError, match=r"^--forward lean: the target cannot take it: .*no decoder-only") as caught:
        _runners(SimpleNamespace(target=t5(), drafter=None), LoadOptions(forward="lean", compile=True), lambda text, style="": said.append(text))
    assert "\n" not in str(caught.value)


def _attention(kind: str):
    """The tiny Llama with transformers' attention ``kind`` (what ``from_pretrained(attn_implementation=...)`` sets)."""
    model = llama()
    model.config._attn_implementation_internal = kind
    return model


def test_the_header_names_the_lean_forwards_own_attention_and_the_models_where_they_differ():
    """Our rows' attention is the lean forward's own kernel, whatever the model was loaded with: the header
    says so, and says transformers' attention (its peers' rows) where that is another."""
    assert EAGER.describe(llama()).startswith(f"static KV cache · eager · lean Llama forward (attention: {ATTENTION})")
    eager = _attention("eager")
    assert lean_unsupported(eager) is None and type(make_runner(eager)) is LeanRunner
    assert f"lean Llama forward (attention: {ATTENTION}; transformers' paths: eager)" in EAGER.describe(eager)


@pytest.mark.parametrize("kind", ["flash_attention_2", "flex_attention", "my_registered_attention"])
def test_an_attention_kind_other_than_sdpa_or_eager_keeps_transformers_forward(kind):
    """The lean forward computes exact softmax attention as SDPA does; eager differs only in rounding, any
    other kind (flash, flex, a registered function) may compute something else: it keeps its own forward."""
    model = _attention(kind)
    reason = lean_unsupported(model)
    assert reason is not None and kind in reason and "\n" not in reason
    assert type(make_runner(model)) is KVCacheModel and "lean" not in EAGER.describe(model)


def test_a_class_that_borrows_a_family_name_is_not_the_family():
    """The family is transformers' own classes, not their names: a remote-code class called
    ``LlamaForCausalLM`` (here a subclass that could change any step) keeps its own forward."""
    borrowed = type("LlamaForCausalLM", (LlamaForCausalLM,), {"__module__": "transformers_modules.someone.modeling"})
    torch.manual_seed(0)
    model = borrowed(llama().config).to(torch.float64).eval()
    reason = lean_unsupported(model)
    assert reason is not None and "transformers_modules.someone.modeling.LlamaForCausalLM" in reason
    assert type(make_runner(model)) is KVCacheModel


def test_the_headers_name_each_models_family(monkeypatch):
    """The lean forward and the compiled step are named for the model's family (``Family.name``), not
    "Llama" for every one: on the eager line, the step's label and, on CUDA, the step's reason."""
    import runners.config as runner_config
    from app.header_lines import describe
    from families import gemma3, granite, olmo2, phi3, qwen3, smollm3
    from runners import RunnerConfig, step_label

    named = [(llama(), "Llama"), (qwen3(), "Qwen3"), (olmo2(), "OLMo 2"), (smollm3(), "SmolLM3"), (granite(), "Granite"),
             (phi3(), "Phi-3"), (gemma3(), "Gemma 3")]
    for model, name in named:
        assert f"· eager · lean {name} forward (attention: {ATTENTION})" in describe(model, "tiny", "none")
        assert step_label(model).startswith(f"compiled lean {name} step (inductor, ")
    monkeypatch.setattr(runner_config, "model_device", lambda m: torch.device("cuda"))
    for model, name in named:
        assert RunnerConfig().describe(model) == (f"static KV cache · compiled lean {name} step (the default on CUDA for the "
                                                  f"{name} family; --eager keeps the eager forward)")
