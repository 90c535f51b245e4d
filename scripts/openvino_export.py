"""Export the embedded model to OpenVINO IR in float32 for the benchmark's ``ov_*`` rows (``make openvino`` runs it).

Runs in the project's venv; the export itself runs in the OpenVINO venv (``--python``), whose optimum-intel 2.2 wants
transformers < 5.6. Its source is the project's own load of the GGUF file (``utils.models.embedded_model_dir``: weights
and tokenizer saved by the project's transformers; transformers 5.5 reads this GGUF's tokenizer wrongly). The IR is
built into a temporary folder under a lock, checked (its files; a short greedy generation through the rows' own
worker, plain and prompt lookup, that must give our target AR's tokens; float32 and a float32 KV cache in force, as
OpenVINO's log says), stamped (with the venv, which the benchmark then runs the rows on), and renamed into place
(``utils.models.cached_conversion``), an export by another OpenVINO GenAI replaced only then; a complete export is
left as it is.

    .venv/bin/python scripts/openvino_export.py [--python .venv-openvino/bin/python]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peers_openvino import INSTALL, STAMP, Worker, genai_version, ir_dir, ir_problem, stamp, venv  # noqa: E402
from utils.files import write_atomically  # noqa: E402
from utils.models import cached_conversion, embedded_model_dir  # noqa: E402

CHECK = "Name three primary colors."  # the check's prompt, chat-templated by the project
CHECK_TOKENS = 12
PRECISION_KEYS = ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "KEY_CACHE_PRECISION", "VALUE_CACHE_PRECISION",
                  "DYNAMIC_QUANTIZATION_GROUP_SIZE", "INFERENCE_NUM_THREADS")


def export(hf: Path, out: Path, python: Path) -> None:
    """optimum-intel's export of ``hf`` into ``out`` (float32 weights, with its KV cache as inputs), its output into
    ``out/export.log``; RuntimeError with one line when it fails."""
    log = out / "export.log"
    command = [str(python), "-m", "optimum.commands.optimum_cli", "export", "openvino", "-m", str(hf),
               "--task", "text-generation-with-past", "--weight-format", "fp32", str(out)]
    with open(log, "w") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT)
    if done.returncode:
        last = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:] or ["no output"]
        raise RuntimeError(f"optimum-cli export failed (exit status {done.returncode}): {last[0][:300]}")


def verify(out: Path, python: Path) -> dict:
    """A short greedy generation on the IR in ``out`` through the rows' worker, plain and prompt lookup, against our
    target AR on the same ids, and the precision each pipeline ran in by OpenVINO's own log; what it found, for the
    stamp. RuntimeError with one line when a file is missing, the tokens differ or a pipeline was not float32."""
    import torch

    from app.session import encode
    from sampling import autoregressive_generate
    from utils.models import end_tokens, load_embedded

    missing = [p for p in ("openvino_model.xml", "openvino_model.bin") if not (out / p).is_file()]
    if missing:
        raise RuntimeError(f"the export wrote no {', '.join(missing)}")
    model, tokenizer = load_embedded()
    prompt, stops = encode(tokenizer, [{"role": "user", "content": CHECK}], True), end_tokens(model, tokenizer)
    ours = autoregressive_generate(prompt, model, max_gen_len=CHECK_TOKENS, eos_tokens_id=stops)
    request = {"op": "generate", "prompt": prompt, "max_new_tokens": CHECK_TOKENS, "stop_token_ids": stops}
    with tempfile.TemporaryFile("w+") as log:  # OpenVINO's log level 3 prints each compiled model's properties
        worker = Worker(out, torch.get_num_threads(), python, env={"OPENVINO_LOG_LEVEL": "3"}, stderr=log)
        try:
            info = worker.ask({"op": "info"})
            theirs = [worker.ask(dict(request, **lookup))["tokens"] for lookup in ({}, {"num_assistant_tokens": 5, "max_ngram_size": 3})]
        finally:
            worker.close()
        log.seek(0)
        precision = precision_in_force(log.read())
    if any(tokens != ours for tokens in theirs):
        raise RuntimeError(f"the export's greedy tokens {theirs} (plain, prompt lookup) differ from our target AR's {ours} on {CHECK!r}")
    return {**info, "source": str(embedded_model_dir()), "weight_format": "fp32", "precision_in_force": precision,
            "check": {"prompt": CHECK, "new_tokens": len(ours), "equal_to_target_ar": True}}


def precision_in_force(log: str) -> dict:
    """The LLM's compiled properties from OpenVINO's log (a "Model: NAME" line, then "  KEY: VALUE" lines), each
    pipeline's; RuntimeError with one line unless every one ran float32 with a float32 KV cache."""
    models, current = [], None
    for line in log.splitlines():
        if line.startswith("Model: "):
            current = {"model": line[len("Model: "):].strip()}
            models.append(current)
        elif current is not None and line.startswith("  ") and ": " in line:
            key, _, value = line.strip().partition(": ")
            if key in PRECISION_KEYS:
                current[key] = value.strip()
    llms = [m for m in models if "tokenizer" not in m["model"].lower()]
    wrong = [m for m in llms if m.get("INFERENCE_PRECISION_HINT") != "f32" or m.get("KV_CACHE_PRECISION") != "f32"]
    if not llms or wrong:
        raise RuntimeError(f"OpenVINO did not say it ran the model in float32: {wrong or 'no model properties in its log'}")
    return {"pipelines": len(llms), **{k: v for k, v in llms[0].items() if k != "model"}}


def venv_of(python: Path) -> str:
    """The venv of ``python`` (``VENV/bin/python``), absolute, its links kept (a venv's python links elsewhere)."""
    return str(Path(os.path.abspath(python)).parents[1])


def build(out: Path, python: Path) -> None:
    export(embedded_model_dir(), out, python)
    found = verify(out, python)
    (out / STAMP).write_text(json.dumps({**found, "venv": venv_of(python)}, indent=1) + "\n")
    print(f"Checked: {found['check']['new_tokens']} greedy tokens, plain and prompt lookup, equal to our target AR's; "
          f"both pipelines ran float32 with a float32 KV cache (OpenVINO {found['openvino']}, GenAI {found['openvino_genai']})",
          file=sys.stderr)


def record_venv(folder: Path, python: Path) -> None:
    """A current export made from another venv of the same OpenVINO GenAI: its stamp names this one (the benchmark's)."""
    found = stamp(folder)
    if found.get("venv") != venv_of(python):
        write_atomically(folder / STAMP, (json.dumps({**found, "venv": venv_of(python)}, indent=1) + "\n").encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", type=Path, default=venv() / "bin" / "python", help="the OpenVINO venv's python")
    args = parser.parse_args()
    if not args.python.is_file():
        raise SystemExit(f"error: no OpenVINO venv at {args.python}; {INSTALL}")
    folder, version = ir_dir(), genai_version(args.python)
    if version is None:
        raise SystemExit(f"error: {args.python} cannot import openvino_genai; {INSTALL}")

    def problem(path: Path) -> Optional[str]:
        """Incomplete, or exported by another OpenVINO GenAI than the venv's."""
        missing = ir_problem(path)
        if missing is not None:
            return missing
        stamped = stamp(path).get("openvino_genai")
        if stamped is None:
            return f"unreadable {STAMP}"
        return None if stamped == version else f"exported with OpenVINO GenAI {stamped}, the venv has {version}"

    if problem(folder) is None:
        record_venv(folder, args.python)
        print(f"OpenVINO export ready (already): {folder}")
        return
    try:
        cached_conversion(folder, lambda out: build(out, args.python), lambda text: print(text, file=sys.stderr),
                          f"Exporting the embedded model to OpenVINO IR (float32) into {folder} ...", problem=problem)
    except (RuntimeError, OSError) as error:
        raise SystemExit(f"error: {error}") from None
    print(f"OpenVINO export ready: {folder}")


if __name__ == "__main__":
    main()
