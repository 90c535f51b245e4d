"""OpenVINO GenAI's peer rows (``peers_openvino.py``, docs/openvino.md): named in the strategy table, skipped in one
line that says how to install where the OpenVINO venv or the export is missing, compared with their own plain row;
the worker refuses a bad request in one line and goes on; and, where ``make openvino`` ran, ov_plain's greedy tokens
are our target AR's. The tests that run OpenVINO are skipped, with the reason, where it is not installed."""
import argparse
import importlib.util
import json
from pathlib import Path

import pytest

import bench
import peers_openvino
from app.bench.configs import default_strategies, make_configs
from strategies import EVERY, RunConfig, RunContext, run_strategy

WHY = peers_openvino.unavailable()
installed = pytest.mark.skipif(bool(WHY), reason=WHY or "installed")
ROWS = ("ov_plain", "ov_pld", "ov_pld10")


def worker_module():
    spec = importlib.util.spec_from_file_location("openvino_worker", peers_openvino.WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flags(strategies: str, **more) -> argparse.Namespace:
    values = dict(strategies=strategies, gamma=[4], ngram_n=[3], storages="basic", top_k_filler=[3], param=None, target=None,
                  preset=None)
    return argparse.Namespace(**{**values, **more})


def test_the_rows_are_named_in_the_table_and_skipped_in_one_line_without_the_venv(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SPECDEC_OPENVINO_VENV", str(tmp_path / "absent"))
    assert set(ROWS) <= set(EVERY) and not set(ROWS) & set(default_strategies().split(","))  # run when named only
    assert all(EVERY[key].peer and EVERY[key].engine == "OpenVINO GenAI" for key in ROWS)
    assert [c.key for c in make_configs(flags(",".join(("target",) + ROWS)), False)] == ["target"]
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"skipped {key}: the OpenVINO venv {tmp_path / 'absent'} is missing; install: make openvino "
                     "(docs/openvino.md)" for key in ROWS]


def test_the_skip_reason_names_what_is_missing(monkeypatch, tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    monkeypatch.setenv("SPECDEC_OPENVINO_VENV", str(venv))
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    assert "is incomplete; install: make openvino" in peers_openvino.unavailable()
    (venv / ".installed").write_text("")
    assert "OpenVINO export" in peers_openvino.unavailable() and "(no openvino_model.xml)" in peers_openvino.unavailable()
    folder = peers_openvino.ir_dir()
    folder.mkdir(parents=True)
    for name in peers_openvino.IR_FILES + (peers_openvino.STAMP,):
        (folder / name).write_text("x")
    assert "cannot import openvino_genai" in peers_openvino.unavailable()  # its python runs nothing
    (venv / "bin" / "python").write_text("#!/bin/sh\necho 2026.4.1\n")
    (venv / "bin" / "python").chmod(0o755)
    (folder / peers_openvino.STAMP).write_text('{"openvino_genai": "2026.4.1"}')
    peers_openvino.genai_version.cache_clear()
    assert peers_openvino.unavailable(flags("ov_plain")) == ""
    assert "embedded model only" in peers_openvino.unavailable(flags("ov_plain", preset="pair"))


@pytest.mark.parametrize("line, said", [
    ("not json", "not JSON"), ("[1, 2]", "a request is a JSON object"), ('{"op": "train"}', "unknown op 'train'"),
    ('{"op": "generate", "prompt": [], "max_new_tokens": 4}', "prompt must be a list of at least 1 token ids"),
    ('{"op": "generate", "prompt": [1, -2], "max_new_tokens": 4}', "prompt must be a list"),
    ('{"op": "generate", "prompt": [1], "max_new_tokens": 0}', "max_new_tokens must be a positive integer"),
    ('{"op": "generate", "prompt": [1], "max_new_tokens": 4, "num_assistant_tokens": 5}', "prompt lookup needs"),
])
def test_a_bad_request_gets_one_line(line, said):
    """Checked before OpenVINO is touched: these run without it."""
    worker = worker_module()
    answer = worker.answer(worker.Engine("unused", 1), line)
    assert list(answer) == ["error"] and said in answer["error"] and "\n" not in answer["error"]


def test_the_worker_asks_the_precision_it_is_given_and_refuses_another():
    """bf16 is OpenVINO's bfloat16 inference with a bfloat16 KV cache (it refuses float32 there); a bad one fails first."""
    worker = worker_module()
    assert worker.properties(2)["INFERENCE_PRECISION_HINT"] == "f32"
    bf16 = worker.properties(2, "bf16")
    assert bf16["INFERENCE_PRECISION_HINT"] == "bf16" and bf16["KV_CACHE_PRECISION"] == "bf16"
    with pytest.raises(ValueError, match="precision must be one of f32, bf16, got 'f16'"):
        worker.Engine("unused", 1, "f16")


def test_a_peer_row_is_compared_with_its_own_plain_row():
    """ov_pld against ov_plain (its own baseline) and against target AR; the tokens/step of a peer that says its steps."""
    runs = [("target", 8.0, 0, 100), ("ov_plain", 4.0, 0, 100), ("ov_pld", 2.0, 60, 40)]
    records = [{"category": "qa", "config": bench.Config(key).label, "key": key, "gamma": 4, "repeat": 0, "new_tokens": 100,
                "seconds": seconds, "drafted": 0, "accepted": accepted, "target_passes": steps, "diverged_at": None}
               for key, seconds, accepted, steps in runs]
    rows = {r["key"]: r for r in bench.summarize(records) if r["category"] == "all"}
    assert rows["ov_pld"]["versus"] == pytest.approx({"ov_plain": 2.0}) and rows["ov_pld"]["speedup"] == pytest.approx(4.0)
    assert rows["ov_pld"]["tokens_per_step"] == pytest.approx(2.5) and rows["ov_plain"]["tokens_per_step"] is None
    assert rows["ov_plain"]["versus"] == {} and "vs OpenVINO plain" in bench.markdown(list(rows.values()), "t")


@installed
def test_the_worker_answers_a_bad_request_in_one_line_and_goes_on():
    worker = peers_openvino.Worker(peers_openvino.ir_dir(), 1)
    try:
        with pytest.raises(RuntimeError, match=r"^OpenVINO worker: max_new_tokens must be a positive integer, got 'a'$"):
            worker.ask({"op": "generate", "prompt": [1, 2], "max_new_tokens": "a"})
        assert len(worker.ask({"op": "generate", "prompt": [1, 2], "max_new_tokens": 2})["tokens"]) == 2
    finally:
        worker.close()


@installed
def test_ov_plain_and_ov_pld_emit_target_ars_greedy_tokens():
    from app.session import encode
    from utils.models import end_tokens, load_embedded

    model, tokenizer = load_embedded()
    prompt = encode(tokenizer, [{"role": "user", "content": "Repeat exactly: the cat sat on the mat, the cat sat on the mat."}], True)
    config, context = RunConfig(max_gen_len=24, eos_tokens_id=tuple(end_tokens(model, tokenizer))), RunContext(model, tokenizer)
    ours = run_strategy(EVERY["target"], prompt, config, context)
    plain = run_strategy(EVERY["ov_plain"], prompt, config, context)
    lookup = run_strategy(EVERY["ov_pld"], prompt, config, context)
    assert len(ours.tokens) >= 8 and plain.tokens == ours.tokens and lookup.tokens == ours.tokens
    assert plain.kernels == "OpenVINO GenAI" and sum(lookup.stats.emitted_by_step) == len(lookup.tokens)
    stamp = json.loads((Path(peers_openvino.ir_dir()) / peers_openvino.STAMP).read_text())
    assert stamp["properties"]["KV_CACHE_PRECISION"] == "f32" and stamp["check"]["equal_to_target_ar"]


def test_the_export_reads_the_precision_in_force_from_openvinos_log():
    """The export's check: every LLM pipeline float32 with a float32 KV cache, the tokenizers' settings ignored."""
    spec = importlib.util.spec_from_file_location("openvino_export", peers_openvino.ROOT / "scripts" / "openvino_export.py")
    export = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(export)
    block = "Model: {}\n  NETWORK_NAME: x\n  INFERENCE_PRECISION_HINT: {}\n  KV_CACHE_PRECISION: {}\n"
    log = block.format("OV Tokenizer", "bf16", "u8") + block.format("LLM with Paged Attention", "f32", "f32") * 2
    assert export.precision_in_force(log) == {"pipelines": 2, "INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    with pytest.raises(RuntimeError, match="did not say it ran the model in float32"):
        export.precision_in_force(log + block.format("LLM with Paged Attention", "f32", "u8"))
    with pytest.raises(RuntimeError, match="no model properties in its log"):
        export.precision_in_force("")


def fake_install(tmp_path: Path, monkeypatch, genai: str, stamped: str, recorded: bool = True) -> Path:
    """A venv whose python says it has OpenVINO GenAI ``genai``, and an export stamped by ``stamped``, which
    records the venv when ``recorded``; $SPECDEC_OPENVINO_VENV unset."""
    venv = tmp_path / "opt-ov"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f"#!/bin/sh\necho {genai}\n")
    (venv / "bin" / "python").chmod(0o755)
    (venv / ".installed").write_text("")
    monkeypatch.delenv("SPECDEC_OPENVINO_VENV", raising=False)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    folder = peers_openvino.ir_dir()
    folder.mkdir(parents=True)
    for name in peers_openvino.IR_FILES:
        (folder / name).write_text("x")
    stamp = {"openvino_genai": stamped, **({"venv": str(venv)} if recorded else {})}
    (folder / peers_openvino.STAMP).write_text(json.dumps(stamp))
    return venv


def test_the_benchmark_finds_the_venv_the_export_recorded(tmp_path, monkeypatch):
    """``make openvino SPECDEC_OPENVINO_VENV=/opt/ov`` exports; the benchmark, without the variable, runs the rows
    on that venv (the export's stamp names it), not on a missing default."""
    venv = fake_install(tmp_path, monkeypatch, "2026.4.1", "2026.4.1")
    assert peers_openvino.venv() == venv and peers_openvino.unavailable() == ""


def test_an_export_made_by_another_genai_than_the_venvs_is_skipped_in_one_line(tmp_path, monkeypatch):
    fake_install(tmp_path, monkeypatch, "2026.4.1", "2026.3.0")
    why = peers_openvino.unavailable()
    assert "OpenVINO GenAI 2026.3.0" in why and "has 2026.4.1" in why and why.endswith("install: make openvino (docs/openvino.md)")


def test_make_openvino_names_the_venv_by_the_benchmarks_one_setting():
    import subprocess

    done = subprocess.run(["make", "-n", "openvino", "SPECDEC_OPENVINO_VENV=/opt/ov"], capture_output=True, text=True,
                          cwd=peers_openvino.ROOT)
    assert done.returncode == 0 and "scripts/openvino_export.py --python /opt/ov/bin/python" in done.stdout
    old = subprocess.run(["make", "-n", "openvino", "OV_VENV=/opt/ov"], capture_output=True, text=True, cwd=peers_openvino.ROOT)
    assert old.returncode != 0 and "SPECDEC_OPENVINO_VENV=/opt/ov" in old.stderr


def export_script():
    spec = importlib.util.spec_from_file_location("openvino_export", peers_openvino.ROOT / "scripts" / "openvino_export.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_failed_export_leaves_the_working_one_and_a_new_one_records_its_venv(tmp_path, monkeypatch):
    """The venv's GenAI is newer than the export's: a re-export that fails its check leaves the old export
    whole; one that passes replaces it, stamped with the new version and the venv (fake exporter and check)."""
    venv = fake_install(tmp_path, monkeypatch, "2026.4.1", "2026.3.0", recorded=False)
    export, folder = export_script(), peers_openvino.ir_dir()
    monkeypatch.setattr(export, "embedded_model_dir", lambda: tmp_path)
    monkeypatch.setattr(export, "export", lambda hf, out, python: [(out / n).write_text("new") for n in peers_openvino.IR_FILES])
    monkeypatch.setattr(export, "verify", lambda out, python: (_ for _ in ()).throw(RuntimeError("tokens differ")))
    monkeypatch.setattr("sys.argv", ["openvino_export.py", "--python", str(venv / "bin" / "python")])
    with pytest.raises(SystemExit, match="tokens differ"):
        export.main()
    assert (folder / "config.json").read_text() == "x" and json.loads((folder / peers_openvino.STAMP).read_text())["openvino_genai"] == "2026.3.0"
    monkeypatch.setattr(export, "verify", lambda out, python: {"openvino": "x", "openvino_genai": "2026.4.1",
                                                               "check": {"new_tokens": 12}})
    export.main()
    stamp = json.loads((folder / peers_openvino.STAMP).read_text())
    assert (folder / "config.json").read_text() == "new" and stamp["openvino_genai"] == "2026.4.1" and stamp["venv"] == str(venv)


def test_a_worker_asked_for_bf16_starts_openvino_with_bf16(monkeypatch):
    """The row's precision reaches the worker's command line (spied, not trusted from the keyword)."""
    started = []

    class Spy:
        stdout = iter(())

        def __init__(self, argv, **_):
            started.append(argv)

    monkeypatch.setattr(peers_openvino.subprocess, "Popen", Spy)
    peers_openvino.Worker("ir", 2, python="py", precision="bf16")
    peers_openvino.Worker("ir", 2, python="py")
    assert started[0][-2:] == ["--precision", "bf16"] and started[1][-2:] == ["--precision", "f32"]
