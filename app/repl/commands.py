"""The REPL's commands, one table: each entry says how /help shows the command, how its words
are read, what it does and the value /help shows. ``app.repl.repl.Repl`` dispatches through ``COMMANDS``;
/help, the usage lines of refusals and the shown values are all drawn from it. A command sees the
REPL as a ``ReplState`` (``app.repl.state``): this module does not import the REPL."""
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from rich.table import Table
from rich.text import Text

from app.repl.state import POLICY, REPL, SETTINGS, Owner, ReplState
from app.repl.stats import _stats, own_gamma_line, suffix_memory_line  # noqa: F401 (suffix_memory_line: importable from here, as before)
from utils.parsing import LIMITS, UsageError, parse_float, parse_int, parse_limited, parse_path, parse_processor
from utils.printing import console


def _range(key: str) -> str:
    low, high = LIMITS[key]
    return f"{low} to {high}"


def on_off(value: bool) -> str:
    return "on" if value else "off"


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
    value: Callable[[ReplState], Any] = lambda repl: ""  # shown by /help
    note: str = ""  # the accepted values, after the usage line of a refusal

    @property
    def usage(self) -> str:
        return f"{self.name} {self.args}".strip()

    def refusal(self, message: str = "") -> UsageError:
        line = f"usage: {self.usage}" + (f"   ({self.note})" if self.note else "")
        return UsageError(f"{message}; {line}" if message else line)

    def __call__(self, repl: ReplState, words: List[str]) -> Optional[str]:
        """Read ``words`` and apply them to ``repl``; returns the line to say."""
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


def limited(key: str, name: str | None = None) -> Callable[[str], Any]:
    """A word parser for the setting ``key`` of ``utils.parsing.LIMITS``."""
    return lambda word: parse_limited(word, name or key, key)


def toggle(name: str, what: str, owner: Owner, attribute: str, label: str, check: Callable | None = None) -> Command:
    """A command without words that turns ``attribute`` of ``owner`` on or off (after ``check(repl)``)."""
    def run(repl):
        if check is not None:
            check(repl)
        owner.set(repl, attribute, not owner.get(repl, attribute))
        return f"{label}: {on_off(owner.get(repl, attribute))}"

    return Command(name, "", what, run, value=lambda repl: owner.get(repl, attribute))


def strategy_toggle(key: str, what: str) -> Command:
    """``/key``: run the strategy ``key`` on each prompt, or not."""
    def run(repl):
        from strategies import BY_KEY

        strategy = BY_KEY[key]
        if strategy.needs_drafter and repl.context.drafter is None:
            raise UsageError("no drafter loaded: restart with --drafter MODEL (a Hub id, a local folder or a GGUF file)")
        if strategy.needs_head and repl.context.head is None:
            raise UsageError("no draft head loaded: restart with --head PATH (a speculators or EAGLE-3 head folder)")
        if strategy.decoder_only and repl.context.encoder_decoder:
            raise UsageError(f"{strategy.title} works with decoder-only models only")
        if strategy.trees and not repl.enabled.get(key, False):
            from runners import tree_unsupported

            reason = tree_unsupported(repl.context.target)
            if reason is not None:
                raise UsageError(f"{strategy.title}: {reason}")
        repl.enabled[key] = not repl.enabled.get(key, False)
        return f"{strategy.title}: {on_off(repl.enabled[key])}"

    return Command(f"/{key}", "", what, run, value=lambda repl: repl.enabled.get(key, False))


def number(name: str, args: str, what: str, owner: Owner, attribute: str, note: str) -> Command:
    """``/key <value>``: one number within the range of ``key`` (the name without its slash)."""
    key = name[1:]

    def run(repl, value):
        owner.set(repl, attribute, value)
        return f"{key}: {value}"

    return Command(name, args, what, run, (limited(key),), lambda repl: owner.get(repl, attribute), note)


def _quit(repl):
    raise EOFError


def _help(repl):
    console.print(Text("Commands", style="bold"))
    for command in COMMANDS.values():
        now = repl.value_of(command.name)
        line = Text(f"  {command.usage:<40}", style="bold") + Text(f" {command.what}")
        console.print(line + Text(f"  [{now}]", style="cyan") if now else line)
    console.print("Anything else is a prompt (\\n and \\t become newline and tab).")
    from measure import versions_line

    console.print(Text("Versions: ", style="bold") + Text(versions_line()))


def _no_template(repl):
    if not repl.chat and not getattr(repl.context.tokenizer, "chat_template", None):
        raise UsageError("this tokenizer has no chat template")


def _gamma_word(word: str):
    return "auto" if word == "auto" else parse_limited(word, "gamma")


def _gamma(repl, value):
    policy = repl.config.policy
    if value == "auto":
        if policy.row_costs is None and not policy.calibration:
            raise UsageError("/gamma auto needs the measured verification costs: restart without --no-calibrate")
        if policy.row_costs is None:
            raise UsageError("/gamma auto needs plausible verification costs, and those measured at start-up were not")
        repl.config = repl.config.with_(auto_rows=()).with_policy(auto=True)
        return f"gamma: auto (cost-optimal, up to {repl.config.policy.bound()} drafts per step)"
    repl.config = repl.config.with_(gamma=value, auto_rows=()).with_policy(auto=False)  # every row, NASD's own default too
    return f"gamma: {value} (at most {value} drafts per step)"


def _processor(repl, words):
    parse_processor(words)  # a malformed one is refused with its usage line
    repl.config = repl.config.with_(processor=" ".join(words))
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
    repl.config = repl.config.with_(pld_min_ngram=low, pld_max_ngram=high, pld_num_tokens=count)
    return f"prompt lookup: n-grams {low} to {high}, {count} tokens"


def _path_and_force(words) -> Tuple[str, bool]:
    """``PATH [--force]``: the path read, and whether an existing file may be overwritten."""
    force = words[1:] == ["--force"]
    if len(words) != (2 if force else 1):
        raise ValueError()  # the usage line alone
    return parse_path(words[0]), force


def _ngram_save(repl, words):
    from ngram_assisted import save_storage

    path, force = _path_and_force(words)
    try:
        save_storage(repl.context.storage, path, overwrite=force)
    except (OSError, ValueError) as error:
        message = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        hint = "; /ngram_save <file> --force overwrites it" if "left as it is" in message else ""
        raise UsageError(f"cannot save to {path}: {message}{hint}") from None
    return f"n-gram storage saved to {path}"


def _static_tier(repl, path, make):
    """Make the static n-gram tier with ``make(path)``; refused when it fails or fits another vocabulary."""
    from runners.limits import output_vocab_size

    try:
        storage = make(path)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if storage.vocab_size != output_vocab_size(repl.context.target):
        raise UsageError(f"{path} was built for a vocabulary of {storage.vocab_size}, not this target's")
    repl.context.static_storage = storage
    return f"static n-gram tier: {path} ({type(storage).__name__}, n={storage.n})"


def _ngram_load(repl, path):
    from ngram_assisted import load_storage

    return _static_tier(repl, path, load_storage)


def _ngram_build(repl, path):
    from ngram_assisted import build_storage
    from runners.limits import output_vocab_size

    vocab = output_vocab_size(repl.context.target)
    return _static_tier(repl, path, lambda p: build_storage(p, repl.context.tokenizer, repl.storage_n, repl.storage_kind, vocab))


def _suffix_params(repl, depth, most, factor, offset, min_prob):
    from drafters.suffix import SuffixSettings

    settings = SuffixSettings(depth, most, factor, offset, min_prob)
    repl.config = repl.config.with_(**settings.arguments())
    repl.suffix_memory.set_depth(depth)
    return f"suffix: {settings.describe()}"


def _suffix_global(repl):
    x = repl.context
    x.suffix_memory = None if x.suffix_memory is not None else repl.suffix_memory
    return f"suffix global memory: {on_off(x.suffix_memory is not None)} ({repl.suffix_memory.describe()})"


def _suffix_reset(repl):
    repl.suffix_memory.reset()
    return f"suffix global memory: emptied ({repl.suffix_memory.describe()})"


def _suffix_save(repl, words):
    path, force = _path_and_force(words)
    try:
        repl.suffix_memory.save(path, overwrite=force)
    except (OSError, ValueError) as error:
        message = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        hint = "; /suffix_save <file> --force overwrites it" if "left as it is" in message else ""
        raise UsageError(f"cannot save to {path}: {message}{hint}") from None
    return f"suffix global memory saved to {path} ({repl.suffix_memory.describe()})"


def _suffix_load(repl, path):
    try:
        repl.suffix_memory.load(path)
    except ValueError as error:
        raise UsageError(str(error)) from None
    repl.config = repl.config.with_(max_tree_depth=repl.suffix_memory.max_depth)
    state = "on" if repl.context.suffix_memory is not None else "off: /suffix_global turns it on"
    return f"suffix global memory loaded from {path}: {repl.suffix_memory.describe()} ({state})"


def _pause(repl, after, steps):
    repl.config = repl.config.with_policy(pause_after=after, pause_steps=steps)
    return f"pause: after {after} fruitless steps, for {steps} steps" if after else "pause: off"


def _memory(repl):
    remember = not repl.config.policy.remember
    repl.config = repl.config.with_policy(remember=remember)
    if not remember:
        repl.context.policy_memory.clear()
    return ("policy memory: on (drafter models' records carry over to the next prompts)" if remember
            else "policy memory: off (forgotten; every prompt starts fresh)")


def param_command(param) -> Command:
    """``/name <value>`` for a strategy row's ``Param``: within ``LIMITS[name]``, into the config's parameters."""
    def run(repl, value):
        repl.config = repl.config.with_(**{param.name: value})
        return f"{param.name}: {value}"

    return Command(f"/{param.name}", "<n>" if param.type is int else "<x>", param.help or param.name, run,
                   (limited(param.name),), lambda repl: repl.config.param(param.name),
                   f"{'n' if param.type is int else 'x'} from {_range(param.name)} (default {param.default})")


def toggle_line(strategy) -> str:
    """A row's toggle line in /help: its ``help``, else its title and what its fields say it drafts and needs."""
    needs = [flag for flag, needed in (("--drafter", strategy.needs_drafter), ("--head", strategy.needs_head)) if needed]
    return strategy.help or (strategy.title + ("; a tree a step, verified in one pass" if strategy.trees else "")
                             + (f"; needs {' and '.join(needs)}" if needs else ""))


def row_commands(strategy) -> List[Command]:
    """A row's commands: its toggle ``/key`` and one command per parameter."""
    return [strategy_toggle(strategy.key, toggle_line(strategy))] + [param_command(p) for p in strategy.params]


class CommandTable(Mapping):
    """The built-in commands and, after ``rows_after``, those of every strategy row (``row_commands``),
    read from ``strategies.STRATEGIES`` at each lookup: a row of the table, or one added by
    ``strategies.register``, has its toggle and parameter commands. A built-in name wins."""

    def __init__(self, built_in: Dict[str, Command], rows_after: str):
        self.built_in, self.rows_after = built_in, rows_after

    def _all(self) -> Dict[str, Command]:
        from strategies import STRATEGIES

        table = {}
        for name, command in self.built_in.items():
            table[name] = command
            if name == self.rows_after:
                table.update((c.name, c) for strategy in STRATEGIES for c in row_commands(strategy) if c.name not in self.built_in)
        return table

    def __getitem__(self, name: str) -> Command:
        return self.built_in[name] if name in self.built_in else self._all()[name]

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


# the commands that are not a strategy row's (those come from the strategies' table: ``CommandTable``)
BUILT_IN: Dict[str, Command] = {command.name: command for command in [
    Command("/quit", "", "quit", _quit),
    Command("/clear", "", "clear the screen", lambda repl: console.clear()),
    Command("/help", "", "this list, with the current values", _help),
    toggle("/debug", "show each speculative step in color", SETTINGS, "debug", "debug"),
    toggle("/cache", "KV cache", SETTINGS, "use_cache", "cache"),
    toggle("/chat", "apply the chat template", REPL, "chat", "chat", check=_no_template),
    number("/length", "<n>", "most new tokens", SETTINGS, "max_gen_len", f"n from {_range('length')}"),
    Command("/gamma", "<n|auto>", "most drafts per step (auto: the calibrated policy's choice)", _gamma, (_gamma_word,),
            lambda repl: "auto" if repl.config.policy.auto else " · ".join(filter(None, (str(repl.config.gamma), own_gamma_line(repl)))),
            f"n from {_range('gamma')}: at most n drafts per step; auto: the calibrated policy chooses"),
    Command("/processor", "<greedy|multinomial|topk|nucleus|topknucleus> <args...>", "sampling", _processor, None,
            lambda repl: " ".join([repl.processor_name] + [f"{k}={v}" for k, v in repl.processor_args.items()])),
    Command("/set_ngramstorage", "<basic|onelevel> <n>", "n-gram storage type and n", _storage, (_storage_kind, limited("n")),
            lambda repl: f"{repl.storage_kind} {repl.storage_n}", f"n from {_range('n')}"),
    number("/top_k_filler", "<n>", "target top-k tokens added to the storage (1 = NAPD)", SETTINGS, "top_k_filler",
           f"n from {_range('top_k_filler')}"),
    toggle("/reset_in_between", "empty the n-gram storage before each prompt", REPL, "reset_in_between", "reset in between"),
    Command("/pld_params", "<min> <max> <num_tokens>", "prompt lookup n-gram sizes, drafts", _pld_params,
            (limited("pld_ngram", "min"), limited("pld_ngram", "max"), limited("pld_num_tokens", "num_tokens")),
            lambda repl: " ".join(str(repl.config.param(f"pld_{name}")) for name in ("min_ngram", "max_ngram", "num_tokens")),
            f"min <= max, both from {_range('pld_ngram')}; num_tokens from {_range('pld_num_tokens')}"),
    number("/tree_size", "<n>", "most nodes of a draft tree (the calibrated policy keeps those that pay)", SETTINGS, "tree_size",
           f"n from {_range('tree_size')}"),
    Command("/ngram_save", "<file> [--force]", "save the n-gram storage (JSON)", _ngram_save, None,
            note="--force: overwrite a file that is not a saved storage"),
    Command("/ngram_load", "<file>", "load a storage as the static fallback tier", _ngram_load, (parse_path,),
            lambda repl: "static tier loaded" if repl.context.static_storage is not None else ""),
    Command("/ngram_build", "<corpus file>", "build the static tier from a text file", _ngram_build, (parse_path,)),
    Command("/suffix_params", "<depth> <max_tokens> <factor> <offset> <min_prob>",
            "suffix tree depth; drafts <= min(max_tokens, factor x match + offset), none below min_prob", _suffix_params,
            (lambda w: parse_int(w, "depth", 1, 64), lambda w: parse_int(w, "max_tokens", 1, 128),
             lambda w: parse_float(w, "factor", 0.0, 64.0), lambda w: parse_float(w, "offset", -64.0, 64.0),
             lambda w: parse_float(w, "min_prob", 0.0, 1.0)),
            lambda repl: " ".join(f"{v:g}" for v in repl.config.suffix.arguments().values()),
            "depth 1 to 64, max_tokens 1 to 128, factor 0 to 64, offset -64 to 64, min_prob 0 to 1 (defaults 24 24 1 0 0.1)"),
    Command("/suffix_global", "", "suffix drafting also matches a global tree over earlier outputs", _suffix_global,
            value=lambda repl: repl.context.suffix_memory is not None),
    Command("/suffix_reset", "", "empty the global suffix memory", _suffix_reset, value=lambda repl: repl.suffix_memory.describe()),
    Command("/suffix_save", "<file> [--force]", "save the global suffix memory (JSON)", _suffix_save, None,
            note="--force: overwrite a file that is not a saved suffix memory"),
    Command("/suffix_load", "<file>", "load a saved global suffix memory (replaces it)", _suffix_load, (parse_path,)),
    toggle("/adaptive", "adaptive draft length (+2 all accepted, -1 otherwise)", POLICY, "adaptive", "adaptive draft length"),
    number("/min_draft", "<n>", "drop drafts shorter than n (0 = off)", POLICY, "min_draft", f"n from {_range('min_draft')}, 0 = off"),
    number("/p_min", "<p>", "drafter model stops below this top probability (0 = off)", POLICY, "p_min", "0 <= p < 1"),
    Command("/pause", "<after> <steps>", "stop drafting after <after> fruitless steps (0 = off)", _pause,
            (limited("pause_after", "after"), limited("pause_steps", "steps")),
            lambda repl: f"{repl.config.policy.pause_after} {repl.config.policy.pause_steps}",
            f"after from {_range('pause_after')}, 0 = off; steps from {_range('pause_steps')}"),
    number("/min_gain", "<x>", "pause drafting while steps emit fewer than x tokens per unit of cost (0 = off)", POLICY, "min_gain",
           f"x from {_range('min_gain')}, 0 = off; 1 = drafting steps must pay for their verification pass"),
    Command("/memory", "", "the policy remembers drafter models across prompts (off forgets)", _memory,
            value=lambda repl: repl.config.policy.remember),
    Command("/stats", "", "the start-up measurements in full, and detailed statistics of the last prompt", _stats),
    toggle("/stream", "print tokens as they are accepted", REPL, "stream", "stream"),
    number("/rounds", "<n>", "run the rows n times, in order then reversed (ABBA); the table: medians, intervals", REPL, "rounds",
           f"n from {_range('rounds')}"),
]}
COMMANDS = CommandTable(BUILT_IN, rows_after="/debug")  # /help: the strategy rows' toggles after /debug
