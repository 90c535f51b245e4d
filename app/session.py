"""What the REPL (app/repl) and the benchmark (app/bench) both set up before running strategies:
their shared flags, the target and drafter models, the settings with the calibrated policy,
and prompts as token ids.

Anything that stops the set-up raises ``SetupError`` with one readable line; the REPL prints it
as ``error: ...`` and exits 1, the benchmark exits with it.
"""
import argparse
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from utils.parsing import UsageError, flag_type, parse_int, parse_processor

if TYPE_CHECKING:
    from torch.nn import Module

    from strategies import Settings

# say(text, style): one line of progress; style is a rich style ("dim", "red") or ""
Say = Callable[..., None]


class SetupError(Exception):
    """The set-up cannot proceed; the message is one line."""


def to_stderr(text: str, style: str = "") -> None:
    """``say`` for a program without styles: the line on stderr."""
    print(text, file=sys.stderr)


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def add_shared_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that mean the same in both programs."""
    parser.add_argument("--target", help="target model: Hub id, local folder or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--drafter", help="drafter model: Hub id, local folder or .gguf file, or layers:N for the first N layers "
                        "of the target (default: none)")
    parser.add_argument("--device", help="cpu, cuda, cuda:N, or auto (shard over all GPUs); default cuda when available")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"], help="weights dtype")
    parser.add_argument("--cache", choices=["auto", "static", "dynamic"], default="auto", help="KV cache kind of our eager "
                        "runners: static (preallocated, rolled back by moving the write position) or the model's dynamic "
                        "cache; auto measures both at start-up on CPU and keeps the faster, static on CUDA (default auto; "
                        "--compile always runs over a static cache)")
    parser.add_argument("--prepack", choices=["auto", "on", "off"], default="auto", help="float32 CPU linear layers of the model "
                        "(for every row, transformers' peers included) run from a copy of their weights reordered once for "
                        "oneDNN (same logits up to rounding; faster on some CPUs, slower on others); auto measures both over "
                        "1-12 positions at start-up and gives each row the faster for the passes it makes (default auto)")
    parser.add_argument("--compile", action="store_true", help="our runners' decoding and verification passes compiled with "
                        "torch.compile over a static cache (inductor with frozen weights on CPU, CUDA graphs on CUDA), "
                        "compiled once at start-up and reported apart; transformers' static-cache peer is compiled too")
    parser.add_argument("--gemm", choices=["mkl", "templates"], default="mkl", help="with --compile on CPU, the frozen linears' "
                        "kernels: mkl (default; minutes to compile) or templates (inductor's C++ GEMM templates autotuned against "
                        "MKL per shape: passes ~1.6x faster on a 2-core AVX2 EPYC, 11-17 min to compile at every start)")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow model code from the Hub (off: it runs code you have not read)")
    parser.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    parser.add_argument("--processor", default="greedy", help='sampling, as the REPL\'s /processor takes it, e.g. "nucleus 0.6 0.9" (default greedy)')
    parser.add_argument("--seed", type=flag_type("--seed", "seed"), default=42, help="seed set before each strategy (default 42)")
    parser.add_argument("--row-costs", type=row_costs_flag, help="the target's verification costs by positions 1..N relative to "
                        "one, e.g. 1,1.1,1.2,1.3 (costs measured before, for a run that must not depend on a busy machine's "
                        "measurement): used instead of measuring them; the start-up line says they were given")
    parser.add_argument("--remeasure", action="store_true", help="measure the cache kind, kernels, dtype and costs again "
                        "instead of reusing those saved for this machine, model and settings (in the cache folder's measurements/)")
    parser.add_argument("--no-calibrate", action="store_true", help="skip measuring the target's verification costs at start "
                        "(a few seconds): no padded passes, no cost-aware pausing (the library's default policy)")


def row_costs_flag(text: str) -> Tuple[float, ...]:
    """``--row-costs``: positive numbers separated by commas, the first 1 (a pass over one position)."""
    try:
        costs = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--row-costs takes numbers separated by commas, e.g. 1,1.1,1.2; got {text!r}") from None
    if not costs or costs[0] != 1.0 or any(not c > 0 for c in costs):
        raise argparse.ArgumentTypeError(f"--row-costs must start with 1 and be positive, got {text!r}")
    return costs


def read_processor(text: str, auto: bool = False, calibrate: bool = True):
    """``--processor`` as ``parse_processor`` returns it; SetupError for a malformed one, or for
    ``--gamma auto`` (``auto``) without calibration."""
    if auto and not calibrate:
        raise SetupError("--gamma auto needs the measured verification costs: drop --no-calibrate")
    try:
        return parse_processor(text.split())
    except UsageError as error:
        raise SetupError(str(error).replace("usage: /processor", "--processor")) from None


@dataclass
class Pair:
    """The target, its tokenizer, and the drafter (None without one), with how to name them."""

    target: "Module"
    tokenizer: object
    target_label: str
    quantize: str
    drafter: Optional["Module"] = None
    drafter_label: str = ""
    drafter_quantize: str = "none"
    compile_seconds: Dict[str, float] = field(default_factory=dict)  # role -> seconds spent compiling at start-up
    dtype_note: str = ""  # why this dtype, when it was chosen by measurement (``--preset pair``)
    notes: Dict[str, Dict[str, str]] = field(default_factory=dict)  # role -> {"cache" | "kernels": how it was chosen}
    kernel_choice: Dict[str, object] = field(default_factory=dict)  # role -> KernelChoice measured at start-up
    busy_note: str = ""  # the machine's load made start-up figures noisy (``utils.measurements.busy_note``)
    runners: Dict[str, object] = field(default_factory=dict)  # role -> RunnerConfig: its cache kind, compiled or not

    def runner(self, role: str):
        """The ``RunnerConfig`` the ``role``'s passes run under (eager, the device's cache if none was set)."""
        from runners import EAGER

        return self.runners.get(role, EAGER)
    drafter_tokenizer: object = None  # set only for a drafter with a tokenizer of its own (``drafters.cross_tokenizer``)
    relation: str = ""  # how such a drafter relates to the target: shared tokens, the translation used

    def describe(self, role: str) -> str:
        """One line for the target or the drafter: ``describe`` with how its settings were chosen
        (the drafter's with how it relates to the target, for one with its own tokenizer)."""
        model, label, quantize = ((self.target, self.target_label, self.quantize) if role == "target"
                                  else (self.drafter, self.drafter_label, self.drafter_quantize))
        line = describe(model, label, quantize, self.notes.get(role, {}), self.runner(role))
        return line + (f" · {self.relation}" if role == "drafter" and self.relation else "")

    def header_note(self) -> str:
        """What the target's header line adds after ``describe``: the dtype's reason, the machine's load."""
        return "".join(f" · {note}" for note in (self.dtype_note, self.busy_note) if note)

    @property
    def encoder_decoder(self) -> bool:
        return bool(getattr(self.target.config, "is_encoder_decoder", False))


def _check_device(flag: str, value: Optional[str]) -> None:
    import torch

    try:
        if value not in (None, "auto"):
            torch.device(value)
    except (RuntimeError, ValueError):
        raise SetupError(f"{flag} must be cpu, cuda, cuda:N, mps or auto, got {value[:40]!r}") from None


def _load(role: str, name: Optional[str], where: str, dtype: str, quantize: str, trust_remote_code: bool,
          target: Optional["Module"] = None, say: Say = to_stderr) -> tuple:
    """``(model, tokenizer, label)``; a drafter ``layers:N`` is a copy of the first N layers of ``target``,
    where ``target`` is (its tokenizer is None: the target's)."""
    from utils.models import load_model, truncated_drafter

    try:
        if role == "drafter" and name.startswith("layers:"):
            count = parse_int(name[len("layers:"):], "--drafter layers:N", 1, 1_000_000)
            return truncated_drafter(target, count), None, f"first {count} layers of the target"
        return load_model(name, where, dtype, quantize, trust_remote_code, say=lambda text: say(text, "dim"),
                          tokenizer_required=role == "target")  # a drafter's missing one: said by _check_drafter
    except (Exception, KeyboardInterrupt) as error:  # one clear line, no traceback
        raise SetupError(f"could not load the {role} '{name or 'embedded'}': {first_line(error)}") from None


def _measured_dtype(target: str, device: str, prepack: bool, say: Say, remeasure: bool = False, busy: bool = False) -> Tuple[str, str]:
    """``(dtype, reason)`` for ``--dtype auto`` on a model worth measuring (``--preset pair``)."""
    from pathlib import Path

    from sampling.startup import startup_dtype
    from utils.models import gguf_model_dir

    if device != "cpu":
        return "bfloat16", "bfloat16 (--dtype auto on an accelerator)"
    try:
        folder = gguf_model_dir(Path(target), lambda text: say(text, "dim")) if target.endswith(".gguf") else target
        return startup_dtype(folder, prepack, remeasure, busy=busy)
    except (Exception, KeyboardInterrupt) as error:
        raise SetupError(f"could not measure a dtype for '{target}': {first_line(error)}") from None


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


def load_pair(
    target: Optional[str], drafter: Optional[str], device: Optional[str] = None, drafter_device: Optional[str] = None,
    dtype: str = "auto", quantize: str = "none", drafter_quantize: Optional[str] = None, trust_remote_code: bool = False,
    cache: Optional[str] = None, prepack: bool | str = "auto", say: Say = to_stderr, compile: bool = False,
    compile_length: int = 1000, measure_dtype: bool = False, remeasure: bool = False, chat: bool = True,
) -> Pair:
    """Load the target (None: the embedded model) and the drafter (None: none; ``layers:N``: the
    first N layers of the target), check that the drafter can draft for the target, and set
    each one's ``RunnerConfig`` (``Pair.runners``: the KV-cache kind, measured with "auto", and the
    compilation) and the prepacking (``set_prepack``; "auto": measured, ``choose_kernels``: each row
    later runs on its own best option) of both. With ``compile``, every
    pass shape is compiled here for sequences of ``compile_length`` positions, before anything is
    timed; ``Pair.compile_seconds`` says how long it took.
    ``measure_dtype`` with ``dtype`` auto: bfloat16 on CUDA; on CPU bfloat16 only where a matmul of
    the target's shape measures clearly faster in it (``utils.cpu_dtype``), else float32. Measurements
    run within their budgets and are reused from earlier starts unless ``remeasure`` (``sampling.startup``).
    A drafter with another tokenizer drafts across tokenizers; one that cannot (``cross_problem``; the
    chat template matters when ``chat``) is dropped with one line."""
    import torch

    from sampling.startup import startup_cache, startup_kernels
    from runners import RunnerConfig, compile_source, model_device, prepackable, prepare, set_prepack, why_not_compiled
    from utils.measurements import busy_note
    from utils.models import resolve_device

    torch.set_grad_enabled(False)
    for flag, value in (("--target", target), ("--drafter", drafter)):
        if value is not None and not value.strip():
            raise SetupError(f"{flag} is empty: give a model folder, a .gguf file or a Hub id")
    _check_device("--device", device)
    _check_device("--drafter-device", drafter_device)
    device = resolve_device(device)
    say(f"Loading target: {target or 'embedded SmolLM2-135M-Instruct'} ...", "dim")
    note, busy = "", busy_note()  # before anything of ours loads the machine
    if measure_dtype and dtype == "auto" and target is not None:
        dtype, note = _measured_dtype(target, device, prepack not in (False, "off"), say, remeasure, bool(busy))
    model, tokenizer, label = _load("target", target, device, dtype, quantize, trust_remote_code, say=say)
    pair = Pair(model, tokenizer, label, quantize, dtype_note=note, busy_note=busy)
    if drafter is not None:
        say(f"Loading drafter: {drafter} ...", "dim")
        layers = drafter.startswith("layers:")
        drafter_quantize = quantize if layers else drafter_quantize or quantize
        where = resolve_device(drafter_device or device)
        pair.drafter, drafter_tokenizer, pair.drafter_label = _load("drafter", drafter, where, dtype, drafter_quantize,
                                                                    trust_remote_code, model, say)
        pair.drafter_quantize = drafter_quantize
        _check_drafter(pair, drafter_tokenizer, drafter, chat, say)
    for role, model in (("target", pair.target), ("drafter", pair.drafter)):
        if model is None:
            continue
        reason = why_not_compiled(model) if compile else None
        pair.runners[role] = RunnerConfig(None if cache == "auto" else cache, compile and reason is None)
        if reason is not None:
            say(f"--compile: the {role} runs eagerly: {reason}", "red")
        if compile and reason is None:
            # "auto": the model's own linears frozen into the graphs (--gemm: MKL's or inductor's autotuned
            # templates); an eager kernel measurement would answer another question. "on": oneDNN's.
            set_prepack(model, prepack in (True, "on"))
            if prepack == "auto" and prepackable(model):
                pair.notes.setdefault(role, {})["kernels"] = "compiled: own linears frozen, kernels by --gemm"
            seconds = prepare(model, compile_length, lambda text: say(f"{role}: {text} ...", "dim"))
            pair.compile_seconds[role] = seconds
            say(f"Compiled the {role} in {seconds:.1f} s ({compile_source(model) or 'nothing new'}; outside every timed run)")
            continue
        notes = pair.notes.setdefault(role, {})
        if prepack == "auto" and prepackable(model):
            pair.kernel_choice[role], notes["kernels"] = startup_kernels(model, role, remeasure, busy=bool(busy))
        else:
            set_prepack(model, prepack in (True, "on"))
        if cache == "auto" and model_device(model).type == "cpu":
            chosen, notes["cache"] = startup_cache(model, role, remeasure, busy=bool(busy))
            pair.runners[role] = pair.runners[role].with_(cache=chosen)
    return pair


def describe(model: "Module", label: str, quantize: str, notes: Optional[Dict[str, str]] = None, runner=None) -> str:
    """One line: the model, where it runs, its weights, its KV cache and its runner (compiled or
    eager: ``runner``, a ``RunnerConfig``; None: the defaults) and, eager, whether its linear layers
    are prepacked; ``notes`` say how the cache and the kernels were chosen (the measurements)."""
    from runners import EAGER, compiled_label, prepacked
    from utils.quantization import model_quantization

    notes, runner = notes or {}, runner or EAGER
    if model_quantization(model) in ("int4", "int8"):
        quantize += " (CPU weight-only kernels, bfloat16 activations)"
    line = f"{label} · {next(model.parameters()).device} · {model.dtype} · quantization {quantize} · "
    if runner.compiled_for(model):
        return line + f"static KV cache · {compiled_label(model)}"
    line += notes.get("cache", f"{runner.cache_for(model)} KV cache") + " · eager"
    if "kernels" in notes:
        return line + f" · {notes['kernels']}"
    return line + (" · prepacked linears" if prepacked(model) else "")


def build_settings(
    pair: Pair, processor, gamma: int | str = 4, length: int = 35, calibrate: bool = True, adaptive: bool = False,
    pause: Optional[Tuple[int, int]] = None, min_gain: Optional[float] = None, remember: bool = False, say: Say = to_stderr,
    row_costs: Optional[Tuple[float, ...]] = None, remeasure: bool = False,
) -> "Settings":
    """``strategies.Settings`` for ``pair``, with the policy calibrated on it (``sampling.calibrated_policy``,
    ``min_gain`` its default when None) or, without ``calibrate``, the library's default policy
    (``min_gain`` 0 when None). ``gamma`` "auto" needs plausible measured costs: without them the
    policy bounds drafts by 4, and ``say`` says so. The costs are measured within their budgets, or
    reused from an earlier start unless ``remeasure`` (``sampling.startup.startup_policy``)."""
    from sampling import DraftPolicy
    from sampling.startup import startup_policy
    from strategies import Settings
    from utils.models import end_tokens

    options = dict(adaptive=adaptive, remember=remember, **({"pause_after": pause[0], "pause_steps": pause[1]} if pause else {}))
    auto = gamma == "auto"
    drafter_note = ""
    if calibrate:
        try:
            policy, drafter_note = startup_policy(pair.target, pair.drafter, row_costs, remeasure, busy=bool(pair.busy_note),
                                                  kernel_choice=pair.kernel_choice.get("target"), runner=pair.runner("target"),
                                                  drafter_runner=pair.runner("drafter"),
                                                  **({} if min_gain is None else {"min_gain": min_gain}), **options)
        except ValueError as error:
            raise SetupError(f"--row-costs: {error}") from None
        policy.auto = auto and policy.row_costs is not None
    else:
        policy = DraftPolicy(min_gain=min_gain or 0.0, **options)
    settings = Settings(target=pair.target, tokenizer=pair.tokenizer, drafter=pair.drafter, processor=processor,
                        gamma=4 if auto else gamma, max_gen_len=length, eos_tokens_id=end_tokens(pair.target, pair.tokenizer),
                        encoder_decoder=pair.encoder_decoder, policy=policy, kernel_choice=pair.kernel_choice.get("target"),
                        runner=pair.runner("target"), drafter_runner=pair.runner("drafter"),
                        drafter_tokenizer=pair.drafter_tokenizer,
                        drafter_prompt=None if pair.drafter_tokenizer is None else rendered_for(pair.drafter_tokenizer))
    if calibrate:
        if auto and not policy.auto:
            say(f"gamma auto needs plausible verification costs: gamma <= {settings.gamma} instead", "red")
        drafter_cost = f" · a drafter pass costs {policy.draft_cost:.2f}{drafter_note}" if pair.drafter is not None else ""
        say(f"{policy.calibration}{drafter_cost}")
    return settings


# the conversations ``encode`` rendered lately, by the ids it gave: a drafter with its own tokenizer
# reads the same conversation rendered by its own chat template (``rendered_for``)
_RENDERED: Dict[Tuple[int, ...], Tuple[List[dict], bool]] = {}
_RENDERED_KEPT = 4096  # a benchmark encodes all its prompts before it runs them


def encode(tokenizer, messages: str | List[dict], chat: bool) -> List[int]:
    """A prompt (one user message, or a conversation) as token ids: through the chat template
    when ``chat`` and the tokenizer has one, else the messages' text joined by newlines."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    ids = _render(tokenizer, messages, chat)
    _RENDERED.pop(tuple(ids), None)
    _RENDERED[tuple(ids)] = (list(messages), chat)
    while len(_RENDERED) > _RENDERED_KEPT:
        del _RENDERED[next(iter(_RENDERED))]
    return ids


def _render(tokenizer, messages: List[dict], chat: bool) -> List[int]:
    if not chat or not getattr(tokenizer, "chat_template", None):
        return tokenizer("\n".join(m["content"] for m in messages)).input_ids
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids


def rendered_for(drafter_tokenizer) -> Callable[[List[int]], Optional[List[int]]]:
    """``prompt ids -> the drafter's ids``: the conversation ``encode`` gave those ids for, rendered by
    ``drafter_tokenizer`` (its own chat template); None for ids ``encode`` did not give lately (the
    drafter then reads the prompt's text in its own tokens)."""
    def render(prompt: List[int]) -> Optional[List[int]]:
        found = _RENDERED.get(tuple(prompt))
        return None if found is None else _render(drafter_tokenizer, *found)

    return render
