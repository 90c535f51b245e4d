"""Which models the lean forward (``models.llama``) admits, and what the headers say it runs: the flags refuse
``--forward lean`` in one line for a model outside the family, with or without ``--compile``."""
from types import SimpleNamespace

import pytest

from conftest import t5


def test_forward_lean_with_compile_refuses_a_model_that_neither_compiles_nor_takes_the_lean_forward():
    """T5 cannot compile (encoder-decoder) and is outside the Llama family: ``--compile --forward lean``
    falls back to eager passes, so the lean forward's refusal must come at load, in one line."""
    from app.pair import LoadOptions, SetupError, _runners

    said = []
    with pytest.raises(SetupError, match=r"^--forward lean: the target cannot take it: .*no decoder-only") as caught:
        _runners(SimpleNamespace(target=t5(), drafter=None), LoadOptions(forward="lean", compile=True), lambda text, style="": said.append(text))
    assert "\n" not in str(caught.value)
