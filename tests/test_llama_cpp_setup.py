"""``--runner llama-cpp``'s set-up, where llama-cpp-python may be missing: what it refuses and says in
one line, and that a run's record keeps the GGUF file its target ran on (tests/test_llama_cpp.py runs
the runner itself, where llama-cpp-python is installed)."""
from types import SimpleNamespace

import pytest

from app.heads import load_for
from app.pair import llama_cpp_target
from app.session import SetupError
from configuration import RunConfig
from runners import RunnerConfig
from utils.models import embedded_gguf


def test_a_target_that_is_no_gguf_file_is_refused_in_one_line():
    """llama.cpp runs GGUF files: a Hub id or a folder as target stops the set-up with one line."""
    with pytest.raises(SetupError, match=r"^--runner llama-cpp runs a GGUF file: the embedded model or --target FILE\.gguf, not org/model$"):
        llama_cpp_target("org/model")


def test_without_llama_cpp_python_the_line_says_how_to_build_it(monkeypatch):
    """Where llama-cpp-python is not installed, the set-up stops with one line naming ``make llama-cpp``."""
    import runners.llama_model as llama_model

    real = llama_model.importlib.util.find_spec
    monkeypatch.setattr(llama_model.importlib.util, "find_spec", lambda name, *rest: None if name == "llama_cpp" else real(name, *rest))
    with pytest.raises(SetupError, match=r"^--runner llama-cpp: llama-cpp-python is not installed \(make llama-cpp builds it"):
        llama_cpp_target(None)


def test_with_llama_cpp_python_the_embedded_file_is_the_default_target():
    """No --target: llama.cpp runs the embedded GGUF file (where llama-cpp-python is installed)."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (make llama-cpp)")
    assert llama_cpp_target(None) == str(embedded_gguf())


def test_a_runs_record_keeps_the_gguf_file_and_llama_cpp_is_never_compiled():
    """runs.jsonl's run_config says which file the target ran on, and reads back the same; a GGUF
    runner is never a compiled one, and its cache is llama.cpp's preallocated one ("static")."""
    config = RunConfig(runner=RunnerConfig(gguf="/models/target.gguf", compile=True))
    again = RunConfig.from_dict(config.to_dict())
    assert again.runner == config.runner and again.to_dict()["runner"]["gguf"] == "/models/target.gguf"
    model = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=False))
    assert not config.runner.compiled_for(model) and config.runner.cache_for(model) == "static"


def test_no_head_is_loaded_for_a_target_on_llama_cpp(tmp_path):
    """A head needs hidden states, which llama.cpp does not give: none is loaded, and the head's line says why."""
    pair = SimpleNamespace(target=None, runner=lambda role: RunnerConfig(gguf="/models/target.gguf"))
    head, line = load_for(str(tmp_path), pair, embedded=True)
    assert head is None and line == "none (llama.cpp gives no hidden states: the eagle rows need --runner torch)"


def test_a_rollback_llama_cpp_refuses_empties_the_sequence_so_no_pass_runs_on_rejected_tokens(monkeypatch):
    """``llama_memory_seq_rm`` answers False where a model's memory cannot drop a partial range (recurrent,
    hybrid). The rollback then drops the whole sequence (which never fails) and says the cache holds
    nothing, so the next pass feeds the accepted prefix again instead of decoding after rejected drafts."""
    import runners.llama_cpp as llama_cpp

    calls = []

    def seq_rm(memory, seq, start, end):
        calls.append((seq, start, end))
        return start == -1  # a whole sequence can go; a partial range cannot
    monkeypatch.setattr(llama_cpp, "library", lambda: SimpleNamespace(llama_memory_seq_rm=seq_rm))
    runner = object.__new__(llama_cpp.LlamaCppRunner)
    runner.context = SimpleNamespace(memory="memory")
    runner.context.owner = runner
    runner.cached, runner._leaves, runner._tree_cur, runner.refeeds = 20, 0, 0, 0
    runner.rollback(15)
    assert calls == [(0, 15, -1), (0, -1, -1)] and runner.cached == 0 and runner.refeeds == 1
    calls.clear()
    monkeypatch.setattr(llama_cpp, "library", lambda: SimpleNamespace(llama_memory_seq_rm=lambda *a: calls.append(a[1:]) or True))
    runner.cached = 20
    runner.rollback(15)  # a memory that can: only the rejected positions go
    assert calls == [(0, 15, -1)] and runner.cached == 15 and runner.refeeds == 1
