"""The learned draft head the eagle rows draft with (``--head``): the one given, else the head shipped
for the embedded target; loaded, checked against the target, its draft step's cost measured here."""
import time
from pathlib import Path
from typing import Optional, Tuple

from app.session import Say, SetupError, first_line, to_stderr

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "heads" / "smollm2-135m-eagle3"  # trained by ``python -m eagle.train`` (docs/eagle.md)
NONE = "none"


def head_flag(parser) -> None:
    """``--head``, the same in the REPL and the benchmark."""
    parser.add_argument("--head", help="an EAGLE-3 draft head for the target (speculators or EAGLE-3/SpecForge format folder) "
                        f"for the eagle rows; default: the shipped {SHIPPED.relative_to(ROOT)} with the embedded target, "
                        f"none with another; '{NONE}': no head")


def load_for(value: Optional[str], pair, embedded: bool, say: Say = to_stderr,
             length: Optional[int] = 1000) -> Tuple[Optional[object], str]:
    """``(head or None, one line describing it)`` for ``--head value`` (None: the default) and the
    target of ``pair`` (``app.pair.Pair``); a compiled target gets the graphs that also return the
    head's hidden states, for sequences of ``length`` positions (counted in its compile seconds;
    None: the caller builds them). The head's draft step is timed against a one-position target pass
    on the runner the rows run (the C step where it runs; eager passes where they would be compiled:
    a compiled one could need new graphs here). A head that cannot be read or does not fit the
    target raises SetupError with one line."""
    if value is not None and value.strip().lower() == NONE:
        return None, "none (--head none)"
    if value is not None and not value.strip():
        raise SetupError("--head is empty: give a head folder, or 'none'")
    path = head_path(value, embedded)
    if path is None:
        return None, "none (the eagle rows need one: --head PATH)"
    from eagle.cost import measure_step_cost
    from eagle.format import load_head

    from runners import prepare

    target, runner = pair.target, pair.runner("target")
    if runner.gguf is not None:
        return None, "none (llama.cpp gives no hidden states: the eagle rows need --runner torch)"
    say(f"Loading head: {path} ...", "dim")
    try:
        head = load_head(path, target)
    except (Exception, KeyboardInterrupt) as error:  # one clear line, no traceback
        raise SetupError(f"could not load the head '{path}': {first_line(error)}") from None
    if runner.step_for(target):  # the step's graphs at the start-up widths, with the head's hidden states (if not built so)
        from app.steps import START_LENGTH
        from eagle.head_step import prepare_head_step
        from runners import prepare_step

        seconds = prepare_step(target, START_LENGTH, lambda text: say(f"target: {text} ...", "dim"), tuple(head.config.aux_layers),
                               graphs=runner.graphs)
        clock = time.perf_counter()
        if prepare_head_step(head, 1, START_LENGTH, lambda text: say(f"head: {text} ...", "dim")):
            seconds += time.perf_counter() - clock
        pair.compile_seconds["target"] = pair.compile_seconds.get("target", 0.0) + seconds
    elif length is not None and runner.compiled_for(target):
        seconds = prepare(target, length, lambda text: say(f"target: {text} ...", "dim"), hidden_layers=head.config.aux_layers,
                          config=runner)
        pair.compile_seconds["target"] = pair.compile_seconds.get("target", 0.0) + seconds
    timed = runner.with_(compile=False)  # the runner the rows' passes run on, less graphs a timing could need built
    head.step_cost = measure_step_cost(head, target, runner=timed)
    kind = "the compiled head step (eagle/head_step.py)" if timed.step_for(target) else head.step_kind()
    head.summary = summary(head, path, kind)  # the header's short line; the line returned is the full one
    return head, describe(head, path, target_pass(target, timed), kind)


def target_pass(target, config) -> str:
    """What a one-position pass of ``target`` runs on under ``config`` (a ``RunnerConfig``), in a few words."""
    from kernels.c_step import step_for

    if config.step_for(target):
        return "the compiled step"
    return "the C step" if config.lean_for(target) and step_for(target, 1) else "the eager forward"


def head_path(value: Optional[str], embedded: bool) -> Optional[Path]:
    """The folder ``--head value`` names (None: the shipped head with the embedded target, else none)."""
    if value is not None:
        return None if value.strip().lower() == NONE else Path(value)
    return SHIPPED if embedded and (SHIPPED / "config.json").is_file() else None


def _where(path: Path):
    """``path`` under the repository as a relative path, else as given (a relative --head names a folder under the cwd)."""
    full = path.resolve()
    return full.relative_to(ROOT) if full.is_relative_to(ROOT) else path


def summary(head, path: Path, kind: str) -> str:
    """One short line: where the head is, its dtype, and what runs its draft step (``kind`` up to its parenthesis)."""
    step = kind.split(" (")[0].removeprefix("the ")
    weight = head.fc.weight
    return f"{_where(path)} · EAGLE-3 · {weight.device} {str(weight.dtype).removeprefix('torch.')} · {step}"


def describe(head, path: Path, against: str = "the eager forward", kind: Optional[str] = None) -> str:
    """One line: where the head is, its shape, what runs its draft step (``kind``; None: ``step_kind``), and
    that step's measured cost against a one-position target pass (``against``: what that pass ran on)."""
    c = head.config
    return (f"{_where(path)} · EAGLE-3 · layers {list(c.aux_layers)} · draft vocabulary {c.draft_vocab_size:,} · "
            f"{head.fc.weight.dtype} · draft step: {kind or head.step_kind()} · it costs {head.step_cost:.1%} of a target pass "
            f"on {against} (measured)")
