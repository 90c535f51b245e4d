"""The benchmark's runs: ``Bench`` (the pair, the run's config and context, one timed run of a
configuration), the interleaved timed loop over prompts, repeats and configurations, and the record
of each run (with the config it ran with, ``RunConfig.to_dict``)."""
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, NamedTuple, Optional

from app.bench.configs import Config, baseline
from app.bench.llama_cpp import llama_cpp_report
from app.bench.report import depth_report, kernels_report, sources_report

if TYPE_CHECKING:
    from configuration import RunConfig, RunContext


def first_divergence(a: List[int], b: List[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class PassTimes(NamedTuple):
    """One run's forward passes (``pass_times``): how many, the time inside them, the run's wall time."""

    passes: int
    inside: float
    wall: float
    failed: str = ""  # why the run failed ("" when it did not)


class Bench:
    def __init__(self, args, greedy: bool):
        from app.heads import head_path
        from app.pair import LoadOptions, cross_preset, load_pair, pair_preset
        from app.steps import head_layers, start_widths
        from app.session import PolicyFlags, SetupError, build_settings, drafter_head_words
        from runners.compiled import set_cpu_gemm
        from runners.limits import output_vocab_size
        from sampling.divergence import default_runner

        self.args = args
        self.greedy = greedy
        set_cpu_gemm(args.gemm)  # read as compiled graphs are built
        try:
            preset = {"pair": pair_preset, "cross": cross_preset}.get(args.preset, dict)()
            options = LoadOptions(args.device, dtype=args.dtype, quantize=args.quantize, trust_remote_code=args.trust_remote_code,
                                  cache=args.cache, prepack=args.prepack, compile=args.compile,
                                  measure_dtype=preset.get("measure_dtype", False), remeasure=args.remeasure,
                                  chat=not args.no_chat, calibrate=not args.no_calibrate, row_costs=args.row_costs,
                                  runner=args.runner, forward=args.forward, eager=args.eager, step_graphs=args.step_graphs,
                                  drafter_dtype=args.drafter_dtype, drafter_head=args.drafter_head,
                                  step_widths=start_widths([g for g in args.gamma]),
                                  hidden_layers=head_layers(head_path(args.head, (args.target or preset.get("target")) is None)))
            pair = load_pair(args.target or preset.get("target"), args.drafter or preset.get("drafter"), options)
        except SetupError as error:
            raise SystemExit(f"error: {error}") from None
        self.target, self.tokenizer, self.drafter, self.drafter_label = pair.target, pair.tokenizer, pair.drafter, pair.drafter_label
        self.compile_seconds = pair.compile_seconds  # role -> seconds, start-up compilation
        self.measured = pair.measured  # what the start-up measured and chose, written with every run
        self.pair = pair  # its target described when asked (``target_label``)
        self.kernel_line = pair.measured.target.kernels.line or f"--prepack {args.prepack}"
        self.vocab = output_vocab_size(self.target)
        try:
            flags = PolicyFlags(args.adaptive, args.pause, args.min_gain, args.policy_memory)
            self.config, self.context = build_settings(pair, args.processor, length=args.max_new_tokens, flags=flags, head=args.drafter_head)
            self.drafter_label += drafter_head_words(args.drafter_head, pair)
        except SetupError as error:
            raise SystemExit(f"error: {error}") from None
        from app.heads import load_for

        try:
            self.context.head, self.head_line = load_for(args.head, pair, (args.target or preset.get("target")) is None,
                                                          lambda text, style="": print(text, file=sys.stderr), length=None)
        except SetupError as error:
            raise SystemExit(f"error: {error}") from None
        self.config = self.config.with_(hf_compile=args.compile, tree_size=args.tree_size)
        policy = self.config.policy
        if "auto" in args.gamma and policy.row_costs is None:
            raise SystemExit("error: --gamma auto needs plausible verification costs, and those measured were not (see above)")
        self.row_costs = policy.row_costs
        self.policy_memories: Dict[Config, dict] = {}  # each configuration's own policy memory (with --policy-memory)
        self.memories: Dict[tuple, object] = {}  # (configuration, repeat): a suffix memory across the prompts, in order
        runner = self.config.runner  # divergences are replayed on the runner the strategies ran: its kind, compiled or not
        self.runner_factory = lambda model: default_runner(model, runner)

    @property
    def target_label(self) -> str:
        """The target's weights, cache, runner and kernels as the REPL says them, described when asked: the C step's
        words name decoding's prefetch distance, which ``kernels.ahead`` races on the first passes of the model's
        released blocks (the warm-up's, in a start that measured nothing): before them, "the build's default,
        untimed" whatever runs; the report's title is written after the runs."""
        return self.pair.describe("target") + self.pair.header_note()

    def compile_for(self, items: List[dict], configs: List[Config]) -> None:
        """Build the compiled graphs before any timed run, counted in ``compile_seconds``: the compiled
        step's (CUDA's default for the Llama family: ``app.steps.ready``, every width the rows feed and
        every key bucket the prompts meet), or, with ``--compile`` elsewhere, graphs holding the longest
        prompt plus its new tokens (a larger cache is a new set of graphs). The graphs that also return
        hidden states only where a configuration drafts with the head."""
        from runners import prepare

        from app.steps import ready

        longest = max(len(item["prompt"]) for item in items) + self.args.max_new_tokens
        runners = {"target": self.config.runner, "drafter": self.config.drafter_runner}
        drafts_with_head = any(drafts_with(c) for c in configs)
        # the compiled step (CUDA's default): every width the rows feed, every key bucket the prompts meet
        rows = [(c.strategy, self.run_config(c)) for c in configs]
        seconds = ready(self.target, self.drafter, runners, rows, min(len(item["prompt"]) for item in items), longest,
                        lambda text: print(text, file=sys.stderr), self.context.head if drafts_with_head else None)
        if seconds:
            self.compile_seconds["target"] = self.compile_seconds.get("target", 0.0) + seconds
        for role, model in (("target", self.target), ("drafter", self.drafter)):
            if model is not None and runners[role].compiled_for(model) and not runners[role].step_for(model):
                head = self.context.head if role == "target" and drafts_with_head else None
                seconds = prepare(model, longest, lambda text: print(f"{role}: {text} ...", file=sys.stderr),
                                  hidden_layers=head.config.aux_layers if head is not None else (), config=runners[role])
                self.compile_seconds[role] = self.compile_seconds.get(role, 0.0) + seconds

    def reserve_for(self, items: List[dict], configs: List[Config]) -> None:
        """Each model's C step scratch grown to what the longest prompt's run needs (``app.steps.reserve_scratch``),
        after the warm-up made the steps (a start that measured nothing makes them there): no timed run grows it."""
        from app.steps import drafter_widths, head_widths, reserve_head_scratch, reserve_scratch, step_widths

        rows = [(c.strategy, self.run_config(c)) for c in configs]
        last = max(len(item["prompt"]) for item in items) + self.args.max_new_tokens
        for model, widths in ((self.target, step_widths(rows)), (self.drafter, drafter_widths(rows))):
            if model is not None and widths:
                reserve_scratch(model, max(widths), last)
        reserve_head_scratch(self.context.head, max(head_widths(rows), default=1), last)

    def compile_report(self) -> str:
        """The report's line on start-up compilation (never inside a timed run); empty without ``--compile``."""
        if not self.compile_seconds:
            return ""
        from runners import compile_source

        models = {"target": self.target, "drafter": self.drafter}
        spent = ", ".join(f"{role} {seconds:.1f} s ({compile_source(models[role]) or 'nothing new'})"
                          for role, seconds in self.compile_seconds.items())
        return f"\n## compilation\n\nCompiled at start-up, outside every timed run: {spent}.\n"

    def items(self, rows: List[dict]) -> List[dict]:
        """One item per turn; a second turn follows the target's greedy answer to the first."""
        from app.session import encode
        from strategies import run_strategy

        items = []
        for row in rows:
            messages = []
            for turn, text in enumerate(row["turns"]):
                messages.append({"role": "user", "content": text})
                prompt = encode(self.tokenizer, messages, not self.args.no_chat)
                items.append({**row, "turn": turn, "prompt": prompt})
                if turn + 1 < len(row["turns"]):
                    answer = run_strategy(baseline().strategy, prompt, self.config.with_(processor="greedy"), self.context, self.args.seed)
                    messages.append({"role": "assistant", "content": self.tokenizer.decode(answer.tokens, skip_special_tokens=True)})
        return items

    def run_config(self, config: Config) -> "RunConfig":
        """The run's values for ``config``: its gamma (or the calibrated policy's, "auto"), filler and parameters."""
        auto = config.gamma == "auto"
        values = self.config.with_(gamma=self.config.gamma if auto else config.gamma, top_k_filler=config.filler, **dict(config.params))
        return values.with_policy(auto=auto)

    def context_for(self, config: Config, repeat: int = 0, observer=None) -> "RunContext":
        """The run's live objects for ``config``: a new storage of its kind, its suffix memory across the
        repeat's prompts, ``observer`` (an ``Observer``) as the stream, and its own policy memory: what
        one configuration's policy remembers never reaches another's."""
        from strategies import STORAGES

        return replace(self.context, storage=STORAGES[config.storage](config.n, self.vocab), suffix_memory=self.memory(config, repeat),
                       streamer=observer, policy_memory=self.policy_memories.setdefault(config, {}))

    def memory(self, config: Config, repeat: int):
        """The global memory a strategy with one keeps across the prompts of one repeat (None for the others)."""
        make = config.strategy.memory
        return self.memories.setdefault((config, repeat), make(self.config, self.context)) if make is not None else None

    def run(self, config: Config, prompt: List[int], observer=None, repeat: int = 0):
        """One timed run; ``observer`` (an ``Observer``) sees its steps."""
        from strategies import run_strategy

        return run_strategy(config.strategy, prompt, self.run_config(config), self.context_for(config, repeat, observer), self.args.seed)

    def classify(self, prompt: List[int], reference: List[int], tokens: List[int], passes: list,
                 kernels: str = "", reference_kernels: str = "") -> dict:
        """A greedy divergence from target AR, classified (``sampling.divergence``), each computation
        replayed on the kernels its run had (``kernels``, ``reference_kernels``: "prepacked", "own",
        "": as the model is); a run whose loop recorded no pass (a transformers path) is "unclassified"."""
        from sampling.divergence import classify_divergence, on_kernels

        if not passes or getattr(self.target.config, "is_encoder_decoder", False):
            return {"verdict": "unclassified", "position": first_divergence(tokens, reference)}
        return classify_divergence(self.target, prompt, reference, tokens, passes, on_kernels(self.runner_factory, reference_kernels),
                                   on_kernels(self.runner_factory, kernels)).record()

    def overhead(self, configs: List[Config], prompt: List[int]) -> Dict[str, float]:
        """Per configuration: the fraction of one run's wall time spent outside model forward passes
        (drafting, acceptance, storage updates, sampling glue), by ``pass_times``."""
        return {label: outside(timed) for label, timed in pass_times(self, configs, prompt).items()}

    def verify_cost(self) -> Dict[int, float]:
        """Cost of one target pass over r positions relative to r = 1 (the calibration's, or measured now)."""
        from sampling import measure_row_costs

        costs = self.row_costs or measure_row_costs(self.target)
        return {rows: cost for rows, cost in enumerate(costs, 1)}


def pass_times(bench: Bench, configs: List[Config], prompt: List[int], clock: Callable[[], float] = time.perf_counter) -> Dict[str, PassTimes]:
    """Per configuration, one run of ``prompt`` (``bench.run``): its forward passes, timed where every runner
    makes them (``runners.clock``: the runners' ``__call__`` and ``tree_pass``, whatever runs inside them), and
    transformers' ``generate`` at its models' top-level calls; a GPU synchronised around each pass; all on ``clock``."""
    from runners.clock import PassClock, model_passes, timing_passes
    from runners.device import model_device, synchronize

    models = [m for m in (bench.target, bench.drafter) if m is not None]
    devices = [m for m in models if model_device(m).type != "cpu"]

    def sync() -> None:
        for model in devices:
            synchronize(model)
    times = {}
    for config in configs:
        passes = PassClock(clock, sync if devices else None)
        with timing_passes(passes), model_passes(models, passes):
            started = clock()
            result = attempt(bench, config, prompt)
            wall = clock() - started
        times[config.label] = PassTimes(passes.passes, passes.seconds, wall, result if isinstance(result, str) else "")
    return times


def outside(timed: PassTimes) -> float:
    """The share of a run's wall time spent outside its forward passes."""
    return 1 - timed.inside / timed.wall if timed.wall else 0.0


def attempt(bench: Bench, config: Config, prompt: List[int], observer=None, repeat: int = 0):
    """``bench.run``'s result, or why the run failed (one line, a ``str``): no row ends a benchmark by failing."""
    try:
        return bench.run(config, prompt, observer, repeat)
    except Exception as error:  # noqa: BLE001: any row's failure is that row's, reported with its reason
        lines = str(error).strip().splitlines()
        return f"{type(error).__name__}: {lines[0] if lines else 'no message'}"


def failed_record(config: Config, reason: str, item: Optional[dict] = None, repeat: Optional[int] = None) -> dict:
    """A line of runs.jsonl for a run that failed (``failed``: its reason; ``item`` None: in the warm-up)."""
    where = {"question_id": item["question_id"], "category": item["category"], "turn": item["turn"]} if item else {"stage": "warm-up"}
    return {**where, "repeat": repeat, "config": config.label, "key": config.key, "gamma": config.gamma, "failed": reason}


def warm_up(bench: Bench, configs: List[Config], prompt: List[int]) -> List[dict]:
    """One run of each configuration, excluded from the timings, which leaves nothing in a policy's
    memory nor in a suffix memory; returns the failed runs' records (those rows are not timed)."""
    failed = []
    for config in configs:
        result = attempt(bench, config, prompt[:32])
        if isinstance(result, str):
            print(f"failed: {config.label} in the warm-up: {result}; its row is not timed", file=sys.stderr)
            failed.append(failed_record(config, result))
    bench.policy_memories.clear()
    bench.memories.clear()
    return failed


def timed_runs(bench: Bench, configs: List[Config], items: List[dict], out: Path, failed: List[dict] = ()) -> List[dict]:
    """Every item, repeat and configuration, interleaved; each run's record is also written to ``out/runs.jsonl``,
    after ``failed`` (the warm-up's). A run that fails is a record with its reason (``failed``); the others go on."""
    from tqdm import tqdm

    from kernels import once
    from sampling.divergence import PassRecorder
    from measure import run_environment
    from utils.load import LoadMeter

    repeats, meter, environment, measured = bench.args.repeats, LoadMeter(), run_environment(), bench.measured.as_dict()
    records = list(failed)
    with open(out / "runs.jsonl", "w") as log, tqdm(total=len(items) * len(configs) * repeats, file=sys.stderr) as bar:
        log.writelines(json.dumps(record) + "\n" for record in failed)
        for index, (item, repeat) in enumerate((item, repeat) for item in items for repeat in range(repeats)):
            # rotate the order of the configurations from one run to the next, so that none
            # always follows the same other one (caches, clocks and the machine's drift)
            shift = index % len(configs)
            results = []
            for config in configs[shift:] + configs[:shift]:
                recorder = PassRecorder()  # one append per step: classifying waits until the timed runs are over
                meter.start()  # /proc is read between timed runs, never inside one
                started = once.count()
                result = attempt(bench, config, item["prompt"], recorder, repeat)
                results.append((config, result, recorder, meter.stop(), once.since(started)))
                bar.update(1)
            reference, reference_kernels = next(((result.tokens, result.kernels) for config, result, *_ in results
                                                 if config.strategy.baseline and not isinstance(result, str)), (None, ""))
            for config, result, recorder, window, done_once in sorted(results, key=lambda run: configs.index(run[0])):
                for event in done_once:  # the warm-up and ``reserve_for`` do it all: a line here is a bug to report
                    tqdm.write(f"one-time work inside a timed run: {config.label} on question {item['question_id']}: "
                               f"{event.kind}, {event.what} ({event.seconds * 1e3:.1f} ms)", file=sys.stderr)
                if isinstance(result, str):
                    tqdm.write(f"failed: {config.label} on question {item['question_id']}: {result}", file=sys.stderr)
                    records.append(failed_record(config, result, item, repeat))
                    log.write(json.dumps(records[-1]) + "\n")
                    continue
                record = {**run_record(bench, item, repeat, config, result, reference), **window.record(bench.args.busy),
                          "one_time": [event.line() for event in done_once] or None, "environment": environment, "measured": measured}
                if record["diverged_at"] is not None:
                    record["divergence"] = bench.classify(item["prompt"], reference, result.tokens, recorder.passes,
                                                          result.kernels, reference_kernels)
                    tqdm.write(f"divergence: {config.label} on question {item['question_id']} turn {item['turn']} "
                               f"at token {record['diverged_at']}: {record['divergence']['verdict']}", file=sys.stderr)
                records.append(record)
                log.write(json.dumps(record) + "\n")
    return records


def run_record(bench: Bench, item: dict, repeat: int, config: Config, result, reference: Optional[List[int]]) -> dict:
    """One line of runs.jsonl (its divergence not classified yet: None; none without a reference)."""
    st = result.stats
    return {
        "question_id": item["question_id"], "category": item["category"], "turn": item["turn"],
        "repeat": repeat, "config": config.label, "key": config.key, "gamma": config.gamma, "n": config.n,
        "storage": config.storage, "filler": config.filler, "params": dict(config.params) or None, "processor": bench.args.processor,
        "prompt_tokens": len(item["prompt"]), "new_tokens": len(result.tokens), "seconds": result.seconds,
        "tokens_per_s": result.tokens_per_second, "first_step_seconds": st.first_step_seconds or None, "drafted": st.drafted, "accepted": st.accepted,
        "target_passes": st.target_forward_passes, "drafted_at": st.drafted_at, "accepted_at": st.accepted_at,
        "paused_steps": st.paused_steps, "tokens": result.tokens, "steps": st.emitted_by_step,
        "kernels": result.kernels, "drafts": st.drafted_by_step, "peer_settings": st.peer_settings or None,
        "accepted_by": st.accepted_by or None, "policy": st.policy or None, "head": bench.head_line if bench.context.head is not None and drafts_with(config) else None,
        "text": bench.tokenizer.decode(result.tokens, skip_special_tokens=True),
        "diverged_at": (first_divergence(result.tokens, reference)
                        if bench.greedy and not config.strategy.drafter_ar and reference is not None else None),
        "divergence": None, "run_config": result.config.to_dict(),
    }


def drafts_with(config: Config) -> bool:
    """Whether ``config``'s row drafts with the learned head when one is loaded (``app.steps.drafts_with_head``)."""
    from app.steps import drafts_with_head

    return drafts_with_head(config.strategy)


def report_title(bench: Bench, configs: List[Config]) -> str:
    """The report's title: the pair (the head only where a row drafts with it), the processor, the
    lengths, the policy (and the suffix settings)."""
    args = bench.args
    title = (f"{bench.target_label}" + (f" + drafter {bench.drafter_label}" if bench.drafter_label else "")
             + (f" + head {bench.head_line}" if bench.context.head is not None and any(drafts_with(c) for c in configs) else "")
             + f" · {args.processor} · {args.max_new_tokens} new tokens · {args.repeats} repeat(s)"
             + f" · policy: {bench.config.policy.policy().describe()}")
    if any(config.strategy.suffix for config in configs):
        title += f" · suffix: {bench.config.suffix.describe()}" + (
            ", global memory over the earlier prompts' outputs" if any(config.strategy.memory for config in configs) else "")
    return title


def extra_sections(bench: Bench, configs: List[Config], records: List[dict], prompt: List[int]) -> str:
    """The report's sections after the tables: kernels, the prefetch distance raced, compilation, and those the flags ask for
    (--verify-cost, --llama-cpp, --overhead), the last three measured now on ``prompt``."""
    from kernels.ahead import raced

    args = bench.args
    extra = kernels_report(records, bench.kernel_line) + sources_report(records) + depth_report(records) + bench.compile_report()
    prefetch = raced()  # the distance each dtype's passes ran with, the race's least samples (the REPL's Prefetch line)
    extra += f"\n## prefetch\n\nPrefetch: {prefetch}\n" if prefetch else ""
    if args.verify_cost:
        costs = bench.verify_cost()
        extra += ("\n## cost of a verification pass over r positions (r - 1 drafts), relative to r = 1\n\n"
                  "| r | cost |\n| ---: | ---: |\n")
        extra += "".join(f"| {k} | {v:.2f} |\n" for k, v in costs.items())
    if args.llama_cpp:
        extra += llama_cpp_report(bench, args, prompt)
    if args.overhead:
        times = pass_times(bench, configs, prompt)
        extra += ("\n## time outside model forward passes (first prompt)\n\nPasses timed where the runners make them "
                  "(their calls and tree passes), transformers' `generate` at its model's calls.\n\n"
                  "| strategy | forward passes | share outside |\n| --- | ---: | ---: |\n")
        extra += "".join(f"| {label} | {t.passes} | {f'failed: {t.failed}' if t.failed else f'{outside(t):.1%}'} |\n"
                         for label, t in times.items())
    return extra
