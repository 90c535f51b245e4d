"""Interactive comparison of decoding strategies on the same prompt and seed.

    python infer.py                      # the embedded SmolLM2-135M-Instruct, offline
    python infer.py --target T --drafter D --device cuda
    echo "a prompt" | python infer.py    # or --prompt "a prompt": one comparison, then exit

Type a prompt to run every enabled strategy on it, or a /command (see /help).
"""
import argparse
import os
import sys
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Callable, Dict, List, Optional, Tuple

from rich.console import Console
from rich.table import Table
from rich.text import Text

from session import SetupError, add_shared_flags, build_settings, describe, encode, first_line, load_pair, read_processor
from utils.parsing import LIMITS, MAX_LINE, UsageError, flag_type, parse_limited, parse_path, parse_processor, sanitize_text

PRESETS = {
    "embedded": {"target": None, "drafter": None},
    "reference": {  # the reference repository's setting
        "target": "meta-llama/Llama-3.2-3B-Instruct",
        "drafter": "meta-llama/Llama-3.2-1B-Instruct",
        "quantize": "int8",
        "device": "cuda",
    },
}

console = Console(highlight=False, soft_wrap=True)


def replaced_line(count: int) -> str:
    return f"{count} byte{'s' if count != 1 else ''} that {'are' if count != 1 else 'is'} not UTF-8 " \
           f"{'were' if count != 1 else 'was'} replaced by \ufffd"


def _range(key: str) -> str:
    low, high = LIMITS[key]
    return f"{low} to {high}"


def _on(value: bool) -> str:
    return "on" if value else "off"


# ---- the commands: one table, from which /help, the dispatch and the refusals are drawn --------
@dataclass(frozen=True)
class Command:
    """One REPL command.

    ``words``: one parser per word the command takes, or None to give ``run`` the words as typed.
    ``run(repl, *values)`` applies them and returns the line to say (or None). A ValueError from a
    parser or from ``run`` refuses the line with the usage, after the error's message when it has
    one; a UsageError refuses it with its own message. Either way nothing has changed."""

    name: str
    args: str  # what follows the name in /help and in the usage line, e.g. "<n>"
    what: str  # /help's description
    run: Callable[..., Optional[str]]
    words: Optional[Tuple[Callable[[str], Any], ...]] = ()
    value: Callable[["Repl"], Any] = lambda repl: ""  # shown by /help
    note: str = ""  # the accepted values, after the usage line of a refusal

    @property
    def usage(self) -> str:
        return f"{self.name} {self.args}".strip()

    def refusal(self, message: str = "") -> UsageError:
        line = f"usage: {self.usage}" + (f"   ({self.note})" if self.note else "")
        return UsageError(f"{message}; {line}" if message else line)

    def __call__(self, repl: "Repl", words: List[str]) -> Optional[str]:
        if self.words == () and words:
            raise UsageError(f"{self.name} takes no argument; usage: {self.name}")
        if self.words is not None and len(words) != len(self.words):
            raise self.refusal()
        try:
            values = [words] if self.words is None else [parse(word) for parse, word in zip(self.words, words)]
            return self.run(repl, *values)
        except UsageError:
            raise
        except ValueError as error:
            raise self.refusal(str(error)) from None


SETTINGS, POLICY, REPL = attrgetter("settings"), attrgetter("settings.policy"), lambda repl: repl


def limited(key: str, name: str | None = None) -> Callable[[str], Any]:
    """A word parser for the setting ``key`` of ``utils.parsing.LIMITS``."""
    return lambda word: parse_limited(word, name or key, key)


def toggle(name: str, what: str, owner: Callable, attribute: str, label: str, check: Callable | None = None) -> Command:
    """A command without words that turns ``owner(repl).attribute`` on or off (after ``check(repl)``)."""
    def run(repl):
        if check is not None:
            check(repl)
        box = owner(repl)
        setattr(box, attribute, not getattr(box, attribute))
        return f"{label}: {_on(getattr(box, attribute))}"

    return Command(name, "", what, run, value=lambda repl: getattr(owner(repl), attribute))


def strategy_toggle(key: str, what: str) -> Command:
    """``/key``: run the strategy ``key`` on each prompt, or not."""
    def run(repl):
        from strategies import BY_KEY

        strategy = BY_KEY[key]
        if strategy.needs_drafter and repl.settings.drafter is None:
            raise UsageError("no drafter loaded: restart with --drafter MODEL (a Hub id, a local folder or a GGUF file)")
        if strategy.decoder_only and repl.settings.encoder_decoder:
            raise UsageError(f"{strategy.title} works with decoder-only models only")
        repl.enabled[key] = not repl.enabled[key]
        return f"{strategy.title}: {_on(repl.enabled[key])}"

    return Command(f"/{key}", "", what, run, value=lambda repl: repl.enabled[key])


def number(name: str, args: str, what: str, owner: Callable, attribute: str, note: str) -> Command:
    """``/key <value>``: one number within the range of ``key`` (the name without its slash)."""
    key = name[1:]

    def run(repl, value):
        setattr(owner(repl), attribute, value)
        return f"{key}: {value}"

    return Command(name, args, what, run, (limited(key),), lambda repl: getattr(owner(repl), attribute), note)


def _quit(repl):
    raise EOFError


def _help(repl):
    console.print(Text("Commands", style="bold"))
    for command in COMMANDS.values():
        now = repl.value_of(command.name)
        line = Text(f"  {command.usage:<40}", style="bold") + Text(f" {command.what}")
        console.print(line + Text(f"  [{now}]", style="cyan") if now else line)
    console.print("Anything else is a prompt (\\n and \\t become newline and tab).")


def _no_template(repl):
    if not repl.chat and not getattr(repl.settings.tokenizer, "chat_template", None):
        raise UsageError("this tokenizer has no chat template")


def _gamma_word(word: str):
    return "auto" if word == "auto" else parse_limited(word, "gamma")


def _gamma(repl, value):
    policy = repl.settings.policy
    if value == "auto":
        if policy.row_costs is None:
            raise UsageError("/gamma auto needs the measured verification costs: restart without --no-calibrate")
        policy.auto = True
        return f"gamma: auto (cost-optimal, up to {policy.bound()} drafts per step)"
    repl.settings.gamma, policy.auto = value, False
    return f"gamma: {value} (at most {value} drafts per step)"


def _processor(repl, words):
    processor, repl.processor_name, repl.processor_args = parse_processor(words)
    repl.settings.processor = processor
    return f"processor: {repl.value_of('/processor')}"


def _storage_kind(word: str) -> str:
    from strategies import STORAGES

    if word not in STORAGES:
        raise ValueError()  # the usage line alone
    return word


def _storage(repl, kind, n):
    repl.storage_kind, repl.storage_n = kind, n
    repl.new_storage()
    return f"n-gram storage: {kind} {n}"


def _pld_params(repl, low, high, count):
    if low > high:
        raise ValueError(f"min must be <= max, got {low} > {high}")
    s = repl.settings
    s.pld_min_ngram, s.pld_max_ngram, s.pld_num_tokens = low, high, count
    return f"prompt lookup: n-grams {low} to {high}, {count} tokens"


def _ngram_save(repl, words):
    from ngram_assisted import save_storage

    force = words[1:] == ["--force"]
    if len(words) != (2 if force else 1):
        raise ValueError()  # the usage line alone
    path = parse_path(words[0])
    try:
        save_storage(repl.settings.storage, path, overwrite=force)
    except (OSError, ValueError) as error:
        message = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        hint = "; /ngram_save <file> --force overwrites it" if "left as it is" in message else ""
        raise UsageError(f"cannot save to {path}: {message}{hint}") from None
    return f"n-gram storage saved to {path}"


def _static_tier(repl, path, make):
    """Make the static n-gram tier with ``make(path)``; refused when it fails or fits another vocabulary."""
    from sampling.common import output_vocab_size

    try:
        storage = make(path)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if storage.vocab_size != output_vocab_size(repl.settings.target):
        raise UsageError(f"{path} was built for a vocabulary of {storage.vocab_size}, not this target's")
    repl.settings.static_storage = storage
    return f"static n-gram tier: {path} ({type(storage).__name__}, n={storage.n})"


def _ngram_load(repl, path):
    from ngram_assisted import load_storage

    return _static_tier(repl, path, load_storage)


def _ngram_build(repl, path):
    from ngram_assisted import build_storage
    from sampling.common import output_vocab_size

    vocab = output_vocab_size(repl.settings.target)
    return _static_tier(repl, path, lambda p: build_storage(p, repl.settings.tokenizer, repl.storage_n, repl.storage_kind, vocab))


def _pause(repl, after, steps):
    repl.settings.policy.pause_after, repl.settings.policy.pause_steps = after, steps
    return f"pause: after {after} fruitless steps, for {steps} steps" if after else "pause: off"


def _memory(repl):
    policy = repl.settings.policy
    policy.remember = not policy.remember
    if not policy.remember:
        policy.forget()
    return ("policy memory: on (drafter models' records carry over to the next prompts)" if policy.remember
            else "policy memory: off (forgotten; every prompt starts fresh)")


def _stats(repl):
    if not repl.last:
        raise UsageError("no prompt yet: /stats shows the statistics of the last prompt")
    table = Table(title="Statistics of the last prompt")
    columns = ("strategy", "tokens", "target passes", "tok/step", "drafted", "accepted", "accept", "drafting s", "verifying s", "paused")
    for column in columns:
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for strategy, r in repl.last:
        st = r.stats
        table.add_row(Text(strategy.title, style=strategy.color), str(st.generated), str(st.target_forward_passes),
                      f"{st.mean_accepted_tokens:.2f}", str(st.drafted), str(st.accepted), f"{st.acceptance_rate:.2f}",
                      f"{st.draft_seconds:.3f}", f"{st.verify_seconds:.3f}", str(st.paused_steps))
    console.print(table)
    for strategy, r in repl.last:
        if r.stats.drafted:
            rates = " ".join(f"{rate:.2f}" for rate in r.stats.per_position_acceptance)
            console.print(Text(f"{strategy.title}: acceptance by draft position: {rates}", style=strategy.color))
    policy = repl.settings.policy
    console.print(f"policy: {policy.describe(repl.settings.gamma)}"
                  + ("" if policy.remember else " · memory off: each prompt starts fresh"))


COMMANDS: Dict[str, Command] = {command.name: command for command in [
    Command("/quit", "", "quit", _quit),
    Command("/clear", "", "clear the screen", lambda repl: console.clear()),
    Command("/help", "", "this list, with the current values", _help),
    toggle("/debug", "show each speculative step in color", SETTINGS, "debug", "debug"),
    strategy_toggle("speculative", "speculative decoding with the drafter"),
    strategy_toggle("ngram", "n-gram assisted speculative decoding"),
    strategy_toggle("target", "target autoregressive"),
    strategy_toggle("drafter", "drafter autoregressive"),
    toggle("/cache", "KV cache", SETTINGS, "use_cache", "cache"),
    toggle("/chat", "apply the chat template", REPL, "chat", "chat", check=_no_template),
    number("/length", "<n>", "most new tokens", SETTINGS, "max_gen_len", f"n from {_range('length')}"),
    Command("/gamma", "<n|auto>", "most drafts per step (auto: the calibrated policy's choice)", _gamma, (_gamma_word,),
            lambda repl: "auto" if repl.settings.policy.auto else repl.settings.gamma,
            f"n from {_range('gamma')}: at most n drafts per step; auto: the calibrated policy chooses"),
    Command("/processor", "<greedy|multinomial|topk|nucleus|topknucleus> <args...>", "sampling", _processor, None,
            lambda repl: " ".join([repl.processor_name] + [f"{k}={v}" for k, v in repl.processor_args.items()])),
    Command("/set_ngramstorage", "<basic|onelevel> <n>", "n-gram storage type and n", _storage, (_storage_kind, limited("n")),
            lambda repl: f"{repl.storage_kind} {repl.storage_n}", f"n from {_range('n')}"),
    number("/top_k_filler", "<n>", "target top-k tokens added to the storage (1 = NAPD)", SETTINGS, "top_k_filler",
           f"n from {_range('top_k_filler')}"),
    toggle("/reset_in_between", "empty the n-gram storage before each prompt", REPL, "reset_in_between", "reset in between"),
    strategy_toggle("pld", "prompt lookup decoding"),
    Command("/pld_params", "<min> <max> <num_tokens>", "prompt lookup n-gram sizes, drafts", _pld_params,
            (limited("pld_ngram", "min"), limited("pld_ngram", "max"), limited("pld_num_tokens", "num_tokens")),
            lambda repl: f"{repl.settings.pld_min_ngram} {repl.settings.pld_max_ngram} {repl.settings.pld_num_tokens}",
            f"min <= max, both from {_range('pld_ngram')}; num_tokens from {_range('pld_num_tokens')}"),
    strategy_toggle("chained", "n-gram storage drafts, drafter model when it knows nothing"),
    Command("/ngram_save", "<file> [--force]", "save the n-gram storage (JSON)", _ngram_save, None,
            note="--force: overwrite a file that is not a saved storage"),
    Command("/ngram_load", "<file>", "load a storage as the static fallback tier", _ngram_load, (parse_path,),
            lambda repl: "static tier loaded" if repl.settings.static_storage is not None else ""),
    Command("/ngram_build", "<corpus file>", "build the static tier from a text file", _ngram_build, (parse_path,)),
    toggle("/adaptive", "adaptive draft length (+2 all accepted, -1 otherwise)", POLICY, "adaptive", "adaptive draft length"),
    number("/min_draft", "<n>", "drop drafts shorter than n (0 = off)", POLICY, "min_draft", f"n from {_range('min_draft')}, 0 = off"),
    number("/p_min", "<p>", "drafter model stops below this top probability (0 = off)", POLICY, "p_min", "0 <= p < 1"),
    Command("/pause", "<after> <steps>", "stop drafting after <after> fruitless steps (0 = off)", _pause,
            (limited("pause_after", "after"), limited("pause_steps", "steps")),
            lambda repl: f"{repl.settings.policy.pause_after} {repl.settings.policy.pause_steps}",
            f"after from {_range('pause_after')}, 0 = off; steps from {_range('pause_steps')}"),
    number("/min_gain", "<x>", "pause drafting while steps emit fewer than x tokens per unit of cost (0 = off)", POLICY, "min_gain",
           f"x from {_range('min_gain')}, 0 = off; 1 = drafting steps must pay for their verification pass"),
    Command("/memory", "", "the policy remembers drafter models across prompts (off forgets)", _memory,
            value=lambda repl: repl.settings.policy.remember),
    Command("/stats", "", "detailed statistics of the last prompt", _stats),
    toggle("/stream", "print tokens as they are accepted", REPL, "stream", "stream"),
]}


class Repl:
    """The REPL's state (settings and toggles); its commands are ``COMMANDS``."""

    commands = COMMANDS

    def __init__(self, settings, chat: bool, processor_name: str, processor_args: dict, seed: int):
        from strategies import STRATEGIES

        self.settings = settings
        settings.stop_if_unknown = True  # NASD as the reference's REPL runs it
        self.seed = seed
        self.chat = chat and bool(getattr(settings.tokenizer, "chat_template", None))
        self.processor_name, self.processor_args = processor_name, processor_args
        self.enabled = {s.key: False for s in STRATEGIES}
        self.enabled.update(
            speculative=settings.drafter is not None, ngram=not settings.encoder_decoder, pld=not settings.encoder_decoder, target=True
        )
        self.stream = False
        self.last: list = []  # (strategy, result) of the last prompt, for /stats
        self.storage_kind, self.storage_n = "basic", 3
        self.reset_in_between = True
        self.new_storage()
        self._warm_up()

    def new_storage(self) -> None:
        from sampling.common import output_vocab_size
        from strategies import STORAGES

        self.settings.storage = STORAGES[self.storage_kind](self.storage_n, output_vocab_size(self.settings.target))

    def _warm_up(self) -> None:
        """One short pass through each model, so that the first strategy timed pays no start-up cost."""
        from strategies import BY_KEY, run_strategy

        s = self.settings
        saved = s.max_gen_len, s.debug
        s.max_gen_len, s.debug = 2, False
        try:
            for key in ("target", "drafter") if s.drafter is not None else ("target",):
                run_strategy(BY_KEY[key], self.encode("Hi"), s, self.seed)
        finally:
            s.max_gen_len, s.debug = saved

    def value_of(self, name: str) -> str:
        """The current value of the command ``name``, as /help shows it ("" for none)."""
        value = COMMANDS[name].value(self)
        return _on(value) if isinstance(value, bool) else str(value)

    def say(self, message: str) -> None:
        console.print(Text(message, style="bold blue"))

    def handle(self, line: str) -> None:
        """One line of input: a command or a prompt. Raises EOFError on /quit."""
        line, replaced = sanitize_text(line)
        if replaced:
            self.say(replaced_line(replaced))
        if len(line) > MAX_LINE:
            raise UsageError(f"a line must be at most {MAX_LINE} characters, got {len(line)}: nothing done")
        line = line.replace("\\n", "\n").replace("\\t", "\t")
        if not line.strip():
            return
        if line.startswith("/"):
            name, *words = line.split()
            if name not in COMMANDS:
                raise UsageError(f"unknown command {name}: /help lists the commands")
            message = COMMANDS[name](self, words)
            if message:
                self.say(message)
            return
        self.compare(line)

    def encode(self, text: str) -> List[int]:
        return encode(self.settings.tokenizer, text, self.chat)

    def compare(self, text: str) -> None:
        from strategies import STRATEGIES, run_strategy

        prompt = self.encode(text)
        if not prompt:
            raise UsageError("the prompt is empty once tokenized: nothing to generate from")
        if self.settings.debug:
            self.say(f"prompt: {len(text)} characters, {len(prompt)} tokens")
        if self.reset_in_between:
            self.settings.storage.reset()
        results = []
        self.last = results
        for strategy in STRATEGIES:
            if not self.enabled[strategy.key]:
                continue
            if self.stream:
                console.rule(Text(strategy.title, style=f"bold {strategy.color}"))
                self.settings.streamer = self._streamer()
            try:
                result = run_strategy(strategy, prompt, self.settings, self.seed)
            except KeyboardInterrupt:
                console.print(Text(f"{strategy.title}: interrupted", style="red"))
                return
            except ValueError as error:
                console.print(Text(f"{strategy.title}: {error}", style="red"))
                return
            finally:
                self.settings.streamer = None
            results.append((strategy, result))
            self.print_result(strategy, result)
        if results:
            self.print_table(results)
        else:
            console.print(Text("every strategy is off: /help lists the toggles", style="red"))

    def _streamer(self):
        """Prints each step's new text; in debug mode accepted drafts green, the target's tokens blue."""
        tokenizer, generated, shown = self.settings.tokenizer, [], [""]

        def stream(tokens: List[int], n_drafted: int) -> None:
            before = len(generated)
            generated.extend(tokens)
            text = tokenizer.decode(generated, skip_special_tokens=True)
            if self.settings.debug and n_drafted:
                drafted = tokenizer.decode(generated[: before + n_drafted], skip_special_tokens=True)
                piece = Text(drafted[len(shown[0]) :], style="green") + Text(text[len(drafted) :], style="blue")
            else:
                piece = Text(text[len(shown[0]) :])
            shown[0] = text
            console.print(piece, end="")
            console.file.flush()

        return stream

    def print_result(self, strategy, result) -> None:
        if self.stream:
            console.print()
        else:
            text = self.settings.tokenizer.decode(result.tokens, skip_special_tokens=True)
            console.rule(Text(strategy.title, style=f"bold {strategy.color}"))
            console.print(Text("Out: ", style=strategy.color) + Text(text))
        line = f"{result.tokens_per_second:.1f} tokens/s · {len(result.tokens)} tokens in {result.seconds:.2f} s"
        if strategy.speculative:
            line += f" · acceptance {result.stats.acceptance_rate:.2f} · {result.stats.mean_accepted_tokens:.2f} tokens/step"
        console.print(Text(line, style=strategy.color))

    def print_table(self, results) -> None:
        baseline = next((r.tokens_per_second for s, r in results if s.key == "target"), None)
        policy = self.settings.policy
        gamma = "auto" if policy.auto else f"<= {self.settings.gamma}"
        table = Table(title=f"seed {self.seed} · gamma {gamma} · {self.value_of('/processor')} · speedup over target AR",
                      caption=f"policy: {policy.describe()}")
        for column in ("strategy", "tokens", "time (s)", "tokens/s", "speedup", "accept", "tok/step"):
            table.add_column(column, justify="left" if column == "strategy" else "right")
        for strategy, r in results:
            speedup = f"{r.tokens_per_second / baseline:.2f}x" if baseline else "-"
            spec = strategy.speculative
            table.add_row(
                Text(strategy.title, style=strategy.color), str(len(r.tokens)), f"{r.seconds:.2f}", f"{r.tokens_per_second:.1f}",
                speedup, f"{r.stats.acceptance_rate:.2f}" if spec else "-", f"{r.stats.mean_accepted_tokens:.2f}" if spec else "-",
            )
        console.print(table)

    def loop(self) -> None:
        from utils.terminal import read_line

        while True:
            try:
                line = read_line("> ")
                if line is None:
                    raise EOFError
                if line.replaced:
                    self.say(replaced_line(line.replaced))
                if line.cut:
                    raise UsageError(f"a line must be at most {MAX_LINE} characters; this one had {line.cut} more: nothing done")
                self.handle(line.text)
            except UsageError as error:
                console.print(Text(str(error), style="red"))
            except KeyboardInterrupt:
                console.print(Text("\n(Ctrl-D or /quit to exit)", style="dim"))
            except EOFError:
                console.print("Goodbye!")
                return
            except Exception as error:  # a failure no check foresaw: one line, and the session goes on
                console.print(Text(f"failed: {first_line(error)} (a bug: please report it)", style="red"))



class OneLineParser(argparse.ArgumentParser):
    """Bad flags: one line (what is wrong and what is accepted) and exit status 1, no usage block."""

    def error(self, message):
        fail(f"{message} (python infer.py --help lists the flags)")


def gamma_flag(text: str):
    """``--gamma``: ``auto``, or a number in /gamma's range."""
    return "auto" if text == "auto" else flag_type("--gamma", "gamma")(text)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description="Compare decoding strategies side by side (speculative, n-gram assisted, autoregressive).")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a known model pair; other flags override it")
    add_shared_flags(parser)
    parser.add_argument("--drafter-device", help="device of the drafter (default: --device)")
    parser.add_argument("--quantize", choices=["none", "int8", "int4"], help="quantize the target's weights: on CPU weight-only int8/int4 kernels "
                        "(bfloat16 activations; int4 keeps the output head int8); on CUDA bitsandbytes, else optimum-quanto")
    parser.add_argument("--drafter-quantize", choices=["none", "int8", "int4"], help="quantize the drafter's weights (default: --quantize)")
    parser.add_argument("--gamma", type=gamma_flag, default=4, help="most drafts per step, or auto for the calibrated policy's choice (default 4)")
    parser.add_argument("--length", type=flag_type("--length", "length"), default=35, help="most new tokens (default 35)")
    parser.add_argument("--prompt", help="run one comparison on this prompt and exit")
    return parser


def fail(message: str) -> None:
    console.print(Text(f"error: {message}", style="bold red"))
    sys.exit(1)


def say(text: str, style: str = "") -> None:
    """A start-up line, for ``session``."""
    console.print(Text(text, style=style))


def main(argv: Optional[List[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset or "embedded"]
    for key in ("target", "drafter", "device", "quantize"):
        if getattr(args, key) is None and key in preset:
            setattr(args, key, preset[key])
    args.quantize = args.quantize or "none"
    try:
        processor, processor_name, processor_args = read_processor(args.processor, args.gamma == "auto", not args.no_calibrate)
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
    try:
        pair = load_pair(args.target, args.drafter, args.device, args.drafter_device, args.dtype, args.quantize,
                         args.drafter_quantize, args.trust_remote_code, args.cache, args.prepack == "on", say)
    except SetupError as error:
        fail(str(error))
    console.print(Text("Target: ", style="bold") + Text(describe(pair.target, pair.target_label, pair.quantize)))
    if pair.drafter is None:
        console.print("[bold]Drafter:[/bold] none (speculative decoding off; start with --drafter MODEL to compare it)")
    else:
        console.print(Text("Drafter: ", style="bold") + Text(describe(pair.drafter, pair.drafter_label, pair.drafter_quantize)))
    settings = build_settings(pair, processor, args.gamma, args.length, not args.no_calibrate, say=say)
    if not args.no_calibrate:
        console.print(f"[bold]Policy:[/bold] {settings.policy.describe(settings.gamma)}")
    repl = Repl(settings, not args.no_chat, processor_name, processor_args, args.seed)
    if args.prompt is not None:
        try:
            repl.compare(args.prompt)
        except UsageError as error:
            fail(str(error))
        return
    console.print("Type a prompt, or /help for the commands.")
    repl.loop()


class InferenceCLI:
    """The reference's entry point, ``InferenceCLI(device="cuda")``: loads the reference's model pair
    (``--preset reference``: Llama-3.2-3B-Instruct target, Llama-3.2-1B-Instruct drafter, int8)
    on ``device`` and runs the REPL until /quit."""

    def __init__(self, device: str = "cuda"):
        self.device = device
        main(["--preset", "reference", "--device", device])


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
