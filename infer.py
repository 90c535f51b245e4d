"""Interactive comparison of decoding strategies on the same prompt and seed.

    python infer.py                      # the embedded SmolLM2-135M-Instruct, offline
    python infer.py --target T --drafter D --device cuda
    echo "a prompt" | python infer.py    # or --prompt "a prompt": one comparison, then exit

Type a prompt to run every enabled strategy on it, or a /command (see /help).
"""
# The program lives in app/repl/ (cli: flags and main; repl: the Repl; commands: the /commands;
# state: what a command sees of the REPL; rounds: a comparison in interleaved rounds); this entry point keeps `python infer.py`, the reference's
# InferenceCLI, and the names other code reads as `infer.X`.
import atexit
import os
import sys

from app.repl.cli import PRESETS, OneLineParser, build_parser, fail, gamma_flag, main, say
from app.repl.commands import COMMANDS
from app.repl.repl import Repl, replaced_line
from utils.parsing import UsageError

__all__ = ["COMMANDS", "InferenceCLI", "OneLineParser", "PRESETS", "Repl", "UsageError", "build_parser", "fail", "gamma_flag",
           "main", "replaced_line", "say"]


class InferenceCLI:
    """The reference's entry point, ``InferenceCLI(device="cuda")``: loads the reference's model pair
    (``--preset reference``: Llama-3.2-3B-Instruct target, Llama-3.2-1B-Instruct drafter, int8)
    on ``device`` and runs the REPL until /quit."""

    def __init__(self, device: str = "cuda"):
        self.device = device
        main(["--preset", "reference", "--device", device])


def exit_now(run) -> None:
    """``run()``, then the process's end without the interpreter's teardown of torch and transformers (about 1 s
    after /quit on the embedded model): the exit handlers run (``atexit``: logging, weakref finalizers, the
    OpenVINO peer's worker) and the output is flushed first. The exit status is ``sys.exit``'s; an error other than
    a ``SystemExit`` ends the process as Python does (its traceback)."""
    try:
        run()
        code = 0
    except SystemExit as stop:
        code = stop.code
    if code is not None and not isinstance(code, int):  # sys.exit("message"): printed, status 1, as Python does
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    exit_now(main)
