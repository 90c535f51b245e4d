"""The REPL: its state (the run's config and context, and toggles), one line at a time (a /command or a prompt), each
enabled strategy run on a prompt, their results, the table, and the divergences explained."""
from typing import List, Optional, Sequence

from rich.table import Table
from rich.text import Text

from app.repl.commands import COMMANDS, on_off, suffix_memory_line
from app.repl.rounds import divergence_lines, run_rounds, summary
from app.session import encode, first_line
from utils.parsing import MAX_LINE, UsageError, parse_processor, sanitize_text
from utils.printing import console, screen  # the one screen the REPL, the debug view and the stream share


# the REPL's n-gram storage: n 8 (contexts of 1 to 7 tokens, the longest known first). The reference's REPL
# used 3; on the pair's code-editing prompts a 2-token context cut copies short where a longer one
# told them apart, and the matched length (each draft's evidence) tells a copy from a guess
# (docs/profile.md, "NASD's passes on the pair"); /set_ngramstorage changes it
NGRAM_N = 8
# the rows that run under gamma auto when no gamma was given (``RunConfig.auto_rows``; an explicit --gamma or
# /gamma gives every row that bound): on the pair's code-editing prompts NASD's gamma 4 cut copies of 15-25
# tokens short, and auto took 2-3 passes fewer in float32, 1-2 in bfloat16 (scripts/nasd_replay.py; docs/reference.md).
# The speculative row too: the pair's drafter is accepted at 0.9-0.96 on them, and its verification passes cost about
# one position's up to 8-12, so gamma 4 paid a pass every ~4 tokens where auto pays one every ~6 (scripts/pair_step.py)
AUTO_ROWS = ("speculative", "ngram")


def kernels_caption(results) -> str:
    """What the table's caption adds when rows ran on different kernels (``--prepack auto``): each
    option with its rows, e.g. " · linears: own (Target AR) · prepacked (N-gram assisted, Prompt lookup)"."""
    by_option: dict = {}
    for strategy, r in results:
        by_option.setdefault(r.kernels or "-", []).append(strategy.title)
    if len(by_option) < 2:
        return ""
    return " · linears: " + " · ".join(f"{option} ({', '.join(titles)})" for option, titles in by_option.items())


def replaced_line(count: int) -> str:
    return f"{count} byte{'s' if count != 1 else ''} that {'are' if count != 1 else 'is'} not UTF-8 " \
           f"{'were' if count != 1 else 'was'} replaced by \ufffd"


class Repl:
    """The REPL's state: the run's values (``config``, a ``configuration.RunConfig``, replaced by the
    commands that change one) and live objects (``context``), and its toggles; its commands are ``COMMANDS``."""

    commands = COMMANDS

    def __init__(self, config, context, chat: bool, seed: int, startup: Sequence[str] = (), rounds: int = 1):
        """``startup``: the start-up lines in full (each model's, the measurements), for /stats; ``rounds``: the
        interleaved rounds of each comparison (``app.repl.rounds``; /rounds)."""
        from strategies import STRATEGIES

        self.config = config.with_(stop_if_unknown=True)  # NASD as the reference's REPL runs it
        self.context = context
        self.seed = seed
        self.chat = chat and bool(getattr(context.tokenizer, "chat_template", None))
        self.enabled = {s.key: False for s in STRATEGIES}
        self.enabled.update(
            speculative=context.drafter is not None, ngram=not context.encoder_decoder, pld=not context.encoder_decoder, target=True,
            eagle=context.head is not None,
        )
        self.stream = False
        self.rounds = rounds
        self.last: list = []  # (strategy, result) of the last prompt, for /stats
        self.startup = tuple(startup)  # the start-up lines in full, for /stats
        self.passes: dict = {}  # strategy key -> the target passes of its last run (sampling.divergence)
        self.storage_kind, self.storage_n = "basic", NGRAM_N
        self.reset_in_between = True
        self.new_storage()
        from sampling import SuffixMemory
        from runners.limits import output_vocab_size

        self.suffix_memory = SuffixMemory(self.config.param("max_tree_depth"), output_vocab_size(context.target))  # /suffix_global
        self._warm_up()

    @property
    def processor_name(self) -> str:
        """The sampling's name, read from the config (``/processor`` replaces it): one place for it."""
        return parse_processor(self.config.processor.split())[1]

    @property
    def processor_args(self) -> dict:
        """The sampling's values by name, read from the config."""
        return parse_processor(self.config.processor.split())[2]

    def new_storage(self) -> None:
        from runners.limits import output_vocab_size
        from strategies import STORAGES

        self.context.storage = STORAGES[self.storage_kind](self.storage_n, output_vocab_size(self.context.target))

    def _warm_up(self) -> None:
        """One short pass through each model, so that the first strategy timed pays no start-up cost; and the
        drafter's output rows (``--drafter-head``: ``kernels.head_rows``, kept for every later runner) made here,
        not in the first drafting row's first pass: on the pair, 73 MB zeroed and copied, 35-60 ms (noisy) that
        only the row timed first paid. Nothing a policy remembers is touched: no drafting row runs."""
        from drafters.model import drafted_rows
        from runners import make_runner
        from strategies import BY_KEY, run_strategy

        short = self.config.with_(max_gen_len=2, debug=False)
        for key in ("target", "drafter") if self.context.drafter is not None else ("target",):
            run_strategy(BY_KEY[key], self.encode("Hi"), short, self.context, self.seed)
        drafting = self.config.drafting_runner
        if self.context.drafter is not None and drafting.drafter_head:
            drafted_rows(make_runner(self.context.drafter, True, config=drafting), drafting.drafter_head)

    def value_of(self, name: str) -> str:
        """The current value of the command ``name``, as /help shows it ("" for none)."""
        value = COMMANDS[name].value(self)
        return on_off(value) if isinstance(value, bool) else str(value)

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
        return encode(self.context.tokenizer, text, self.chat)

    def compare(self, text: str) -> None:
        from strategies import STRATEGIES

        prompt = self.encode(text)
        if not prompt:
            raise UsageError("the prompt is empty once tokenized: nothing to generate from")
        if self.config.debug:
            self.say(f"prompt: {len(text)} characters, {len(prompt)} tokens")
        if self.reset_in_between:
            self.context.storage.reset()
        results = []
        self.last = results
        enabled = [strategy for strategy in STRATEGIES if self.enabled.get(strategy.key, False)]
        self.ready(enabled, len(prompt))
        every = run_rounds(self, enabled, prompt, results)
        if every is None:
            return
        if results:
            cells, legend = summary(every) if len(every) > 1 else (None, "")
            self.print_table(results, cells)
            if legend:
                console.print(Text(legend, style="dim"))
            self.explain_divergences(prompt, results)
            if self.processor_name == "greedy":
                for line in divergence_lines(every):
                    console.print(Text(line, style="bold red"))
        else:
            console.print(Text("every strategy is off: /help lists the toggles", style="red"))

    def ready(self, enabled, prompt_length: int) -> None:
        """Before any row is timed on this prompt: on the compiled step (CUDA), build the graphs the enabled rows will
        need, a line each (nothing when they are built already); on the C step (CPU), grow each model's scratch to
        this prompt's passes (``app.steps.reserve_scratch``: else the first row of round 1 grew it)."""
        from app.steps import drafts_with_head, ready
        from strategies import row_config

        context, runners = self.context, {"target": self.config.runner, "drafter": self.config.drafter_runner}
        head = context.head if any(drafts_with_head(strategy) for strategy in enabled) else None
        seconds = ready(context.target, context.drafter, runners, [(strategy, row_config(strategy, self.config)) for strategy in enabled],
                        prompt_length, prompt_length + self.config.max_gen_len, lambda text: console.print(Text(text, style="dim")),
                        head)
        if seconds:
            console.print(Text(f"Compiled in {seconds:.1f} s (outside every timed run)", style="dim"))

    def run(self, strategy, prompt: List[int], results: list, quiet: bool = False) -> bool:
        """Run one strategy, print its result and add it to ``results``; False when it was interrupted or refused.
        ``quiet`` (a later round): nothing streamed or printed, and its passes not kept for the divergences. One-time
        work done inside the run (``kernels.once``: a race, a C step made, its scratch grown) is named in a line each."""
        from kernels import once
        from sampling.divergence import PassRecorder
        from strategies import run_strategy

        recorder = PassRecorder()  # every round records its passes: the rounds' runs cost alike
        if not quiet:
            self.passes[strategy.key] = recorder.passes
        self.context.streamer = recorder
        if self.stream and not quiet:
            console.rule(Text(self.title(strategy), style=f"bold {strategy.color}"))
            self.context.streamer = (self._streamer(), recorder)
        started = once.count()
        try:
            result = run_strategy(strategy, prompt, self.config, self.context, self.seed)
        except (KeyboardInterrupt, ValueError) as error:
            screen.end_line()  # a stream may have left the line open
            console.print(Text(f"{strategy.title}: {error if isinstance(error, ValueError) else 'interrupted'}", style="red"))
            return False
        finally:
            self.context.streamer = None
        screen.end_line()
        results.append((strategy, result))
        if not quiet:
            self.print_result(strategy, result)
        for event in once.since(started):  # the warm-up and ``ready`` do it all: a line here is a bug to report
            console.print(Text(f"{strategy.title}: one-time work inside its timed run: {event.kind}, {event.what} "
                               f"({event.seconds * 1e3:.1f} ms)", style="yellow"))
        return True

    def explain_divergences(self, prompt: List[int], results) -> None:
        """Greedy: one line for each strategy whose tokens differ from target AR's, saying whether
        the difference is a rounding near-tie or a disagreement (``sampling.divergence``)."""
        from sampling.divergence import NEAR_TIE, classify_divergence, on_kernels
        from runners import make_runner

        runner, use_cache = self.config.runner, self.config.use_cache  # the runner the strategies ran: /cache, --compile
        replayed = lambda model: make_runner(model, use_cache, config=runner)  # noqa: E731
        reference, kernels = next(((r.tokens, r.kernels) for s, r in results if s.baseline), (None, ""))
        if self.processor_name != "greedy" or self.context.encoder_decoder or reference is None:
            return
        for strategy, result in results:
            if strategy.baseline or strategy.drafter_ar or result.tokens == reference:
                continue
            found = classify_divergence(self.context.target, prompt, reference, result.tokens, self.passes[strategy.key],
                                        on_kernels(replayed, kernels), on_kernels(replayed, result.kernels))
            console.print(Text(f"{strategy.title}: {found.line()}", style="yellow" if found.verdict == NEAR_TIE else "bold red"))

    def _streamer(self):
        """Prints each step's new text; in debug mode accepted drafts green, the target's tokens blue."""
        tokenizer, generated, shown = self.context.tokenizer, [], [""]

        def stream(tokens: List[int], n_drafted: int) -> None:
            before = len(generated)
            generated.extend(tokens)
            text = tokenizer.decode(generated, skip_special_tokens=True)
            if self.config.debug and n_drafted:
                drafted = tokenizer.decode(generated[: before + n_drafted], skip_special_tokens=True)
                piece = Text(drafted[len(shown[0]) :], style="green") + Text(text[len(drafted) :], style="blue")
            else:
                piece = Text(text[len(shown[0]) :])
            shown[0] = text
            screen.inline(piece)

        return stream

    def title(self, strategy) -> str:
        """``strategy``'s title, with the setting its row runs under when it is its own (``row_setting``:
        "N-gram assisted (gamma auto)"): a label says what ran."""
        from strategies import row_setting

        setting = row_setting(strategy, self.config)
        return f"{strategy.title} ({setting})" if setting else strategy.title

    def print_result(self, strategy, result) -> None:
        if not self.stream:
            text = self.context.tokenizer.decode(result.tokens, skip_special_tokens=True)
            console.rule(Text(self.title(strategy), style=f"bold {strategy.color}"))
            console.print(Text("Out: ", style=strategy.color) + Text(text))
        line = f"{result.tokens_per_second:.1f} tokens/s · {len(result.tokens)} tokens in {result.seconds:.2f} s"
        if strategy.speculative:
            line += f" · acceptance {result.stats.acceptance_rate:.2f} · {result.stats.mean_accepted_tokens:.2f} tokens/step"
        if result.stats.accepted_by:  # a merged tree: which source each accepted draft came from
            shares = sorted(result.stats.accepted_by.items(), key=lambda item: -item[1])
            line += " · accepted by source: " + ", ".join(f"{source} {count}" for source, count in shares)
        console.print(Text(line, style=strategy.color))

    def print_table(self, results, cells: Optional[dict] = None) -> None:
        """The comparison's table; ``cells``: strategy key -> its (time, tokens/s, speedup) over rounds
        (``app.repl.rounds.summary``), else ``results``' own."""
        from strategies import auto_rows_line

        baseline = next((r.tokens_per_second for s, r in results if s.key == "target"), None)
        policy = self.context.policy(self.config)
        own = auto_rows_line([s for s, _ in results], self.config)  # rows under gamma auto of their own
        gamma = "auto" if policy.auto else f"<= {self.config.gamma}" + (f" ({own})" if own else "")
        caption = f"policy: {policy.describe()}" + (f" · {suffix_memory_line(self)}" if self.enabled["suffix"] or self.enabled["tree_suffix"] else "")
        table = Table(title=f"seed {self.seed} · gamma {gamma} · {self.value_of('/processor')} · speedup over target AR",
                      caption=caption + kernels_caption(results))
        for column in ("strategy", "tokens", "time (s)", "tokens/s", "speedup", "accept", "tok/step"):
            table.add_column(column, justify="left" if column == "strategy" else "right")
        for strategy, r in results:
            speedup = f"{r.tokens_per_second / baseline:.2f}x" if baseline else "-"
            time, rate, speedup = cells[strategy.key] if cells else (f"{r.seconds:.2f}", f"{r.tokens_per_second:.1f}", speedup)
            spec = strategy.speculative
            table.add_row(
                Text(self.title(strategy), style=strategy.color), str(len(r.tokens)), time, rate,
                speedup, f"{r.stats.acceptance_rate:.2f}" if spec else "-", f"{r.stats.mean_accepted_tokens:.2f}" if spec else "-",
            )
        console.print(table)

    def loop(self) -> None:
        from utils.terminal import ctrl_c_interrupts, read_line

        ctrl_c_interrupts()
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
