"""Interactive comparison of decoding strategies on the same prompt and seed.

    python infer.py                      # the embedded SmolLM2-135M-Instruct, offline
    python infer.py --target T --drafter D --device cuda
    echo "a prompt" | python infer.py    # or --prompt "a prompt": one comparison, then exit

Type a prompt to run every enabled strategy on it, or a /command (see /help).
"""
import argparse
import os
import sys
from typing import Callable, Dict, List, Optional

from rich.console import Console
from rich.table import Table
from rich.text import Text

from utils.parsing import LIMITS, MAX_LINE, flag_type, parse_limited, parse_path, sanitize_text

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


class UsageError(ValueError):
    """A malformed command: one line of usage, settings unchanged."""


def _processors():
    from utils.logits_processor import (
        GreedyProcessor,
        MultinomialProcessor,
        NucleusProcessor,
        TopKNucleusProcessor,
        TopKProcessor,
    )

    return {
        "greedy": (GreedyProcessor, [("temperature", float)]),
        "multinomial": (MultinomialProcessor, [("temperature", float)]),
        "topk": (TopKProcessor, [("temperature", float), ("top_k", int)]),
        "nucleus": (NucleusProcessor, [("temperature", float), ("top_p", float)]),
        "topknucleus": (TopKNucleusProcessor, [("temperature", float), ("top_k", int), ("top_p", float)]),
    }


def parse_processor(words: List[str]):
    """``["topk", "0.7", "50"]`` -> a processor; UsageError with the usage line otherwise."""
    processors = _processors()
    usage = "usage: /processor <" + "|".join(processors) + "> <args...>"
    if not words or words[0] not in processors:
        raise UsageError(usage if not words else f"unknown processor '{words[0]}'; {usage}")
    cls, params = processors[words[0]]
    names = " ".join(f"<{name}>" for name, _ in params)
    line = f"usage: /processor {words[0]} {names}"
    values = words[1:]
    if words[0] == "greedy" and not values:
        values = ["1"]
    if len(values) != len(params):
        raise UsageError(line)
    try:
        kwargs = {name: parse_limited(value, name) for (name, _), value in zip(params, values)}
        return cls(**kwargs), words[0], kwargs
    except ValueError as error:
        raise UsageError(f"{error}; {line}") from None


def parse_setting(words: List[str], usage: str, key: str, name: str | None = None):
    """One value of the setting ``key`` of ``utils.parsing.LIMITS``; UsageError otherwise."""
    if len(words) != 1:
        raise UsageError(usage)
    try:
        return parse_limited(words[0], name or key, key)
    except ValueError as error:
        raise UsageError(f"{error}; {usage}") from None


def replaced_line(count: int) -> str:
    return f"{count} byte{'s' if count != 1 else ''} that {'are' if count != 1 else 'is'} not UTF-8 " \
           f"{'were' if count != 1 else 'was'} replaced by \ufffd"


def _range(key: str) -> str:
    low, high = LIMITS[key]
    return f"{low} to {high}"


class Repl:
    """The REPL's state (settings and toggles) and its commands."""

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
        self._new_storage()
        self._warm_up()
        self.commands: Dict[str, tuple] = {
            "/quit": (self.cmd_quit, "/quit", "quit"),
            "/clear": (self.cmd_clear, "/clear", "clear the screen"),
            "/help": (self.cmd_help, "/help", "this list, with the current values"),
            "/debug": (self.toggle("debug"), "/debug", "show each speculative step in color"),
            "/speculative": (self.toggle_strategy("speculative"), "/speculative", "speculative decoding with the drafter"),
            "/ngram": (self.toggle_strategy("ngram"), "/ngram", "n-gram assisted speculative decoding"),
            "/target": (self.toggle_strategy("target"), "/target", "target autoregressive"),
            "/drafter": (self.toggle_strategy("drafter"), "/drafter", "drafter autoregressive"),
            "/cache": (self.toggle("use_cache"), "/cache", "KV cache"),
            "/chat": (self.cmd_chat, "/chat", "apply the chat template"),
            "/length": (self.cmd_length, "/length <n>", "most new tokens"),
            "/gamma": (self.cmd_gamma, "/gamma <n|auto>", "most drafts per step (auto: the calibrated policy's choice)"),
            "/processor": (self.cmd_processor, "/processor <greedy|multinomial|topk|nucleus|topknucleus> <args...>", "sampling"),
            "/set_ngramstorage": (self.cmd_storage, "/set_ngramstorage <basic|onelevel> <n>", "n-gram storage type and n"),
            "/top_k_filler": (self.cmd_filler, "/top_k_filler <n>", "target top-k tokens added to the storage (1 = NAPD)"),
            "/reset_in_between": (self.cmd_reset, "/reset_in_between", "empty the n-gram storage before each prompt"),
            "/pld": (self.toggle_strategy("pld"), "/pld", "prompt lookup decoding"),
            "/pld_params": (self.cmd_pld_params, "/pld_params <min> <max> <num_tokens>", "prompt lookup n-gram sizes, drafts"),
            "/chained": (self.toggle_strategy("chained"), "/chained", "n-gram storage drafts, drafter model when it knows nothing"),
            "/ngram_save": (self.cmd_ngram_save, "/ngram_save <file>", "save the n-gram storage (JSON)"),
            "/ngram_load": (self.cmd_ngram_load, "/ngram_load <file>", "load a storage as the static fallback tier"),
            "/ngram_build": (self.cmd_ngram_build, "/ngram_build <corpus file>", "build the static tier from a text file"),
            "/adaptive": (self.cmd_adaptive, "/adaptive", "adaptive draft length (+2 all accepted, -1 otherwise)"),
            "/min_draft": (self.cmd_min_draft, "/min_draft <n>", "drop drafts shorter than n (0 = off)"),
            "/p_min": (self.cmd_p_min, "/p_min <p>", "drafter model stops below this top probability (0 = off)"),
            "/pause": (self.cmd_pause, "/pause <after> <steps>", "stop drafting after <after> fruitless steps (0 = off)"),
            "/min_gain": (self.cmd_min_gain, "/min_gain <x>", "pause drafting while steps emit fewer than x tokens per unit of cost (0 = off)"),
            "/memory": (self.cmd_memory, "/memory", "the policy remembers drafter models across prompts (off forgets)"),
            "/stats": (self.cmd_stats, "/stats", "detailed statistics of the last prompt"),
            "/stream": (self.cmd_stream, "/stream", "print tokens as they are accepted"),
        }

    # ---- state ---------------------------------------------------------------------------
    def _new_storage(self) -> None:
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

    def value_of(self, command: str) -> str:
        s = self.settings
        values = {
            "/debug": s.debug, "/speculative": self.enabled["speculative"], "/ngram": self.enabled["ngram"],
            "/target": self.enabled["target"], "/drafter": self.enabled["drafter"], "/cache": s.use_cache,
            "/chat": self.chat, "/length": s.max_gen_len, "/gamma": "auto" if s.policy.auto else s.gamma,
            "/memory": s.policy.remember,
            "/processor": " ".join([self.processor_name] + [f"{k}={v}" for k, v in self.processor_args.items()]),
            "/set_ngramstorage": f"{self.storage_kind} {self.storage_n}", "/top_k_filler": s.top_k_filler,
            "/reset_in_between": self.reset_in_between, "/pld": self.enabled["pld"], "/chained": self.enabled["chained"],
            "/pld_params": f"{s.pld_min_ngram} {s.pld_max_ngram} {s.pld_num_tokens}",
            "/ngram_load": "static tier loaded" if s.static_storage is not None else "", "/adaptive": s.policy.adaptive,
            "/min_draft": s.policy.min_draft, "/p_min": s.policy.p_min,
            "/pause": f"{s.policy.pause_after} {s.policy.pause_steps}", "/stream": self.stream, "/min_gain": s.policy.min_gain,
        }
        value = values.get(command, "")
        return {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) else str(value)

    def say(self, message: str) -> None:
        console.print(Text(message, style="bold blue"))

    # ---- commands ------------------------------------------------------------------------
    def cmd_quit(self, words):
        self._no_args(words, "/quit")
        raise EOFError

    def cmd_clear(self, words):
        self._no_args(words, "/clear")
        console.clear()

    def cmd_help(self, words):
        self._no_args(words, "/help")
        console.print(Text("Commands", style="bold"))
        for name, (_, usage, what) in self.commands.items():
            now = self.value_of(name)
            line = Text(f"  {usage:<40}", style="bold") + Text(f" {what}")
            console.print(line + Text(f"  [{now}]", style="cyan") if now else line)
        console.print("Anything else is a prompt (\\n and \\t become newline and tab).")

    def toggle(self, attribute: str) -> Callable:
        def run(words):
            self._no_args(words, f"/{'cache' if attribute == 'use_cache' else attribute}")
            setattr(self.settings, attribute, not getattr(self.settings, attribute))
            self.say(f"{attribute.replace('use_', '')}: {'on' if getattr(self.settings, attribute) else 'off'}")
        return run

    def toggle_strategy(self, key: str) -> Callable:
        from strategies import BY_KEY

        def run(words):
            self._no_args(words, f"/{key}")
            strategy = BY_KEY[key]
            if strategy.needs_drafter and self.settings.drafter is None:
                raise UsageError("no drafter loaded: restart with --drafter MODEL (a Hub id, a local folder or a GGUF file)")
            if strategy.decoder_only and self.settings.encoder_decoder:
                raise UsageError(f"{strategy.title} works with decoder-only models only")
            self.enabled[key] = not self.enabled[key]
            self.say(f"{strategy.title}: {'on' if self.enabled[key] else 'off'}")
        return run

    @staticmethod
    def _no_args(words, usage):
        if words:
            raise UsageError(f"{usage} takes no argument; usage: {usage}")

    def cmd_chat(self, words):
        self._no_args(words, "/chat")
        if not self.chat and not getattr(self.settings.tokenizer, "chat_template", None):
            raise UsageError("this tokenizer has no chat template")
        self.chat = not self.chat
        self.say(f"chat: {'on' if self.chat else 'off'}")

    def cmd_length(self, words):
        self.settings.max_gen_len = parse_setting(words, f"usage: /length <n>   (n from {_range('length')})", "length")
        self.say(f"length: {self.settings.max_gen_len}")

    def cmd_gamma(self, words):
        usage = f"usage: /gamma <n|auto>   (n from {_range('gamma')}: at most n drafts per step; auto: the calibrated policy chooses)"
        policy = self.settings.policy
        if words == ["auto"]:
            if policy.row_costs is None:
                raise UsageError("/gamma auto needs the measured verification costs: restart without --no-calibrate")
            policy.auto = True
            self.say(f"gamma: auto (cost-optimal, up to {policy.bound()} drafts per step)")
            return
        self.settings.gamma = parse_setting(words, usage, "gamma")
        policy.auto = False
        self.say(f"gamma: {self.settings.gamma} (at most {self.settings.gamma} drafts per step)")

    def cmd_memory(self, words):
        self._no_args(words, "/memory")
        policy = self.settings.policy
        policy.remember = not policy.remember
        if not policy.remember:
            policy.forget()
        self.say("policy memory: on (drafter models' records carry over to the next prompts)" if policy.remember
                 else "policy memory: off (forgotten; every prompt starts fresh)")

    def cmd_processor(self, words):
        processor, self.processor_name, self.processor_args = parse_processor(words)
        self.settings.processor = processor
        self.say(f"processor: {self.value_of('/processor')}")

    def cmd_storage(self, words):
        from strategies import STORAGES

        usage = f"usage: /set_ngramstorage <basic|onelevel> <n>   (n from {_range('n')})"
        if len(words) != 2 or words[0] not in STORAGES:
            raise UsageError(usage)
        n = parse_setting(words[1:], usage, "n")
        self.storage_kind, self.storage_n = words[0], n
        self._new_storage()
        self.say(f"n-gram storage: {words[0]} {n}")

    def cmd_filler(self, words):
        self.settings.top_k_filler = parse_setting(words, f"usage: /top_k_filler <n>   (n from {_range('top_k_filler')})", "top_k_filler")
        self.say(f"top_k_filler: {self.settings.top_k_filler}")

    def cmd_reset(self, words):
        self._no_args(words, "/reset_in_between")
        self.reset_in_between = not self.reset_in_between
        self.say(f"reset in between: {'on' if self.reset_in_between else 'off'}")

    def cmd_pld_params(self, words):
        usage = (f"usage: /pld_params <min> <max> <num_tokens>   (min <= max, both from {_range('pld_ngram')}; "
                 f"num_tokens from {_range('pld_num_tokens')})")
        if len(words) != 3:
            raise UsageError(usage)
        low, high = (parse_setting([w], usage, "pld_ngram", name) for w, name in zip(words, ("min", "max")))
        count = parse_setting(words[2:], usage, "pld_num_tokens", "num_tokens")
        if low > high:
            raise UsageError(f"min must be <= max, got {low} > {high}; {usage}")
        s = self.settings
        s.pld_min_ngram, s.pld_max_ngram, s.pld_num_tokens = low, high, count
        self.say(f"prompt lookup: n-grams {low} to {high}, {count} tokens")

    def _path(self, words, usage) -> str:
        if len(words) != 1:
            raise UsageError(usage)
        try:
            return parse_path(words[0])
        except ValueError as error:
            raise UsageError(f"{error}; {usage}") from None

    def cmd_ngram_save(self, words):
        from ngram_assisted import save_storage

        usage = "usage: /ngram_save <file> [--force]   (--force: overwrite a file that is not a saved storage)"
        force = words[1:] == ["--force"]
        path = self._path(words[:1] if force else words, usage)
        try:
            save_storage(self.settings.storage, path, overwrite=force)
        except (OSError, ValueError) as error:
            message = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            hint = "; /ngram_save <file> --force overwrites it" if "left as it is" in message else ""
            raise UsageError(f"cannot save to {path}: {message}{hint}") from None
        self.say(f"n-gram storage saved to {path}")

    def _set_static(self, storage, origin: str) -> None:
        from sampling.common import output_vocab_size

        if storage.vocab_size != output_vocab_size(self.settings.target):
            raise UsageError(f"{origin} was built for a vocabulary of {storage.vocab_size}, not this target's")
        self.settings.static_storage = storage
        self.say(f"static n-gram tier: {origin} ({type(storage).__name__}, n={storage.n})")

    def cmd_ngram_load(self, words):
        from ngram_assisted import load_storage

        path = self._path(words, "usage: /ngram_load <file>")
        try:
            storage = load_storage(path)
        except ValueError as error:
            raise UsageError(str(error)) from None
        self._set_static(storage, path)

    def cmd_ngram_build(self, words):
        from ngram_assisted import build_storage
        from sampling.common import output_vocab_size

        path = self._path(words, "usage: /ngram_build <corpus file>")
        try:
            storage = build_storage(path, self.settings.tokenizer, self.storage_n, self.storage_kind, output_vocab_size(self.settings.target))
        except ValueError as error:
            raise UsageError(str(error)) from None
        self._set_static(storage, path)

    def cmd_adaptive(self, words):
        self._no_args(words, "/adaptive")
        self.settings.policy.adaptive = not self.settings.policy.adaptive
        self.say(f"adaptive draft length: {'on' if self.settings.policy.adaptive else 'off'}")

    def cmd_min_draft(self, words):
        self.settings.policy.min_draft = parse_setting(words, f"usage: /min_draft <n>   (n from {_range('min_draft')}, 0 = off)", "min_draft")
        self.say(f"min_draft: {self.settings.policy.min_draft}")

    def cmd_p_min(self, words):
        value = parse_setting(words, "usage: /p_min <p>   (0 <= p < 1)", "p_min")
        self.settings.policy.p_min = value
        self.say(f"p_min: {value}")

    def cmd_pause(self, words):
        usage = f"usage: /pause <after> <steps>   (after from {_range('pause_after')}, 0 = off; steps from {_range('pause_steps')})"
        if len(words) != 2:
            raise UsageError(usage)
        after, steps = parse_setting(words[:1], usage, "pause_after", "after"), parse_setting(words[1:], usage, "pause_steps", "steps")
        self.settings.policy.pause_after, self.settings.policy.pause_steps = after, steps
        self.say(f"pause: after {after} fruitless steps, for {steps} steps" if after else "pause: off")

    def cmd_min_gain(self, words):
        usage = (f"usage: /min_gain <x>   (x from {_range('min_gain')}, 0 = off; "
                 "1 = drafting steps must pay for their verification pass)")
        value = parse_setting(words, usage, "min_gain")
        self.settings.policy.min_gain = value
        self.say(f"min_gain: {value}")

    def cmd_stream(self, words):
        self._no_args(words, "/stream")
        self.stream = not self.stream
        self.say(f"stream: {'on' if self.stream else 'off'}")

    def cmd_stats(self, words):
        self._no_args(words, "/stats")
        if not self.last:
            raise UsageError("no prompt yet: /stats shows the statistics of the last prompt")
        table = Table(title="Statistics of the last prompt")
        columns = ("strategy", "tokens", "target passes", "tok/step", "drafted", "accepted", "accept", "drafting s", "verifying s", "paused")
        for column in columns:
            table.add_column(column, justify="left" if column == "strategy" else "right")
        for strategy, r in self.last:
            st = r.stats
            table.add_row(Text(strategy.title, style=strategy.color), str(st.generated), str(st.target_forward_passes),
                          f"{st.mean_accepted_tokens:.2f}", str(st.drafted), str(st.accepted), f"{st.acceptance_rate:.2f}",
                          f"{st.draft_seconds:.3f}", f"{st.verify_seconds:.3f}", str(st.paused_steps))
        console.print(table)
        for strategy, r in self.last:
            if r.stats.drafted:
                rates = " ".join(f"{rate:.2f}" for rate in r.stats.per_position_acceptance)
                console.print(Text(f"{strategy.title}: acceptance by draft position: {rates}", style=strategy.color))
        policy = self.settings.policy
        console.print(f"policy: {policy.describe(self.settings.gamma)}"
                      + ("" if policy.remember else " · memory off: each prompt starts fresh"))

    # ---- prompts -------------------------------------------------------------------------
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
            if name not in self.commands:
                raise UsageError(f"unknown command {name}: /help lists the commands")
            self.commands[name][0](words)
            return
        self.compare(line)

    def encode(self, text: str) -> List[int]:
        tokenizer = self.settings.tokenizer
        if self.chat:
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
            return tokenizer(text, add_special_tokens=False).input_ids
        return tokenizer(text).input_ids

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
    parser.add_argument("--target", help="target model: Hub id, local folder or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--drafter", help="drafter model: Hub id, local folder or .gguf file (default: none)")
    parser.add_argument("--device", help="cpu, cuda, cuda:N, or auto (shard over all GPUs); default cuda when available")
    parser.add_argument("--drafter-device", help="device of the drafter (default: --device)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"], help="weights dtype")
    parser.add_argument("--quantize", choices=["none", "int8", "int4"], help="quantize the target's weights: on CPU weight-only int8/int4 kernels "
                        "(bfloat16 activations; int4 keeps the output head int8); on CUDA bitsandbytes, else optimum-quanto")
    parser.add_argument("--drafter-quantize", choices=["none", "int8", "int4"], help="quantize the drafter's weights (default: --quantize)")
    parser.add_argument("--cache", choices=["static", "dynamic"], help="KV cache kind while /cache is on: static "
                        "(preallocated, rolled back by moving the write position) or the model's dynamic cache "
                        "(default: static on CUDA, the measured default on CPU)")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow model code from the Hub (off: it runs code you have not read)")
    parser.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    parser.add_argument("--gamma", type=gamma_flag, default=4, help="most drafts per step, or auto for the calibrated policy's choice (default 4)")
    parser.add_argument("--length", type=flag_type("--length", "length"), default=35, help="most new tokens (default 35)")
    parser.add_argument("--processor", default="greedy", help='sampling, as /processor takes it, e.g. "nucleus 0.6 0.9" (default greedy)')
    parser.add_argument("--seed", type=flag_type("--seed", "seed"), default=42, help="seed set before each strategy (default 42)")
    parser.add_argument("--prompt", help="run one comparison on this prompt and exit")
    parser.add_argument("--no-calibrate", action="store_true", help="skip measuring the target's verification costs at start "
                        "(a few seconds): no padded passes, no cost-aware pausing")
    return parser


def fail(message: str) -> None:
    console.print(Text(f"error: {message}", style="bold red"))
    sys.exit(1)


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def main(argv: Optional[List[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset or "embedded"]
    for key in ("target", "drafter", "device", "quantize"):
        if getattr(args, key) is None and key in preset:
            setattr(args, key, preset[key])
    args.quantize = args.quantize or "none"
    args.drafter_quantize = args.drafter_quantize or args.quantize
    try:
        auto = args.gamma == "auto"
        if auto and args.no_calibrate:
            raise UsageError("--gamma auto needs the measured verification costs: drop --no-calibrate")
        args.gamma = 4 if auto else args.gamma
        processor, processor_name, processor_args = parse_processor(args.processor.split())
    except UsageError as error:
        fail(str(error).replace("usage: /processor", "--processor"))
    if args.prompt is not None:
        args.prompt, replaced = sanitize_text(args.prompt)
        args.prompt = args.prompt.replace("\\n", "\n").replace("\\t", "\t")
        if not args.prompt.strip():
            fail("--prompt is empty: give it some text, or leave it out for the interactive REPL")
        if len(args.prompt) > MAX_LINE:
            fail(f"--prompt must be at most {MAX_LINE} characters, got {len(args.prompt)}")
        if replaced:
            console.print(Text("--prompt: " + replaced_line(replaced), style="bold blue"))
    for flag in ("target", "drafter"):
        if getattr(args, flag) is not None and not getattr(args, flag).strip():
            fail(f"--{flag} is empty: give a model folder, a .gguf file or a Hub id")

    console.print(Text("Speculative Decoding", style="bold red"), Text(" REPL ", style="white on red"))
    import torch
    from sampling.common import common_vocab_size
    from strategies import Settings
    from utils.models import end_tokens, load_model, resolve_device

    torch.set_grad_enabled(False)
    for flag, value in (("--device", args.device), ("--drafter-device", args.drafter_device)):
        try:
            if value not in (None, "auto"):
                torch.device(value)
        except (RuntimeError, ValueError):
            fail(f"{flag} must be cpu, cuda, cuda:N, mps or auto, got {value[:40]!r}")
    device = resolve_device(args.device)
    models = {}
    for role, name, quantize, where in (
        ("target", args.target, args.quantize, device),
        ("drafter", args.drafter, args.drafter_quantize, resolve_device(args.drafter_device or device)),
    ):
        if role == "drafter" and name is None:
            continue
        console.print(Text(f"Loading {role}: {name or 'embedded SmolLM2-135M-Instruct'} ...", style="dim"))
        try:
            models[role] = load_model(name, where, args.dtype, quantize, args.trust_remote_code)
        except (Exception, KeyboardInterrupt) as error:  # one clear line, no traceback
            fail(f"could not load the {role} '{name or 'embedded'}': {first_line(error)}")
    target, tokenizer, target_label = models["target"]
    drafter = models.get("drafter", (None, None, None))[0]
    if drafter is not None:
        drafter_tokenizer = models["drafter"][1]
        try:
            common_vocab_size(drafter, target, tokenizer)
            if drafter_tokenizer.get_vocab() != tokenizer.get_vocab():
                raise ValueError("drafter and target tokenizers differ")
        except ValueError as error:
            fail(f"the drafter cannot draft for this target: {error}")
        if drafter.config.is_encoder_decoder != target.config.is_encoder_decoder:
            fail("drafter and target must both be decoder-only or both encoder-decoder")

    from utils.caching import default_cache, set_cache

    for model in (target, drafter):
        if model is not None:
            set_cache(model, args.cache)
    for role, (model, _, label) in models.items():
        quantize = args.quantize if role == "target" else args.drafter_quantize
        if getattr(model, "_specdec_quantization", None):
            quantize += " (CPU weight-only kernels, bfloat16 activations)"
        console.print(f"[bold]{role.capitalize()}:[/bold] {label} · {next(model.parameters()).device} · {model.dtype} · quantization {quantize} · {default_cache(model)} KV cache")
    if drafter is None:
        console.print("[bold]Drafter:[/bold] none (speculative decoding off; start with --drafter MODEL to compare it)")

    encoder_decoder = bool(getattr(target.config, "is_encoder_decoder", False))
    settings = Settings(
        target=target, tokenizer=tokenizer, drafter=drafter, processor=processor, gamma=args.gamma,
        max_gen_len=args.length, eos_tokens_id=end_tokens(target, tokenizer), encoder_decoder=encoder_decoder,
    )
    if not args.no_calibrate:
        from sampling import calibrated_policy

        console.print(Text("Measuring the target's verification costs ...", style="dim"))
        settings.policy = calibrated_policy(target, drafter=drafter)
        settings.policy.auto = auto and settings.policy.row_costs is not None
        if auto and not settings.policy.auto:
            console.print(Text(f"gamma auto needs plausible verification costs: gamma <= {settings.gamma} instead", style="red"))
        drafter_cost = f" · a drafter pass costs {settings.policy.draft_cost:.2f}" if drafter is not None else ""
        console.print(f"{settings.policy.calibration}{drafter_cost}")
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
