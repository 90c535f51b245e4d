"""Loading off a terminal: one line per stage, no progress bar's carriage returns in the output."""
from transformers.utils import logging as hf_logging

from utils import models


def test_loading_off_a_terminal_writes_no_progress_bar(tiny_models, capfd):
    models.load_model(tiny_models["target"], "cpu", "float32")
    captured = capfd.readouterr()
    assert "\r" not in captured.out + captured.err
    assert not hf_logging.is_progress_bar_enabled()  # pytest's output is no terminal


def test_a_gguf_is_converted_once_saying_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    converted = []

    def convert(path, folder):  # a stand-in for transformers' de-quantization
        converted.append(path)
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"weights")

    monkeypatch.setattr(models, "convert_gguf", convert)
    lines = []
    folder = models.gguf_model_dir(gguf, lines.append)
    assert folder == tmp_path / "cache" / "gguf-model-64" and converted == [gguf]
    assert len(lines) == 1 and lines[0].startswith("Converting model.gguf once into")
    assert models.gguf_model_dir(gguf, lines.append) == folder and len(lines) == 1 and converted == [gguf]
