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


class FakeContext:
    """llama.cpp's shared context as the runner sees it, with no library: its batch arrays, and a decode
    that records what each batch token was (token, position, sequences, output) and gives one row per output."""

    def __init__(self, capacity: int = 64):
        import numpy

        self.capacity, self.memory, self.owner, self.decoded = capacity, "memory", None, []
        self.tokens, self.positions = numpy.zeros(capacity, dtype=numpy.int32), numpy.zeros(capacity, dtype=numpy.int32)
        self.outputs, self.seq_counts = numpy.zeros(capacity, dtype=numpy.int8), numpy.ones(capacity, dtype=numpy.int32)
        self.batch = SimpleNamespace(seq_id=[[0] * 8 for _ in range(capacity)])

    def claim(self, runner) -> bool:
        fresh, self.owner = self.owner is not runner, runner
        return fresh

    def decode(self, count: int, rows: int):
        import torch

        self.decoded.append([(int(self.tokens[k]), int(self.positions[k]), tuple(self.batch.seq_id[k][: self.seq_counts[k]]),
                              int(self.outputs[k])) for k in range(count)])
        return torch.zeros(rows, 4)


def fake_llama_runner(monkeypatch, calls: list):
    import runners.llama_cpp as llama_cpp

    lib = SimpleNamespace(llama_memory_seq_rm=lambda memory, *a: calls.append(("rm", *a)) or True,
                          llama_memory_seq_cp=lambda memory, *a: calls.append(("cp", *a)),
                          llama_memory_seq_pos_max=lambda memory, seq: -1)
    monkeypatch.setattr(llama_cpp, "library", lambda: lib)
    runner = object.__new__(llama_cpp.LlamaCppRunner)
    runner.gguf = SimpleNamespace(tree_unsupported=lambda: None)
    runner.context, runner.cached, runner.forward_passes, runner.refeeds = FakeContext(), 0, 0, 0
    runner._leaves, runner._leaf_of, runner._tree_cur = 0, [], 0
    return runner


def test_llama_cpps_tree_pass_follows_the_one_tree_rule_with_its_own_batch(monkeypatch):
    """The runner's tree passes are ``runners.trees.TreePasses``' (one rule for every runner: the last accepted
    token fed again for the root's logits, the cache then ``cur + N``, the kept branch ``cur + len(path)``);
    llama.cpp supplies its batch only: the uncached prefix in every sequence, each node in its leaves'."""
    import torch

    from runners.llama_cpp import LlamaCppRunner
    from runners.trees import TreePasses

    assert issubclass(LlamaCppRunner, TreePasses) and not {"tree_pass", "keep_branch"} & set(vars(LlamaCppRunner))
    calls: list = []
    runner = fake_llama_runner(monkeypatch, calls)
    ids = torch.tensor([[5, 6, 7, 8]])
    runner(ids, 1)
    assert runner.cached == 4
    rows = runner.tree_pass(ids, 4, [10, 11, 12], [-1, 0, -1])  # a -> b, and c: leaves b (sequence 1), c (2)
    assert rows.shape == (4, 4) and runner.cached == 7 and runner.forward_passes == 2
    assert ("rm", 0, 3, -1) in calls  # the root's logits need token 8 fed again
    assert runner.context.decoded[-1] == [(8, 3, (0, 1, 2), 1), (10, 4, (1,), 1), (11, 5, (1,), 1), (12, 4, (2,), 1)]
    calls.clear()
    runner.keep_branch(4, [0, 1])
    assert calls == [("cp", 1, 0, 4, 6), ("rm", 1, -1, -1), ("rm", 2, -1, -1)] and runner.cached == 6
