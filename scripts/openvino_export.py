"""Export the embedded model to OpenVINO IR in float32 for the benchmark's ``ov_*`` rows (``make openvino`` runs it).

Runs in the project's venv; the export itself runs in the OpenVINO venv (``--python``), whose optimum-intel 2.2 wants
transformers < 5.6. Its source is the project's own load of the GGUF file (``utils.models.embedded_model_dir``: weights
and tokenizer saved by the project's transformers; transformers 5.5 reads this GGUF's tokenizer wrongly). The IR is
built into a temporary folder under a lock, checked (its files, and a short greedy generation through the rows' own
worker that must give our target AR's tokens), stamped, and renamed into place (``utils.models.cached_conversion``);
a complete export is left as it is.

    .venv/bin/python scripts/openvino_export.py [--python .venv-openvino/bin/python]
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peers_openvino import INSTALL, STAMP, Worker, ir_dir, ir_problem, venv  # noqa: E402
from utils.models import cached_conversion, embedded_model_dir  # noqa: E402

CHECK = "Name three primary colors."  # the check's prompt, chat-templated by the project
CHECK_TOKENS = 12


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
    """A short greedy generation on the IR in ``out`` through the rows' worker, against our target AR on the same ids;
    what it found, for the stamp. RuntimeError with one line when a file is missing or the tokens differ."""
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
    worker = Worker(out, torch.get_num_threads(), python)
    try:
        info = worker.ask({"op": "info"})
        theirs = worker.ask({"op": "generate", "prompt": prompt, "max_new_tokens": CHECK_TOKENS, "stop_token_ids": stops})["tokens"]
    finally:
        worker.close()
    if theirs != ours:
        raise RuntimeError(f"the export's greedy tokens {theirs} differ from our target AR's {ours} on {CHECK!r}")
    return {**info, "source": str(embedded_model_dir()), "weight_format": "fp32",
            "check": {"prompt": CHECK, "new_tokens": len(ours), "equal_to_target_ar": True}}


def build(out: Path, python: Path) -> None:
    export(embedded_model_dir(), out, python)
    stamp = verify(out, python)
    (out / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    print(f"Checked: {stamp['check']['new_tokens']} greedy tokens equal to our target AR's (OpenVINO {stamp['openvino']}, "
          f"GenAI {stamp['openvino_genai']})", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", type=Path, default=venv() / "bin" / "python", help="the OpenVINO venv's python")
    args = parser.parse_args()
    if not args.python.is_file():
        raise SystemExit(f"error: no OpenVINO venv at {args.python}; {INSTALL}")
    folder = ir_dir()
    if ir_problem(folder) is None:
        print(f"OpenVINO export ready (already): {folder}")
        return
    try:
        cached_conversion(folder, lambda out: build(out, args.python), lambda text: print(text, file=sys.stderr),
                          f"Exporting the embedded model to OpenVINO IR (float32) into {folder} ...", problem=ir_problem)
    except (RuntimeError, OSError) as error:
        raise SystemExit(f"error: {error}") from None
    print(f"OpenVINO export ready: {folder}")


if __name__ == "__main__":
    main()
