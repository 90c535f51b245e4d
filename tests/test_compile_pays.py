"""``--compile`` says at start-up whether it pays on this CPU, from passes it times then."""
import pytest

from app import pair
from conftest import llama
from runners import RunnerConfig


@pytest.mark.parametrize("compiled_ms,eager_ms,word", [(10.0, 20.0, "pays"), (10.0, 12.0, "does not pay on this CPU (below 1.3x)")])
def test_the_verdict_is_the_measured_ratio_against_the_threshold(monkeypatch, compiled_ms, eager_ms, word):
    import measure.timing as timing

    monkeypatch.setattr(timing, "compared", lambda passes, repeats: ([compiled_ms / 1e3, eager_ms / 1e3], ""))
    line = pair.compile_pays(llama(layers=1), RunnerConfig("static", True))
    assert line == (f"a compiled one-position pass {compiled_ms:.1f} ms, an eager one {eager_ms:.1f} ms "
                    f"({eager_ms / compiled_ms:.2f}x): compiling {word}")


def test_nothing_timed_says_nothing(monkeypatch):
    import measure.timing as timing

    monkeypatch.setattr(timing, "compared", lambda passes, repeats: (None, ""))
    assert pair.compile_pays(llama(layers=1), RunnerConfig("static", True)) == ""
