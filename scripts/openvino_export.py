"""Export the embedded model to OpenVINO IR in float32 for the benchmark's ``ov_*`` rows (``make openvino`` runs it).

Runs in the project's venv; the export itself runs in the OpenVINO venv (``--python``), whose optimum-intel 2.2 wants
transformers < 5.6. Its source is the project's own load of the GGUF file (``utils.models.embedded_model_dir``: weights
and tokenizer saved by the project's transformers; transformers 5.5 reads this GGUF's tokenizer wrongly). The IR is
built into a temporary folder under a lock, checked (its files; a short greedy generation through the rows' own
worker, plain and prompt lookup, that must give our target AR's tokens; float32 and a float32 KV cache in force, as
OpenVINO's log says), stamped, and renamed into place (``utils.models.cached_conversion``);
a complete export is left as it is.

    .venv/bin/python scripts/openvino_export.py [--python .venv-openvino/bin/python]
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peers_openvino import INSTALL, STAMP, Worker, ir_dir, ir_problem, venv  # noqa: E402
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


def build(out: Path, python: Path) -> None:
    export(embedded_model_dir(), out, python)
    stamp = verify(out, python)
    (out / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    print(f"Checked: {stamp['check']['new_tokens']} greedy tokens, plain and prompt lookup, equal to our target AR's; "
          f"both pipelines ran float32 with a float32 KV cache (OpenVINO {stamp['openvino']}, GenAI {stamp['openvino_genai']})",
          file=sys.stderr)


def genai_version(python: Path) -> str:
    """The OpenVINO GenAI version installed in ``python``'s venv; SystemExit with one line when it imports none."""
    done = subprocess.run([str(python), "-c", "import openvino_genai; print(openvino_genai.__version__)"], capture_output=True,
                          text=True)
    if done.returncode:
        raise SystemExit(f"error: {python} cannot import openvino_genai; {INSTALL}")
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", type=Path, default=venv() / "bin" / "python", help="the OpenVINO venv's python")
    args = parser.parse_args()
    if not args.python.is_file():
        raise SystemExit(f"error: no OpenVINO venv at {args.python}; {INSTALL}")
    folder, version = ir_dir(), genai_version(args.python)

    def problem(path: Path) -> Optional[str]:
        """Incomplete, or exported by another OpenVINO GenAI than the venv's."""
        missing = ir_problem(path)
        if missing is not None:
            return missing
        try:
            stamped = json.loads((path / STAMP).read_text()).get("openvino_genai")
        except (ValueError, AttributeError):
            return f"unreadable {STAMP}"
        return None if stamped == version else f"exported with OpenVINO GenAI {stamped}, the venv has {version}"

    if problem(folder) is None:
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
