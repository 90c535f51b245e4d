"""The model pair both programs run: loaded (the target, the drafter, checked against each other),
compiled where ``--compile`` asks, and measured at start-up (``measure.startup``: kernels, KV cache
kinds, the dtype, the policy's costs), with each model's header lines (``app.header_lines``).

Anything that stops loading raises ``app.session.SetupError`` with one readable line."""
import functools
import gc
import sys
from pathlib import Path
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from app.header_lines import describe, summary
from app.steps import FIRST_ANSWER_LIMIT, cuda_decides, cuda_default, start_graphs
from app.session import Say, SetupError, drafter_head, first_line, progress_bar, to_stderr  # noqa: F401 (progress_bar: here too)
from utils.parsing import parse_int

if TYPE_CHECKING:
    from torch.nn import Module

    from measure import Finding, Measured, Options


@dataclass
class Pair:
    """The target, its tokenizer, and the drafter (None without one), with how to name them, and what
    the start-up measured and chose for them (``measured``: ``measure.Measured``)."""

    target: "Module"
    tokenizer: object
    target_label: str
    quantize: str
    drafter: Optional["Module"] = None
    drafter_label: str = ""
    drafter_quantize: str = "none"
    compile_seconds: Dict[str, float] = field(default_factory=dict)  # role -> seconds spent compiling at start-up
    measured: Optional["Measured"] = None  # set by ``load_pair``: kernels, cache kinds, dtype, costs, the load hint
    end_tokens: List[int] = field(default_factory=list)  # the target's end-of-sequence and end-of-turn ids
    drafter_tokenizer: object = None  # set only for a drafter with a tokenizer of its own (``drafters.cross_tokenizer``)
    relation: str = ""  # how such a drafter relates to the target: shared tokens, the translation used
    drafter_dtype_notes: Tuple[str, str] = ("", "")  # why the drafter's dtype is not the target's: full line's, short line's

    def runner(self, role: str):
        """The ``RunnerConfig`` the ``role``'s passes run under (eager, the device's cache if none was set)."""
        from runners import EAGER

        model = None if self.measured is None else self.measured.target if role == "target" else self.measured.drafter
        return EAGER if model is None else model.runner

    def describe(self, role: str) -> str:
        """One line for the target or the drafter: ``describe`` with how its settings were chosen
        (the drafter's with how it relates to the target, for one with its own tokenizer)."""
        model, label, quantize = ((self.target, self.target_label, self.quantize) if role == "target"
                                  else (self.drafter, self.drafter_label, self.drafter_quantize))
        notes = {} if self.measured is None else self.measured.notes(role)
        line = describe(model, label, quantize, notes, self.runner(role))
        notes = (self.drafter_dtype_notes[0], self.relation) if role == "drafter" else ()
        return line + "".join(f" · {note}" for note in notes if note)

    def summary(self, role: str) -> str:
        """The short header line for the target or the drafter (``summary``); ``describe`` is the full one."""
        model, label, quantize = ((self.target, self.target_label, self.quantize) if role == "target"
                                  else (self.drafter, self.drafter_label, self.drafter_quantize))
        short = self.drafter_dtype_notes[1] if role == "drafter" else ""
        return summary(model, label, quantize, self.runner(role)) + (f" · {short}" if short else "")

    @property
    def dtype_note(self) -> str:
        """Why this dtype, when it was chosen by measurement (``--preset pair``), else ""."""
        found = None if self.measured is None else self.measured.dtype
        return "" if found is None else found.line

    @property
    def busy_note(self) -> str:
        """The machine's load made start-up figures noisy (``measure.busy_note``), else ""."""
        return "" if self.measured is None else self.measured.busy

    def header_note(self) -> str:
        """What the target's header line adds after ``describe``: the dtype's reason, the machine's load."""
        return "".join(f" · {note}" for note in (self.dtype_note, self.busy_note) if note)

    @property
    def encoder_decoder(self) -> bool:
        return bool(getattr(self.target.config, "is_encoder_decoder", False))


def _check_device(flag: str, value: Optional[str]) -> None:
    import torch

    try:
        device = torch.device(value) if value not in (None, "auto") else None
    except (RuntimeError, ValueError):
        raise SetupError(f"{flag} must be cpu, cuda, cuda:N, mps or auto, got {value[:40]!r}") from None
    if device is not None and device.type == "cuda":
        from utils.models import cuda_missing

        missing = cuda_missing(device)
        if missing:
            raise SetupError(f"{flag} {value}: {missing}")


def _load(role: str, name: Optional[str], where: str, dtype: str, quantize: str, trust_remote_code: bool,
          target: Optional["Module"] = None, say: Say = to_stderr) -> tuple:
    """``(model, tokenizer, label)``; a drafter ``layers:N`` is a copy of the first N layers of ``target``,
    where ``target`` is (its tokenizer is None: the target's)."""
    from utils.models import load_model, truncated_drafter

    try:
        if role == "drafter" and name.startswith("layers:"):
            count = parse_int(name[len("layers:"):], "--drafter layers:N", 1, 1_000_000)
            return truncated_drafter(target, count), None, f"first {count} layers of the target"
        return load_model(name, where, dtype, quantize, trust_remote_code, say=functools.partial(say, style="dim"),
                          tokenizer_required=role == "target")  # a drafter's missing one: said by _check_drafter
    except (Exception, KeyboardInterrupt) as error:  # one clear line, no traceback
        raise SetupError(f"could not load the {role} '{name or 'embedded'}': {first_line(error)}") from None


def _measured_load(role: str, name: str, where: str, quantize: str, trust: bool, measuring: "Options", say: Say,
                   target: Optional["Module"] = None) -> tuple:
    """``(model, tokenizer, label, finding)`` for an automatic dtype (``--dtype auto`` under ``--preset pair``, a float32
    target's drafter): bfloat16 on an accelerator; on CPU the dtype an earlier start saved (one copy loaded), else the float32
    one loaded and its bfloat16 copy made, raced (``measure.measured_dtype``), the one chosen kept, the other freed (peak 1.5x)."""
    from measure import FIXED, Finding, measured_dtype, saved_dtype
    from utils.dtype_copy import bfloat16_copy
    from utils.models import gguf_model_dir

    load = functools.partial(_load, role, name, where, quantize=quantize, trust_remote_code=trust, target=target, say=say)
    if where != "cpu":
        return (*load(dtype="bfloat16"), Finding("bfloat16", "bfloat16 (--dtype auto on an accelerator)", FIXED))
    try:
        folder = gguf_model_dir(Path(name), functools.partial(say, style="dim")) if name.endswith(".gguf") else name
        found = saved_dtype(folder, measuring)
        if found is not None:
            return (*load(dtype=found.value), found)
        copies = {"float32": load(dtype="float32")}
        say(f"Making a bfloat16 copy of the {role} to time its passes against float32 ...", "dim")
        copies["bfloat16"] = (bfloat16_copy(copies["float32"][0]), *copies["float32"][1:])  # a tensor at a time: 1.5x, never 2x
        found = measured_dtype(folder, copies["float32"][0], copies["bfloat16"][0], role, measuring)
    except SetupError:
        raise
    except (Exception, KeyboardInterrupt) as error:
        raise SetupError(f"could not measure a dtype for '{name}': {first_line(error)}") from None
    kept, _ = copies.pop(found.value), copies.clear()
    gc.collect()  # the copy not chosen goes now (its runner's reference cycles too), before the next model loads
    return (*kept, found)


def pair_preset() -> dict:
    """``--preset pair``: the real drafter pair's GGUF files, with the dtype chosen by measurement;
    SetupError saying how to install it when it is not installed."""
    from utils.pair import DRAFTER, INSTALL_HINT, TARGET, gguf_path, installed

    if not installed():
        raise SetupError(f"the pair (Qwen2.5-Coder-1.5B-Instruct + 0.5B) is not installed: {INSTALL_HINT}")
    return {"target": str(gguf_path(TARGET)), "drafter": str(gguf_path(DRAFTER)), "measure_dtype": True}


def cross_preset() -> dict:
    """``--preset cross``: the pair's Qwen2.5-Coder-1.5B-Instruct target drafted for by the embedded
    SmolLM2-135M-Instruct, a model with another tokenizer (``drafters.cross_tokenizer``)."""
    from utils.models import embedded_model_dir

    return {**pair_preset(), "drafter": str(embedded_model_dir(lambda text: None))}


def _check_drafter(pair: Pair, drafter_tokenizer, name: str, chat: bool = True, say: Say = to_stderr) -> None:
    """SetupError when the drafter cannot draft for the target at all; a drafter with a tokenizer of
    its own is kept (``Pair.drafter_tokenizer``, ``Pair.relation``) unless ``cross_problem`` finds
    something missing, which is said in one line, the drafter dropped (speculative decoding off)."""
    from drafters.cross_tokenizer import same_vocabulary
    from runners.limits import common_vocab_size

    if pair.drafter.config.is_encoder_decoder != pair.target.config.is_encoder_decoder:
        raise SetupError("drafter and target must both be decoder-only or both encoder-decoder")
    try:
        common_vocab_size(pair.drafter, pair.target, pair.tokenizer)
        sizes = None
    except ValueError as error:
        sizes = str(error)
    same = drafter_tokenizer is not None and same_vocabulary(pair.tokenizer, drafter_tokenizer)
    if same or (drafter_tokenizer is None and sizes is None):
        if sizes is None:
            return
        raise SetupError(f"the drafter cannot draft for this target: {sizes}")
    if pair.encoder_decoder:
        raise SetupError(f"the drafter cannot draft for this target: {sizes or 'drafter and target tokenizers differ'}")
    from drafters.cross_tokenizer import cross_problem, relation

    problem = cross_problem(pair.tokenizer, drafter_tokenizer, name, chat)
    if problem is not None:
        say(f"{problem}: speculative decoding off", "red")
        pair.drafter, pair.drafter_label = None, ""
        return
    pair.drafter_tokenizer, pair.relation = drafter_tokenizer, relation(pair.tokenizer, drafter_tokenizer)


def measure_options(prepack: bool | str = "auto", cache: Optional[str] = "auto", calibrate: bool = True,
                    row_costs: Optional[Tuple[float, ...]] = None, remeasure: bool = False, busy: str = "") -> "Options":
    """``measure.Options`` for the flags: each measurement announced on stderr (a builtin's partial:
    ``measure`` calls nothing of the app back), a progress bar on a terminal."""
    from measure import Options

    word = {True: "on", False: "off"}.get(prepack, prepack)
    return Options(prepack=word, cache=cache, calibrate=calibrate, row_costs=row_costs, remeasure=remeasure, busy=busy,
                   say=functools.partial(print, file=sys.stderr, flush=True), progress=progress_bar if sys.stderr.isatty() else None)


def _runners(pair: Pair, options: "LoadOptions", say: Say) -> Dict[str, object]:
    """Each model's ``RunnerConfig`` from ``--cache`` and ``--compile`` (the cache kind measured later
    with "auto"); a model that compiles gets its kernels (own linears frozen, oneDNN's with ``--prepack
    on``) and is compiled here for sequences of ``options.compile_length`` positions, before anything is timed."""
    from runners import RunnerConfig, compile_source, lean_unsupported, prepare, set_prepack, why_not_compiled

    runners, cache, compile = {}, options.cache, options.compile
    if options.eager and (compile or options.forward == "step"):
        raise SetupError("--eager keeps the eager forward: it cannot go with --compile or --forward step")
    for role, model in (("target", pair.target), ("drafter", pair.drafter)):
        if model is None:
            continue
        reason = why_not_compiled(model) if compile else None
        eager_lean = options.forward == "lean" and (not compile or reason is not None)  # no --compile, or it cannot compile
        if (options.forward == "step" or eager_lean) and lean_unsupported(model) is not None:
            raise SetupError(f"--forward {options.forward}: the {role} cannot take it: {lean_unsupported(model)}")
        runners[role] = RunnerConfig(None if cache == "auto" else cache, compile and reason is None, forward=options.forward,
                                     eager=options.eager, graphs=options.step_graphs)
        if reason is not None:
            say(f"--compile: the {role} runs eagerly: {reason}", "red")
        if cuda_decides(runners[role], model):  # on CUDA, never eager by default: transformers' forward compiled
            runners[role], seconds = cuda_default(model, role, runners[role], options, say)
            if runners[role].compiled_for(model):
                pair.compile_seconds[role] = seconds
        elif runners[role].step_for(model):
            pair.compile_seconds[role] = seconds = start_graphs(model, role, options, lambda text: say(text, "dim"))
            say(f"Compiled the {role}'s first graphs in {seconds:.1f} s ({compile_source(model) or 'nothing new'}; "
                "outside every timed run)")
        elif runners[role].compiled_for(model):
            # the model's own linears frozen into the graphs (--gemm: MKL's or inductor's autotuned templates),
            # or called on the skinny kernel (--gemm skinny); an eager kernel measurement would answer another
            # question. "on": oneDNN's.
            _compiled_kernels(model, role, options.prepack in (True, "on"), say)
            seconds = prepare(model, options.compile_length, lambda text: say(f"{role}: {text} ...", "dim"), config=runners[role])
            pair.compile_seconds[role] = seconds
            say(f"Compiled the {role} in {seconds:.1f} s ({compile_source(model) or 'nothing new'}; outside every timed run)")
            pays = compile_pays(model, runners[role])
            if pays:
                say(f"--compile, the {role}: {pays}", "red" if "does not pay" in pays else "dim")
    return runners


PAYS = 1.3  # --compile pays where a compiled one-position pass is at least this much faster than an eager one


def compile_pays(model, runner) -> str:
    """Whether compiling pays for ``model`` on this CPU, measured now: one-position cached passes,
    compiled (``runner``) and eager on the same kernels, interleaved (5 rounds, medians); one line,
    saying "does not pay" below ``PAYS``. "" on CUDA (graphs pay there) or when nothing could be timed."""
    import torch

    from measure.timing import PassTimer, compared
    from runners import EAGER
    from runners.device import model_device

    if model_device(model).type != "cpu":
        return ""
    with torch.no_grad():
        timers = [PassTimer(model, 128, 1, runner=runner), PassTimer(model, 128, 1, runner=EAGER.with_(cache="dynamic"))]
        medians, _ = compared([(timer, 1) for timer in timers], repeats=5)
    if medians is None:
        return ""
    fast, slow = medians
    ratio = slow / fast
    verdict = "pays" if ratio >= PAYS else f"does not pay on this CPU (below {PAYS}x)"
    return f"a compiled one-position pass {fast * 1e3:.1f} ms, an eager one {slow * 1e3:.1f} ms ({ratio:.2f}x): compiling {verdict}"


def _compiled_kernels(model, role: str, prepack: bool, say: Say) -> None:
    """The linears a model's graphs call: oneDNN's (``prepack``), the skinny kernel's up to 12 positions
    (``--gemm skinny``, where it builds and the layers are float32 CPU ones; else MKL's, said), or its own."""
    from kernels import skinny
    from runners import compiled, prepackable, set_prepack

    if compiled.CPU_GEMM == "skinny" and not prepack:
        built, why = skinny.available()
        if built and prepackable(model):
            set_prepack(model, True, compiled.SKINNY_ROUTE)
            return
        say(f"--gemm skinny: the {role}'s graphs use MKL: {why or 'no float32 CPU linear layers'}", "red")
    set_prepack(model, prepack)


@dataclass(frozen=True)
class LoadOptions:
    """How ``load_pair`` loads and measures the pair (the flags both programs share): where
    (``device``; the drafter's ``drafter_device`` defaults to it), the weights (``dtype``, ``quantize``;
    the drafter's ``drafter_quantize`` defaults to the target's), ``trust_remote_code``, the KV cache
    kind (``cache``), the kernels (``prepack``), compilation (``compile``, for ``compile_length``
    positions), ``measure_dtype``, ``remeasure``, the chat template (``chat``), the calibration
    (``calibrate``) and verification costs given by ``--row-costs`` (``row_costs``)."""

    device: Optional[str] = None
    drafter_device: Optional[str] = None
    dtype: str = "auto"
    quantize: str = "none"
    drafter_quantize: Optional[str] = None
    trust_remote_code: bool = False
    cache: Optional[str] = None
    prepack: bool | str = "auto"
    compile: bool = False
    compile_length: int = 1000
    measure_dtype: bool = False
    remeasure: bool = False
    chat: bool = True
    calibrate: bool = True
    row_costs: Optional[Tuple[float, ...]] = None
    runner: str = "torch"  # what runs the target's passes: "torch" or "llama-cpp" (its GGUF file's, ``runners.llama_cpp``)
    forward: str = "auto"  # whose forward the eager runners run (``runners.RunnerConfig.forward``)
    eager: bool = False  # --eager: the eager forward kept on CUDA, where the compiled step is the default
    step_graphs: str = "regional"  # --step-graphs: how the compiled step makes graphs (``runners.RunnerConfig.graphs``)
    step_widths: Tuple[int, ...] = (1,)  # the compiled step's widths built at start-up (the measurements': 1 and gamma + 1)
    first_answer_limit: float = FIRST_ANSWER_LIMIT  # seconds transformers' compiled forward may take by CUDA's default
    hidden_layers: Tuple[int, ...] = ()  # a head's layers (``app.steps.head_layers``): the start-up graphs return them
    drafter_head: str = "auto"  # --drafter-head: the drafter's rows as it drafts, its cost timed on them (``app.session.drafter_head``)
    drafter_dtype: Optional[str] = None  # --drafter-dtype: the drafter's weights dtype (None: the target's; "auto": ``app.drafter_dtype``)


def llama_cpp_target(target: Optional[str]) -> str:
    """The GGUF file llama.cpp runs for ``--runner llama-cpp`` (None: the embedded model's); SetupError
    in one line for a target that is no GGUF file, or without llama-cpp-python."""
    from runners.llama_model import llama_cpp_missing
    from utils.models import embedded_gguf

    if target is not None and not target.lower().endswith(".gguf"):
        raise SetupError(f"--runner llama-cpp runs a GGUF file: the embedded model or --target FILE.gguf, not {target}")
    missing = llama_cpp_missing()
    if missing is not None:
        raise SetupError(f"--runner llama-cpp: {missing}")
    return str(embedded_gguf() if target is None else Path(target).expanduser())


def load_pair(target: Optional[str], drafter: Optional[str], options: LoadOptions = LoadOptions(), say: Say = to_stderr) -> Pair:
    """Load the target (None: the embedded model) and the drafter (None: none; ``layers:N``: the first N layers of the
    target), check that the drafter can draft for the target, compile those ``options.compile`` asks for (``_runners``),
    and measure them (``measure.startup``: ``Pair.measured``): each one's kernels (``prepack`` "auto": measured, each row
    later on its own best option; "on"/"off": given) and KV cache kind (``cache`` "auto": measured on CPU), then, with
    ``calibrate``, the drafter's cost (a pass with the rows ``drafter_head`` gives it as it drafts) and the target's
    verification costs (``row_costs``: given, ``--row-costs``). ``measure_dtype`` with ``dtype`` auto: the target's dtype,
    and a float32 target's drafter's (``app.drafter_dtype``), by ``_measured_load``. Measurements run within budgets,
    reused from earlier starts unless ``remeasure`` (docs/startup.md). A drafter with another tokenizer drafts across
    tokenizers; one that cannot (``cross_problem``; the chat template matters when ``chat``) is dropped."""
    import torch

    from app.drafter_dtype import drafter_dtype, measures
    from measure import ImplausibleCosts, busy_note, startup
    from utils.models import end_tokens, resolve_device

    torch.set_grad_enabled(False)
    for flag, value in (("--target", target), ("--drafter", drafter)):
        if value is not None and not value.strip():
            raise SetupError(f"{flag} is empty: give a model folder, a .gguf file or a Hub id")
    _check_device("--device", options.device)
    _check_device("--drafter-device", options.drafter_device)
    device, dtype = resolve_device(options.device), options.dtype
    say(f"Loading target: {target or 'embedded SmolLM2-135M-Instruct'} ...", "dim")
    # the load is read before anything of ours loads the machine
    measuring = measure_options(options.prepack, options.cache, options.calibrate, options.row_costs, options.remeasure, busy_note())
    gguf = llama_cpp_target(target) if options.runner == "llama-cpp" else None  # refused before anything loads
    if options.measure_dtype and dtype == "auto" and target is not None:
        model, tokenizer, label, chosen = _measured_load("target", target, device, options.quantize, options.trust_remote_code,
                                                         measuring, say)
        dtype = chosen.value
    else:
        (model, tokenizer, label), chosen = _load("target", target, device, dtype, options.quantize, options.trust_remote_code, say=say), None
    pair = Pair(model, tokenizer, label, options.quantize, end_tokens=end_tokens(model, tokenizer))
    if drafter is not None:
        say(f"Loading drafter: {drafter} ...", "dim")
        layers = drafter.startswith("layers:")
        drafter_quantize = options.quantize if layers else options.drafter_quantize or options.quantize
        where = resolve_device(options.drafter_device or device)
        asked = (options.drafter_dtype, dtype, drafter, where, options.measure_dtype)
        if measures(*asked):  # loaded and measured here, as the target is: both go down the same way (app -> measure)
            pair.drafter, drafter_tokenizer, pair.drafter_label, found = _measured_load(
                "drafter", drafter, where, drafter_quantize, options.trust_remote_code, measuring, say, model)
            own = drafter_dtype(*asked, found)
        else:
            own = drafter_dtype(*asked)
            pair.drafter, drafter_tokenizer, pair.drafter_label = _load("drafter", drafter, where, own.value, drafter_quantize,
                                                                        options.trust_remote_code, model, say)
        pair.drafter_dtype_notes = (own.note, own.short)
        pair.drafter_quantize = drafter_quantize
        _check_drafter(pair, drafter_tokenizer, drafter, options.chat, say)
    runners = _runners(pair, options, say)
    if gguf is not None:
        runners["target"] = runners["target"].with_(gguf=gguf, compile=False)
        say(f"The target's passes run on {runners['target'].describe(model)}; the drafter and transformers' peers on torch")
    try:
        pair.measured = startup(pair.target, runners["target"], measuring, pair.drafter, runners.get("drafter"), chosen,
                                drafter_head(options.drafter_head, pair))
    except ImplausibleCosts as error:
        raise SetupError(f"--row-costs: {error}") from None
    return pair
