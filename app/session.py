"""What the REPL (app/repl) and the benchmark (app/bench) both set up before running strategies:
their shared flags, the run's config (with the calibrated policy) and context for a pair loaded and
measured by ``app.pair.load_pair``, and prompts as token ids.

Anything that stops the set-up raises ``SetupError`` with one readable line; the REPL prints it
as ``error: ...`` and exits 1, the benchmark exits with it.
"""
import argparse
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from utils.parsing import UsageError, flag_type, parse_processor

if TYPE_CHECKING:
    from configuration import RunConfig, RunContext

# say(text, style=""): one line of progress; style (positional or by keyword) is a rich style ("dim", "red") or ""
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
    parser.add_argument("--drafter-dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"], help="the drafter "
                        "model's weights dtype: auto (default) is the target's, except under --preset pair with a float32 target "
                        "on CPU, where the drafter runs bfloat16 when a bfloat16 matmul of its shape measures clearly faster (it "
                        "halves the bytes a draft reads; the target verifies every draft, so the output is unchanged). Named in "
                        "the Drafter line")
    parser.add_argument("--drafter-head", type=drafter_head_flag, default="auto", help="the drafter model's output layer: "
                        f"auto (default) computes the logits of its first {DRAFTER_HEAD:,} ids (BPE's most frequent) and of every token "
                        "of the prompt and the output so far, where its vocabulary is over twice that and its passes run on the C "
                        "step; N: the first N; full: every row. Drafts come from the rows computed and the target verifies them, "
                        "so the output is unchanged (FR-Spec, arXiv 2502.14856). Named in the Drafter line")
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
    parser.add_argument("--gemm", choices=["mkl", "templates", "skinny"], default="mkl", help="with --compile on CPU, the linears' "
                        "kernels: mkl (default; frozen; minutes to compile) or templates (frozen; inductor's C++ GEMM templates "
                        "autotuned against MKL per shape: passes ~1.6x faster on a 2-core AVX2 EPYC, 11-17 min to compile at every "
                        "start) or skinny (the skinny kernel up to 12 positions, MKL past them; not frozen, so the graphs are kept "
                        "on disk between starts)")
    parser.add_argument("--forward", choices=["auto", "lean", "transformers", "step"], default="auto", help="whose forward our "
                        "runners run: the lean one (runners/lean.py: the Llama family's forward over the model's own weights, "
                        "static KV cache), transformers' own, or auto (default): on CUDA the compiled step for that family (another "
                        "model: transformers' forward compiled where ready within app.steps.FIRST_ANSWER_LIMIT s, else eager), elsewhere "
                        "lean where the model is of that family and --cache is not dynamic; step: the lean forward compiled, one graph "
                        "per pass width and key bucket (runners/step.py). transformers' peers always run transformers' forward")
    parser.add_argument("--eager", action="store_true", help="on CUDA, keep the eager forward (the lean one for the Llama family "
                        "and its kin) instead of the compiled step or transformers' compiled forward, the defaults there: for comparison")
    parser.add_argument("--step-graphs", choices=["regional", "whole"], default="regional", help="how the compiled step "
                        "(runners/step.py) makes its graphs: regional (default: one decoder layer compiled for every layer, "
                        "each pass captured whole as one CUDA graph) or whole (each pass compiled whole, inductor's CUDA graphs)")
    parser.add_argument("--runner", choices=["torch", "llama-cpp"], default="torch", help="what runs the target's passes: "
                        "torch (default), or llama.cpp's kernels on the target's GGUF file (the embedded model, or --target "
                        "FILE.gguf; needs llama-cpp-python: make llama-cpp). A drafter model and transformers' peers stay on "
                        "torch; llama.cpp gives no hidden states, so the eagle rows are left out (docs/llama-cpp.md)")
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


DRAFTER_HEAD = 32768  # ``--drafter-head auto``'s rows, where the drafter's vocabulary is over twice as many


def drafter_head_flag(text: str) -> str:
    """``--drafter-head``: auto, full, or a positive count of rows."""
    if text in ("auto", "full") or text.isdigit() and int(text) > 0:
        return text
    raise argparse.ArgumentTypeError(f"--drafter-head takes auto, full or a positive count of rows, got {text[:40]!r}")


def drafter_head(flag: str, pair: "Pair") -> int:
    """The rows ``--drafter-head`` asks ``pair``'s drafter model to compute while it drafts (``RunConfig.drafter_head``;
    0: all): auto's ``DRAFTER_HEAD`` where its vocabulary is over twice as many, else all; a count as given. All
    for a drafter with a tokenizer of its own (its runner is its own: ``drafters.cross_tokenizer``)."""
    if pair.drafter is None or pair.drafter_tokenizer is not None or flag == "full":
        return 0
    if flag != "auto":
        return int(flag)
    return DRAFTER_HEAD if pair.drafter.get_output_embeddings().out_features > 2 * DRAFTER_HEAD else 0


def drafter_head_words(flag: str, pair: "Pair") -> str:
    """What the Drafter line adds for ``--drafter-head`` (``drafters.model.drafted_rows_words``): " · drafter head:
    32,768 of 151,936 tokens (...)" where its passes compute part of the rows, else ""."""
    from drafters.model import drafted_rows_words

    rows = drafter_head(flag, pair)
    words = drafted_rows_words(pair.drafter, pair.runner("drafter"), rows) if rows else ""
    return f" · {words}" if words else ""


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


@dataclass(frozen=True)
class PolicyFlags:
    """The draft policy's flags (``--adaptive``, ``--pause``, ``--min-gain``, ``--remember``): the
    policy is otherwise what the start-up costs make it (``DraftPolicy.calibrated``)."""

    adaptive: bool = False
    pause: Optional[Tuple[int, int]] = None
    min_gain: Optional[float] = None
    remember: bool = False


def build_settings(pair: "Pair", processor: str = "greedy", gamma: int | str = 4, length: int = 35,
                   flags: PolicyFlags = PolicyFlags(), say: Say = to_stderr, head: str = "auto") -> Tuple["RunConfig", "RunContext"]:
    """The run's values (``configuration.RunConfig``) and live objects (``RunContext``) for ``pair``
    (an ``app.pair.Pair``; ``head``: ``--drafter-head``, the drafter's rows), with the policy calibrated on the costs it measured at start-up
    (``sampling.DraftPolicy.calibrated``, ``min_gain`` its default when None) or, loaded without
    calibration, the library's default policy (``min_gain`` 0 when None). ``processor``: the sampling
    as ``--processor`` takes it. ``gamma`` "auto" needs plausible measured costs: without them the
    policy bounds drafts by 4, and ``say`` says so; the record's lines (the costs) are said too."""
    from configuration import RunConfig, RunContext
    from sampling import DraftPolicy, PolicySettings

    pause, min_gain = flags.pause, flags.min_gain
    options = dict(adaptive=flags.adaptive, remember=flags.remember,
                   **({"pause_after": pause[0], "pause_steps": pause[1]} if pause else {}))
    auto = gamma == "auto"
    measured = pair.measured
    costs = None if measured is None else measured.costs
    if costs is not None:
        policy = DraftPolicy.calibrated(costs, auto, **({} if min_gain is None else {"min_gain": min_gain}), **options)
    else:
        policy = DraftPolicy(min_gain=min_gain or 0.0, **options)
    config = RunConfig(processor=processor, gamma=4 if auto else gamma, max_gen_len=length,
                       eos_tokens_id=tuple(pair.end_tokens), policy=PolicySettings.of(policy),
                       kernel_choice=None if measured is None else measured.target.kernels.value,
                       runner=pair.runner("target"), drafter_runner=pair.runner("drafter"), drafter_head=drafter_head(head, pair))
    context = RunContext(target=pair.target, tokenizer=pair.tokenizer, drafter=pair.drafter,
                         drafter_tokenizer=pair.drafter_tokenizer,
                         drafter_prompt=None if pair.drafter_tokenizer is None else rendered_for(pair.drafter_tokenizer))
    if costs is not None:
        if auto and not policy.auto:
            say(f"gamma auto needs plausible verification costs: gamma <= {config.gamma} instead", "red")
        for line in measured.lines():
            say(line)
    return config, context


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


def progress_bar(done: int, total: int) -> None:
    """A start-up measurement's progress on a terminal (``measure.Options.progress``): one line on
    stderr redrawn with ``\\r`` between passes (no thread: a spinner's would compete with the passes
    timed), cleared when the passes are done or the measurement is over (0, 0)."""
    if total <= 0:
        sys.stderr.write("\r\033[K")
    else:
        width = 24
        filled = width * done // total
        end = "\r\033[K" if done >= total else ""
        sys.stderr.write(f"\r  [{'#' * filled}{'.' * (width - filled)}] {done}/{total} passes{end}")
    sys.stderr.flush()
