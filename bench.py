"""Benchmark every strategy and transformers' own paths on Spec-Bench-format prompts.

    python bench.py                                   # embedded model, shipped prompts, greedy
    python bench.py --prompts ../shared/specbench/question.jsonl --categories summarization,rag --limit 10
    python bench.py --drafter layers:20 --gamma 1,2,4,8 --repeats 3
    python bench.py --replay                          # n-gram storage hit rates, no model forward pass

Writes, under --out: runs.jsonl (every run), summary.csv, results.md (a table per category) and
PNG plots. Timing: a warm-up pass per configuration first (excluded), the device synchronised
around each run, only new tokens counted, configurations interleaved prompt by prompt and repeat
by repeat so that machine drift hits all alike; speedups are ratios to target autoregressive
taken within the same repeat; the order of the configurations rotates from one run to the next.
Every greedy run is compared with target autoregressive; a divergence is reported with its first
diverging position and classified (sampling.divergence) as a rounding near-tie or a disagreement,
outside the timed runs; --strict exits with status 1 on any disagreement.
"""
import argparse
import csv
import importlib.util
import itertools
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional

from session import add_shared_flags
from utils.parsing import flag_list_type, flag_type, parse_limited

if TYPE_CHECKING:
    from sampling import DraftPolicy
    from strategies import Strategy  # imported when first needed: it loads torch

ROOT = Path(__file__).resolve().parent
DEFAULT_PROMPTS = ROOT / "bench_prompts.jsonl"
CODE_EDITING = ROOT / "prompts" / "code_editing.jsonl"  # rename, document, refactor, fix: the whole code returned
DEFAULT_STRATEGIES = "target,ngram,pld,suffix,speculative,chained,drafter,hf_generate,hf_generate_static,hf_assisted,hf_prompt_lookup"


@dataclass(frozen=True)
class Config:
    """One strategy (its key in ``strategies``) with one set of parameters; those it does not take
    keep their defaults, so that equal settings make equal configurations."""

    key: str
    gamma: int | str = 4  # an int bounds the drafts per step; "auto" lets the calibrated policy choose
    n: int = 3
    storage: str = "basic"
    filler: int = 3

    @classmethod
    def of(cls, record: dict) -> "Config":
        """The configuration of a run record, from its typed fields (never from its label)."""
        config = cls(record["key"])
        strategy = config.strategy
        taken = (("gamma",) if strategy.takes_gamma else ()) + (("n", "storage", "filler") if strategy.takes_storage else ())
        return replace(config, **{name: record[name] for name in taken if name in record})

    @property
    def strategy(self) -> "Strategy":
        from strategies import EVERY

        return EVERY[self.key]

    @property
    def label(self) -> str:
        return self._name(f"g={self.gamma}")

    @property
    def family(self) -> str:
        """The label without gamma: one line of the gamma sweep."""
        return self._name("")

    def _name(self, gamma: str) -> str:
        words = ([f"{self.storage} n={self.n} k={self.filler}"] if self.strategy.takes_storage else []) + (
            [gamma] if gamma and self.strategy.takes_gamma else []) + ([self.strategy.label_words] if self.strategy.label_words else [])
        return f"{self.key}[{' '.join(words)}]" if words else self.key


def baseline() -> Config:
    """Target autoregressive: every ratio's denominator."""
    from strategies import EVERY

    return Config(next(key for key, strategy in EVERY.items() if strategy.baseline))


def gamma_list(text: str) -> List[int | str]:
    """``1,2,4,auto``: draft-length bounds (the REPL's /gamma range), ``auto`` for the calibrated policy's own choice."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    rest = [w for w in words if w != "auto"]
    numbers = flag_list_type("--gamma", "gamma")(",".join(rest)) if rest or not words else []
    return numbers + (["auto"] if "auto" in words else [])


def pause_spec(text: str) -> List[int]:
    """``AFTER,STEPS`` with the REPL's /pause ranges."""
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"--pause takes AFTER,STEPS, got {text[:40]!r}")
    try:
        return [parse_limited(parts[0], "--pause AFTER", "pause_after"), parse_limited(parts[1], "--pause STEPS", "pause_steps")]
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", nargs="+", default=[str(DEFAULT_PROMPTS)], help="Spec-Bench format JSONL files, read in turn "
                   f"(default: the shipped set; {CODE_EDITING.relative_to(ROOT)}: the code-editing category)")
    p.add_argument("--categories", help="comma-separated categories to keep")
    p.add_argument("--limit", type=flag_type("--limit", "limit"), help="at most this many prompts per category")
    p.add_argument("--preset", choices=["embedded", "pair"], help="a known model pair, as the REPL's; other flags override it. "
                   "pair: Qwen2.5-Coder-1.5B-Instruct with its 0.5B sibling (install: make fetch-pair), dtype chosen by measurement")
    add_shared_flags(p)
    p.add_argument("--quantize", default="none", choices=["none", "int8", "int4"],
                   help="target (and drafter) weights: on CPU weight-only int8/int4 kernels, on CUDA bitsandbytes/quanto")
    p.add_argument("--llama-cpp", metavar="LLAMA_BENCH",
                   help="path of a llama.cpp llama-bench binary: also time its plain decoding of --gguf, "
                   "alternating with target AR, and report the ratio")
    p.add_argument("--gguf", help="the GGUF file llama.cpp runs (default: the embedded model's)")
    p.add_argument("--threads", type=int, help="llama.cpp threads (default: torch's thread count)")
    p.add_argument("--strategies", default=DEFAULT_STRATEGIES, help=f"comma-separated (default: {DEFAULT_STRATEGIES}); "
                   "those needing a drafter are skipped without one")
    p.add_argument("--gamma", type=gamma_list, default=[4], help="most drafts per step, e.g. 1,2,4,8 (default 4); "
                   "auto: the calibrated policy's cost-optimal length, up to the longest measured pass")
    p.add_argument("--ngram-n", type=flag_list_type("--ngram-n", "n"), default=[3], help="n-gram sizes for NASD, e.g. 2,3,4 (default 3)")
    p.add_argument("--storages", default="basic,onelevel", help="NASD storages (default basic,onelevel)")
    p.add_argument("--tree-size", type=flag_type("--tree-size", "tree_size"), default=16,
                   help="most nodes of a draft tree for tree_ngram and recycling (default 16)")
    p.add_argument("--top-k-filler", type=flag_list_type("--top-k-filler", "top_k_filler"), default=[3], help="NASD filler top-k values, e.g. 1,3,5 (default 3)")
    p.add_argument("--adaptive", action="store_true", help="adaptive draft length for every drafting strategy")
    p.add_argument("--pause", type=pause_spec, help="AFTER,STEPS: pause drafting after AFTER fruitless steps for STEPS steps")
    p.add_argument("--min-gain", type=flag_type("--min-gain", "min_gain"), help="cost-aware pausing: pause drafting while tokens per drafting step, "
                   "divided by the step's measured cost (plain tokens per step with --no-calibrate), fall below this "
                   "(default: the REPL's, 1.0; 0 with --no-calibrate; 0 = off)")
    p.add_argument("--policy-memory", action="store_true", help="each configuration's policy remembers its drafter model across prompts "
                   "(a drafter that did not pay starts the next prompt paused; the warm-up is forgotten); off: every run "
                   "depends on its own prompt only")
    p.add_argument("--max-new-tokens", type=flag_type("--max-new-tokens", "length"), default=128, help="new tokens per run (default 128)")
    p.add_argument("--repeats", type=flag_type("--repeats", "repeats"), default=1, help="timed repeats of every run (default 1)")
    p.add_argument("--out", default="results", help="output folder (default results/)")
    p.add_argument("--specbench-out", metavar="DIR", help="also write, per configuration, Spec-Bench's model-answer JSONL "
                   "(first repeat) for its evaluation/speed.py and equal.py")
    p.add_argument("--replay", action="store_true", help="only replay the prompts (or --corpus) through n-gram storages")
    p.add_argument("--corpus", help="with --replay: a text file to replay instead of the prompts")
    p.add_argument("--verify-cost", action="store_true", help="also time one target pass verifying k tokens against k = 1")
    p.add_argument("--overhead", action="store_true", help="also report the share of each run spent outside model forward passes")
    p.add_argument("--from-runs", help="re-make the tables and plots from a runs.jsonl, without running anything")
    p.add_argument("--strict", action="store_true", help="exit with status 1 when any greedy divergence is a disagreement "
                   "(not a rounding near-tie)")
    p.add_argument("--group", action="append", type=group_spec, metavar="NAME=CAT,CAT",
                   help="also report these categories taken together (repeatable; default: "
                   f"{DEFAULT_GROUP[0]}={','.join(DEFAULT_GROUP[1])})")
    return p


DEFAULT_GROUP = ("input-grounded", ("summarization", "rag", "coding", "extraction", "code_editing"))


def group_spec(text: str) -> tuple:
    name, _, categories = text.partition("=")
    members = tuple(c.strip() for c in categories.split(",") if c.strip())
    if not name.strip() or not members:
        raise argparse.ArgumentTypeError(f"expected NAME=CATEGORY,CATEGORY, got {text!r}")
    return name.strip(), members


def load_prompts(paths: str | List[str], categories: Optional[str], limit: Optional[int]) -> List[dict]:
    rows, seen = [], defaultdict(int)
    wanted = set(categories.split(",")) if categories else None
    for path in [paths] if isinstance(paths, str) else paths:
        rows += _read_prompts(path, wanted, limit, seen)
    if not rows:
        raise SystemExit("error: no prompt left after --categories/--limit")
    return rows


def _read_prompts(path: str, wanted: Optional[set], limit: Optional[int], seen: Dict[str, int]) -> List[dict]:
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                turns, category = row["turns"], row.get("category", "all")
                assert isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns)
            except (ValueError, KeyError, AssertionError):
                raise SystemExit(f"error: {path}:{number} is not a Spec-Bench row (question_id, category, turns)")
            if wanted and category not in wanted:
                continue
            if limit and seen[category] >= limit:
                continue
            seen[category] += 1
            rows.append({"question_id": row.get("question_id", number), "category": category, "turns": turns})
    return rows


def make_configs(args, have_drafter: bool) -> List[Config]:
    from strategies import EVERY

    configs = []
    for key in [k.strip() for k in args.strategies.split(",") if k.strip()]:
        if key not in EVERY:
            raise SystemExit(f"error: unknown strategy {key!r}; known: {', '.join(EVERY)}")
        strategy = EVERY[key]
        if strategy.needs_drafter and not have_drafter:
            continue
        if strategy.requires and importlib.util.find_spec(strategy.requires) is None:
            print(f"skipped {key}: {strategy.requires} is not installed (optional)", file=sys.stderr)
            continue
        grid = {"gamma": [g for g in args.gamma if g != "auto" or strategy.auto_gamma]} if strategy.takes_gamma else {}
        if strategy.takes_storage:
            grid.update(n=args.ngram_n, storage=strategy.storages or args.storages.split(","), filler=args.top_k_filler)
        configs += [Config(key, **dict(zip(grid, values))) for values in itertools.product(*grid.values())]
    if baseline() not in configs:
        configs.insert(0, baseline())
    return list(dict.fromkeys(configs))  # a repeated flag value runs its configuration once


def refuse_trees(target, config: Config) -> bool:
    """Whether ``target`` cannot verify the draft trees of ``config``'s strategy (said on stderr, in one line)."""
    from utils.caching import tree_unsupported

    reason = tree_unsupported(target)
    if reason is not None:
        print(f"{config.key} left out: {reason}", file=sys.stderr)
    return reason is not None


def first_divergence(a: List[int], b: List[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class Bench:
    def __init__(self, args, processor, greedy: bool):
        from session import SetupError, build_settings, load_pair, pair_preset
        from sampling.common import output_vocab_size
        from sampling.divergence import default_runner

        self.args = args
        self.processor, self.greedy = processor, greedy
        try:
            preset = pair_preset() if args.preset == "pair" else {}
            pair = load_pair(args.target or preset.get("target"), args.drafter or preset.get("drafter"), args.device, dtype=args.dtype,
                             quantize=args.quantize, trust_remote_code=args.trust_remote_code, cache=args.cache,
                             prepack=args.prepack, compile=args.compile, measure_dtype=preset.get("measure_dtype", False),
                             remeasure=args.remeasure)
        except SetupError as error:
            raise SystemExit(f"error: {error}") from None
        self.target, self.tokenizer, self.drafter, self.drafter_label = pair.target, pair.tokenizer, pair.drafter, pair.drafter_label
        self.compile_seconds = pair.compile_seconds  # role -> seconds, start-up compilation
        # weights, cache, runner and prepacking, as the REPL says them
        self.target_label = pair.describe("target") + pair.header_note()
        self.kernel_line = pair.notes.get("target", {}).get("kernels") or f"--prepack {args.prepack}"
        self.vocab = output_vocab_size(self.target)
        try:
            self.settings = build_settings(pair, self.processor, length=args.max_new_tokens, calibrate=not args.no_calibrate,
                                           adaptive=args.adaptive, pause=args.pause, min_gain=args.min_gain,
                                           remember=args.policy_memory, row_costs=args.row_costs, remeasure=args.remeasure)
        except SetupError as error:
            raise SystemExit(f"error: {error}") from None
        self.settings.hf_compile = args.compile
        self.settings.tree_size = args.tree_size
        policy = self.settings.policy
        if "auto" in args.gamma and policy.row_costs is None:
            raise SystemExit("error: --gamma auto needs plausible verification costs, and those measured were not (see above)")
        self.row_costs = policy.row_costs
        self.policies: Dict[Config, "DraftPolicy"] = {}  # each configuration's own (its memory, with --policy-memory)
        self.memories: Dict[tuple, object] = {}  # (configuration, repeat): a suffix memory across the prompts, in order
        self.runner_factory = default_runner  # the runner divergences are replayed with: the strategies' own kind

    def compile_for(self, items: List[dict]) -> None:
        """With ``--compile``: make the compiled graphs hold the longest prompt plus its new tokens,
        before any timed run (a larger cache is a new set of graphs); counted in ``compile_seconds``."""
        from utils.compiled import compile_wanted, prepare

        longest = max(len(item["prompt"]) for item in items) + self.args.max_new_tokens
        for role, model in (("target", self.target), ("drafter", self.drafter)):
            if model is not None and compile_wanted(model):
                seconds = prepare(model, longest, lambda text: print(f"{role}: {text} ...", file=sys.stderr))
                self.compile_seconds[role] = self.compile_seconds.get(role, 0.0) + seconds

    def compile_report(self) -> str:
        """The report's line on start-up compilation (never inside a timed run); empty without ``--compile``."""
        if not self.compile_seconds:
            return ""
        spent = ", ".join(f"{role} {seconds:.1f} s" for role, seconds in self.compile_seconds.items())
        return f"\n## compilation\n\nCompiled at start-up, outside every timed run: {spent}.\n"

    def items(self, rows: List[dict]) -> List[dict]:
        """One item per turn; a second turn follows the target's greedy answer to the first."""
        from session import encode
        from strategies import run_strategy

        items = []
        for row in rows:
            messages = []
            for turn, text in enumerate(row["turns"]):
                messages.append({"role": "user", "content": text})
                prompt = encode(self.tokenizer, messages, not self.args.no_chat)
                items.append({**row, "turn": turn, "prompt": prompt})
                if turn + 1 < len(row["turns"]):
                    answer = run_strategy(baseline().strategy, prompt, replace(self.settings, processor=self._greedy()), self.args.seed)
                    messages.append({"role": "assistant", "content": self.tokenizer.decode(answer.tokens, skip_special_tokens=True)})
        return items

    def _greedy(self):
        from utils.logits_processor import GreedyProcessor

        return GreedyProcessor()

    def settings_for(self, config: Config):
        from strategies import STORAGES

        auto = config.gamma == "auto"
        # a copy of the calibrated policy per configuration: what one remembers never reaches another
        policy = self.policies.setdefault(config, replace(self.settings.policy, auto=auto))
        return replace(self.settings, gamma=self.settings.gamma if auto else config.gamma, top_k_filler=config.filler, policy=policy,
                       storage=STORAGES[config.storage](config.n, self.vocab))

    def memory(self, config: Config, repeat: int):
        """The global memory a strategy with one keeps across the prompts of one repeat (None for the others)."""
        make = config.strategy.memory
        return self.memories.setdefault((config, repeat), make(self.settings)) if make is not None else None

    def run(self, config: Config, prompt: List[int], observer=None, repeat: int = 0):
        """One timed run; ``observer`` (an ``Observer``) sees its steps."""
        from strategies import run_strategy

        settings = replace(self.settings_for(config), suffix_memory=self.memory(config, repeat))
        return run_strategy(config.strategy, prompt, replace(settings, streamer=observer) if observer else settings, self.args.seed)

    def classify(self, prompt: List[int], reference: List[int], tokens: List[int], passes: list,
                 kernels: str = "", reference_kernels: str = "") -> dict:
        """A greedy divergence from target AR, classified (``sampling.divergence``), each computation
        replayed on the kernels its run had (``kernels``, ``reference_kernels``: "prepacked", "own",
        "": as the model is); a run whose loop recorded no pass (a transformers path) is "unclassified"."""
        from sampling.divergence import classify_divergence

        if not passes or getattr(self.target.config, "is_encoder_decoder", False):
            return {"verdict": "unclassified", "position": first_divergence(tokens, reference)}
        return classify_divergence(self.target, prompt, reference, tokens, passes, self._on(reference_kernels),
                                   self._on(kernels)).record()

    def _on(self, option: str):
        from sampling.divergence import on_kernels

        return on_kernels(self.runner_factory, option)

    def overhead(self, configs: List[Config], prompt: List[int]) -> Dict[str, float]:
        """Per configuration: the fraction of one run's wall time spent outside model forward passes
        (drafting, acceptance, storage updates, sampling glue), timed with forward hooks."""
        import time

        models = [m for m in (self.target, self.drafter) if m is not None]
        inside, started = [0.0], [0.0]
        hooks = [h for m in models for h in (
            m.register_forward_pre_hook(lambda *a: started.__setitem__(0, time.perf_counter())),
            m.register_forward_hook(lambda *a: inside.__setitem__(0, inside[0] + time.perf_counter() - started[0])))]
        shares = {}
        try:
            for config in configs:
                inside[0] = 0.0
                result = self.run(config, prompt)
                shares[config.label] = 1 - inside[0] / result.seconds if result.seconds else 0.0
        finally:
            for hook in hooks:
                hook.remove()
        return shares

    def verify_cost(self) -> Dict[int, float]:
        """Cost of one target pass over r positions relative to r = 1 (the calibration's, or measured now)."""
        from sampling import measure_row_costs

        costs = self.row_costs or measure_row_costs(self.target)
        return {rows: cost for rows, cost in enumerate(costs, 1)}


RESAMPLES = 2000  # bootstrap resamples per interval
NO_DIFFERENCE = "~"  # a ratio whose 95% interval includes 1.0


def ratio_interval(mine: Dict[tuple, List[float]], theirs: Dict[tuple, List[float]], resamples: int = RESAMPLES,
                   seed: int = 0) -> Optional[tuple]:
    """95% percentile bootstrap interval of the ratio ``summarize`` reports: the median over repeats of
    (tokens/s of ``mine``) / (tokens/s of ``theirs``), each tokens/s summed tokens over summed seconds.

    ``mine`` and ``theirs`` map (item, repeat) -> [tokens, seconds]. Each resample draws the items
    and the repeats with replacement, the same draws for both sides (the pairing is kept), from a
    generator seeded with ``seed``. None when only one (item, repeat) pair is shared: no spread to
    resample (the table says "n=1")."""
    import numpy as np

    shared = mine.keys() & theirs.keys()
    repeats = sorted({repeat for _, repeat in shared})
    items = sorted({item for item, _ in shared if all((item, repeat) in shared for repeat in repeats)}, key=repr)
    if len(items) * len(repeats) < 2:
        return None
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(len(items), [1 / len(items)] * len(items), size=resamples).astype(float)  # items drawn
    drawn = rng.integers(0, len(repeats), size=(resamples, len(repeats)))  # repeats drawn

    def rates(cells: Dict[tuple, List[float]]):
        tokens, seconds = (np.array([[cells[(item, repeat)][k] for repeat in repeats] for item in items]) for k in (0, 1))
        per_repeat = (counts @ tokens) / (counts @ seconds)  # resample x repeat
        return np.take_along_axis(per_repeat, drawn, axis=1)

    ratios = np.median(rates(mine) / rates(theirs), axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def ratio_cell(value: float, interval: Optional[tuple], exact: bool = False) -> str:
    """``1.52x [1.40-1.66]``, ``1.02x [0.97-1.08] ~`` (the interval includes 1.0), ``1.52x (n=1)``
    (one run: no interval); ``exact``: the baseline against itself, ``1.00x``."""
    if exact:
        return f"{value:.2f}x"
    if interval is None:
        return f"{value:.2f}x (n=1)"
    low, high = interval
    return f"{value:.2f}x [{low:.2f}-{high:.2f}]" + (f" {NO_DIFFERENCE}" if low <= 1.0 <= high else "")


def summarize(records: List[dict], groups: tuple = (DEFAULT_GROUP,)) -> List[dict]:
    """Per category (and 'all', and each group of categories present) and configuration: tokens/s
    (median over repeats, spread), speedup over target autoregressive within each repeat and against
    each peer run alongside, each with its bootstrap interval (``ratio_interval``), acceptance,
    tokens and drafts per step, divergences (classified: ``divergence_columns``)."""
    present = {r["category"] for r in records}
    memberships = defaultdict(list)
    for name, members in groups:
        if len(present & set(members)) > 1:
            for category in members:
                memberships[category].append(name)
    setups = {r["config"]: Config.of(r) for r in records}
    labels = {setup: label for label, setup in setups.items()}
    base_label = labels.get(baseline())
    groups = defaultdict(list)
    cells = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))  # (category, config) -> (item, repeat) -> [tokens, seconds]
    for r in records:
        for category in (r["category"], "all", *memberships[r["category"]]):
            groups[(category, r["config"], r["repeat"])].append(r)
            cell = cells[(category, r["config"])][((r["category"], r.get("question_id"), r.get("turn", 0)), r["repeat"])]
            cell[0] += r["new_tokens"]
            cell[1] += r["seconds"]
    per_repeat = {}
    for (category, config, repeat), runs in groups.items():
        tokens = sum(r["new_tokens"] for r in runs)
        seconds = sum(r["seconds"] for r in runs)
        per_repeat[(category, config, repeat)] = (tokens / seconds if seconds else 0.0, runs)
    rows = []
    for category, config in sorted({(c, k) for c, k, _ in per_repeat}):
        repeats = sorted(rep for c, k, rep in per_repeat if (c, k) == (category, config))
        tps = [per_repeat[(category, config, rep)][0] for rep in repeats]
        base = [per_repeat.get((category, base_label, rep), (0.0,))[0] for rep in repeats]
        speedups = [t / b for t, b in zip(tps, base) if b]
        runs = [r for rep in repeats for r in per_repeat[(category, config, rep)][1]]
        setup = setups[config]
        versus, versus_ci = {}, {}  # median over repeats of tokens/s against each transformers path run alongside
        for peer in compared_peers(setup.strategy):
            label = labels.get(Config.of({"key": peer, "gamma": setup.gamma}))
            ratios = [t / per_repeat[(category, label, rep)][0] for t, rep in zip(tps, repeats)
                      if per_repeat.get((category, label, rep), (0.0,))[0]]
            if ratios:
                versus[peer] = statistics.median(ratios)
                versus_ci[peer] = ratio_interval(cells[(category, config)], cells[(category, label)])
        speedup_ci = None if setup.strategy.baseline or not speedups else ratio_interval(
            cells[(category, config)], cells[(category, base_label)])
        drafted = sum(r["drafted"] for r in runs)
        steps = sum(r["target_passes"] for r in runs)
        median = statistics.median(tps)
        rows.append({
            "category": category, "scope": "all" if category == "all" else "group" if category not in present else "category",
            "config": config, "key": runs[0]["key"], "gamma": runs[0]["gamma"],
            "tokens_per_s": median, "spread_pct": 100 * (max(tps) - min(tps)) / median if median else 0.0,
            "speedup": statistics.median(speedups) if speedups else 0.0,
            "speedup_low": speedup_ci[0] if speedup_ci else None, "speedup_high": speedup_ci[1] if speedup_ci else None,
            "drafts_per_step": drafted / steps if steps and drafted else None,
            "max_draft": max((len(r.get("drafted_at") or []) for r in runs), default=0) if drafted else None,
            "acceptance": sum(r["accepted"] for r in runs) / drafted if drafted else None,
            "tokens_per_step": sum(r["new_tokens"] for r in runs) / steps if steps and drafted else None,
            "runs": len(runs), "diverged": sum(r["diverged_at"] is not None for r in runs), **divergence_columns(runs),
            "versus": versus, "versus_ci": versus_ci, "setup": setup,
        })
    return rows


def compared_peers(strategy: "Strategy") -> List[str]:
    """The transformers paths one of our strategies is compared with: those taking no gamma (a drafter
    model's only for a strategy with one), and its own peer (run at the same gamma)."""
    from strategies import PEERS

    return [] if strategy.peer else [p.key for p in PEERS if p.key == strategy.gamma_peer or (
        not p.takes_gamma and (not p.needs_drafter or strategy.needs_drafter))]


def versus_table(rows: List[dict]) -> List[str]:
    """Each of our strategies against transformers' paths run in the same repeats (ratio of tokens/s)."""
    from strategies import EVERY

    peers = sorted({p for r in rows for p in r.get("versus", {})})
    if not peers:
        return []
    lines = ["## against the peers run alongside", "", "Tokens/s ratio, median over repeats, with its 95% bootstrap interval, "
             "against " + ", ".join(f"{EVERY[p].peer} ({EVERY[p].title})" for p in peers) + ":", "",
             "| category | strategy | " + " | ".join(f"vs {EVERY[p].peer}" for p in peers) + " |",
             "| --- | --- |" + " ---: |" * len(peers)]
    order = ordered_categories(rows)
    for r in sorted((r for r in rows if r.get("versus")), key=lambda r: (order.index(r["category"]), r["config"])):
        lines.append(f"| {r['category']} | {r['config']} | "
                     + " | ".join(ratio_cell(r["versus"][p], r.get("versus_ci", {}).get(p)) if p in r["versus"] else "-"
                                  for p in peers) + " |")
    return lines + [""]


def ordered_categories(rows: List[dict]) -> List[str]:
    """Categories first, then groups of categories, then 'all'."""
    scope = {r["category"]: r.get("scope", "all" if r["category"] == "all" else "category") for r in rows}
    return sorted(scope, key=lambda c: (["category", "group", "all"].index(scope[c]), c))


def speedup_matrix(rows: List[dict]) -> List[str]:
    """One line per configuration, one column per category: the speedups at a glance."""
    categories = ordered_categories(rows)
    configs = sorted({r["config"] for r in rows}, key=lambda c: -next(r["speedup"] for r in rows if r["config"] == c and r["category"] == "all"))
    speed = {(r["category"], r["config"]): speedup_cell(r) for r in rows}
    lines = ["| strategy | " + " | ".join(categories) + " |", "| --- |" + " ---: |" * len(categories)]
    for config in configs:
        cells = [speed.get((c, config), "-") for c in categories]
        lines.append(f"| {config} | " + " | ".join(cells) + " |")
    return lines + [""]


def speedup_cell(r: dict) -> str:
    """A summary row's speedup over target AR with its interval (``ratio_cell``)."""
    interval = (r["speedup_low"], r["speedup_high"]) if r.get("speedup_low") is not None else None
    return ratio_cell(r["speedup"], interval, exact=r["setup"].strategy.baseline)


LEGEND = (f"Ratios: median over repeats [95% bootstrap interval over prompts and repeats, {RESAMPLES} resamples]; "
          f"{NO_DIFFERENCE}: no measurable difference (the interval includes 1.00x); n=1: one prompt, one repeat, no interval. "
          "Drafts/step: mean drafted tokens per target pass (the longest draft).")


def markdown(rows: List[dict], title: str) -> str:
    lines = [f"# {title}", "", LEGEND, "", "Speedup over target autoregressive, by category:", ""] + speedup_matrix(rows)
    for category in ordered_categories(rows):
        lines += [f"## {category}", "",
                  "| strategy | tokens/s | speedup | tokens/step | drafts/step | acceptance | greedy divergences |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in sorted((r for r in rows if r["category"] == category), key=lambda r: -r["speedup"]):
            step = f"{r['tokens_per_step']:.2f}" if r["tokens_per_step"] is not None else "-"
            drafts = f"{r['drafts_per_step']:.1f} (max {r['max_draft']})" if r.get("drafts_per_step") is not None else "-"
            acc = f"{r['acceptance']:.2f}" if r["acceptance"] is not None else "-"
            lines.append(f"| {r['config']} | {r['tokens_per_s']:.1f} ± {r['spread_pct']:.0f}% | {speedup_cell(r)} | {step} | {drafts} | "
                         f"{acc} | {divergence_cell(r)} |")
        lines.append("")
    return "\n".join(lines + versus_table(rows))


def theoretical_speedup(a: float, gamma: int, c: float) -> float:
    """Leviathan et al. (2023), eq. 1: expected speedup for acceptance rate a, draft length gamma, cost ratio c."""
    if a >= 1.0:
        return (gamma + 1) / (gamma * c + 1)
    return (1 - a ** (gamma + 1)) / ((1 - a) * (gamma * c + 1))


def plots(rows: List[dict], records: List[dict], out: Path) -> List[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    categories = ordered_categories(rows)
    configs = sorted({r["config"] for r in rows if not r["setup"].strategy.baseline})
    fig, ax = plt.subplots(figsize=(max(8, len(categories) * 1.4), 5))
    width = 0.8 / max(1, len(configs))
    by_cell = {(r["category"], r["config"]): r for r in rows}
    for i, config in enumerate(configs):
        cells = [by_cell.get((c, config)) for c in categories]
        values = [r["speedup"] if r else 0 for r in cells]
        ax.bar([x + i * width for x in range(len(categories))], values, width, label=config,
               yerr=error_bars(cells), capsize=2, error_kw={"linewidth": 0.8})
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(categories))], categories, rotation=30, ha="right")
    ax.set_ylabel("speedup over target autoregressive")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "speedup_by_category.png", dpi=120)
    written.append("speedup_by_category.png")
    plt.close(fig)

    # gamma auto has no number to plot against
    overall = [r for r in rows if r["category"] == "all" and r["acceptance"] is not None and isinstance(r["gamma"], int)]
    if len({r["gamma"] for r in overall}) > 1:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        for family, points in gamma_sweep(overall).items():
            members = {r["gamma"]: r for r in overall if r["setup"].family == family}
            left.errorbar([p[0] for p in points], [p[1] for p in points], yerr=error_bars([members[p[0]] for p in points]),
                          marker="o", capsize=2, label=family)
            right.plot([p[0] for p in points], [p[2] for p in points], marker="o", label=family)
        left.set(xlabel="gamma", ylabel="speedup", xscale="log", title="speedup against gamma")
        right.set(xlabel="gamma", ylabel="acceptance rate", xscale="log", title="acceptance against gamma")
        left.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "gamma_sweep.png", dpi=120)
        written.append("gamma_sweep.png")
        plt.close(fig)

    drafter_cost = _cost_ratio(rows)
    fig, ax = plt.subplots(figsize=(6, 5))
    for r in overall:
        c = drafter_cost if r["setup"].strategy.model_drafts else 0.0
        if c is None:
            continue
        ax.errorbar(theoretical_speedup(r["acceptance"], r["gamma"], c), r["speedup"], yerr=error_bars([r]), fmt="o", capsize=2,
                    label=r["config"])
    lim = max([1.5] + [r["speedup"] for r in overall] + [theoretical_speedup(r["acceptance"], r["gamma"], 0) for r in overall])
    ax.plot([0, lim], [0, lim], color="grey", linewidth=0.8)
    ax.set(xlabel="theoretical (1 - a^(g+1)) / ((1 - a)(g c + 1))", ylabel="measured speedup", title="measured against theory")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "theory.png", dpi=120)
    written.append("theory.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    by_config = defaultdict(lambda: ([], []))
    for r in records:
        drafted, accepted = by_config[r["config"]]
        for i, (d, a) in enumerate(zip(r["drafted_at"], r["accepted_at"])):
            if i >= len(drafted):
                drafted.append(0)
                accepted.append(0)
            drafted[i] += d
            accepted[i] += a
    for config, (drafted, accepted) in sorted(by_config.items()):
        if drafted:
            ax.plot(range(1, len(drafted) + 1), [a / d if d else 0 for a, d in zip(accepted, drafted)], marker="o", label=config)
    ax.set(xlabel="draft position", ylabel="acceptance rate", title="acceptance by draft position", ylim=(0, 1.05))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "acceptance_by_position.png", dpi=120)
    written.append("acceptance_by_position.png")
    plt.close(fig)
    return written


def error_bars(rows: List[Optional[dict]]) -> List[List[float]]:
    """matplotlib's yerr (below, above) for each row's speedup interval; 0 where there is none (n=1, baseline)."""
    below, above = [], []
    for r in rows:
        has = r is not None and r.get("speedup_low") is not None
        below.append(max(0.0, r["speedup"] - r["speedup_low"]) if has else 0.0)
        above.append(max(0.0, r["speedup_high"] - r["speedup"]) if has else 0.0)
    return [below, above]


def gamma_sweep(rows: List[dict]) -> Dict[str, List[tuple]]:
    """Per family (a configuration but its gamma), its (gamma, speedup, acceptance) points, by gamma."""
    families = defaultdict(list)
    for r in rows:
        families[r["setup"].family].append((r["gamma"], r["speedup"], r["acceptance"]))
    return {family: sorted(points) for family, points in sorted(families.items())}


def _cost_ratio(rows: List[dict]) -> Optional[float]:
    """Drafter time per token over target time per token, from the autoregressive runs of both."""
    target = next((r["tokens_per_s"] for r in rows if r["category"] == "all" and r["setup"].strategy.baseline), None)
    drafter = next((r["tokens_per_s"] for r in rows if r["category"] == "all" and r["setup"].strategy.drafter_ar), None)
    return target / drafter if target and drafter else None


def replay_report(args) -> None:
    """llama.cpp's lookup-stats: how often each storage would have predicted the next token."""
    from transformers import AutoTokenizer

    from ngram_assisted import replay
    from strategies import STORAGES
    from utils.models import embedded_model_dir, load_model

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir()) if not args.target else load_model(args.target, "cpu")[1]
    if args.corpus:
        texts = [Path(args.corpus).read_text(encoding="utf-8")]
    else:
        texts = [turn for row in load_prompts(args.prompts, args.categories, args.limit) for turn in row["turns"]]
    sequences = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    print("| storage | n | positions | predicted | correct | precision |\n| --- | ---: | ---: | ---: | ---: | ---: |")
    for kind in args.storages.split(","):
        for n in args.ngram_n:
            totals = [0, 0, 0]
            for seq in sequences:
                for i, value in enumerate(replay(STORAGES[kind](n, len(tokenizer)), seq)):
                    totals[i] += value
            positions, predicted, correct = totals
            precision = correct / predicted if predicted else 0.0
            print(f"| {kind} | {n} | {positions} | {predicted / positions:.1%} | {correct / positions:.1%} | {precision:.1%} |")


def main(argv: Optional[List[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    from session import SetupError, read_processor

    try:
        processor, processor_name, _ = read_processor(args.processor, "auto" in args.gamma, not args.no_calibrate)
    except SetupError as error:
        raise SystemExit(f"error: {error}") from None
    if args.replay:
        replay_report(args)
        return
    if args.from_runs:
        records = [json.loads(line) for line in Path(args.from_runs).read_text().splitlines() if line.strip()]
        write_reports(records, Path(args.out), f"re-made from {args.from_runs}", groups=args.group or (DEFAULT_GROUP,))
        return check_strict(records, args.strict)
    from tqdm import tqdm

    from sampling.divergence import PassRecorder

    rows = load_prompts(args.prompts, args.categories, args.limit)
    bench = Bench(args, processor, greedy=processor_name == "greedy")
    configs = make_configs(args, bench.drafter is not None)
    configs = [c for c in configs if not c.strategy.trees or not refuse_trees(bench.target, c)]
    if not bench.greedy:
        configs = [c for c in configs if not c.strategy.peer]  # transformers peers: greedy only
    items = bench.items(rows)
    bench.compile_for(items)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{len(items)} prompts x {len(configs)} configurations x {args.repeats} repeats, {args.max_new_tokens} new tokens",
          file=sys.stderr)
    if args.compile and any(c.key == "hf_generate_static" for c in configs):
        print("Compiling transformers' static-cache generate (in the excluded warm-up) ...", file=sys.stderr)
    for config in configs:  # warm-up, excluded
        bench.run(config, items[0]["prompt"][:32])
    bench.policies.clear()  # the warm-up leaves nothing in a policy's memory
    bench.memories.clear()  # nor in a suffix memory
    records = []
    with open(out / "runs.jsonl", "w") as log, tqdm(total=len(items) * len(configs) * args.repeats, file=sys.stderr) as bar:
        for index, (item, repeat) in enumerate((item, repeat) for item in items for repeat in range(args.repeats)):
            # rotate the order of the configurations from one run to the next, so that none
            # always follows the same other one (caches, clocks and the machine's drift)
            shift = index % len(configs)
            results = []
            for config in configs[shift:] + configs[:shift]:
                recorder = PassRecorder()  # one append per step: classifying waits until the timed runs are over
                results.append((config, bench.run(config, item["prompt"], recorder, repeat), recorder))
                bar.update(1)
            reference, reference_kernels = next((result.tokens, result.kernels) for config, result, _ in results
                                                if config.strategy.baseline)
            for config, result, recorder in sorted(results, key=lambda run: configs.index(run[0])):
                st = result.stats
                record = {
                    "question_id": item["question_id"], "category": item["category"], "turn": item["turn"],
                    "repeat": repeat, "config": config.label, "key": config.key, "gamma": config.gamma, "n": config.n,
                    "storage": config.storage, "filler": config.filler, "processor": args.processor,
                    "prompt_tokens": len(item["prompt"]), "new_tokens": len(result.tokens), "seconds": result.seconds,
                    "tokens_per_s": result.tokens_per_second, "drafted": st.drafted, "accepted": st.accepted,
                    "target_passes": st.target_forward_passes, "drafted_at": st.drafted_at, "accepted_at": st.accepted_at,
                    "paused_steps": st.paused_steps, "tokens": result.tokens, "steps": st.emitted_by_step,
                    "kernels": result.kernels, "drafts": st.drafted_by_step, "peer_settings": st.peer_settings or None,
                    "text": bench.tokenizer.decode(result.tokens, skip_special_tokens=True),
                    "diverged_at": first_divergence(result.tokens, reference) if bench.greedy and not config.strategy.drafter_ar else None,
                }
                record["divergence"] = None
                if record["diverged_at"] is not None:
                    record["divergence"] = bench.classify(item["prompt"], reference, result.tokens, recorder.passes,
                                                          result.kernels, reference_kernels)
                    tqdm.write(f"divergence: {config.label} on question {item['question_id']} turn {item['turn']} "
                               f"at token {record['diverged_at']}: {record['divergence']['verdict']}", file=sys.stderr)
                records.append(record)
                log.write(json.dumps(record) + "\n")
    title = (f"{bench.target_label}" + (f" + drafter {bench.drafter_label}" if bench.drafter_label else "")
             + f" · {args.processor} · {args.max_new_tokens} new tokens · {args.repeats} repeat(s)"
             + f" · policy: {bench.settings.policy.describe()}")
    if any(config.strategy.suffix for config in configs):
        title += f" · suffix: {bench.settings.suffix.describe()}" + (
            ", global memory over the earlier prompts' outputs" if any(config.strategy.memory for config in configs) else "")
    extra = kernels_report(records, bench.kernel_line) + bench.compile_report()
    if args.verify_cost:
        costs = bench.verify_cost()
        extra = ("\n## cost of a verification pass over r positions (r - 1 drafts), relative to r = 1\n\n"
                 "| r | cost |\n| ---: | ---: |\n")
        extra += "".join(f"| {k} | {v:.2f} |\n" for k, v in costs.items())
    if args.llama_cpp:
        extra += llama_cpp_report(bench, args, items[0]["prompt"])
    if args.overhead:
        shares = bench.overhead(configs, items[0]["prompt"])
        extra += "\n## time outside model forward passes (first prompt)\n\n| strategy | share |\n| --- | ---: |\n"
        extra += "".join(f"| {label} | {share:.1%} |\n" for label, share in shares.items())
    write_reports(records, out, title, extra, args.group or (DEFAULT_GROUP,))
    if args.specbench_out:
        from utils.specbench import baseline_count_check, write_answers

        written = write_answers(records, Path(args.specbench_out), Path(bench.target_label.split(" · ")[0]).stem, bench.tokenizer)
        print(f"wrote {len(written)} Spec-Bench answer files under {args.specbench_out}", file=sys.stderr)
        print(baseline_count_check(records, bench.tokenizer, baseline().label), file=sys.stderr)
    check_strict(records, args.strict)


def kernels_report(records: List[dict], measured: str) -> str:
    """The report's section on the target's linear layers: one line when every row ran the same, else
    one row each (a transformers peer on those of the row it is compared with); empty when nothing chose."""
    ran = {r["config"]: r.get("kernels", "") for r in records}
    if not any(ran.values()):
        return ""
    lines = ["", "## kernels", "", f"The target's linear layers, each row on those its passes run fastest on ({measured}).", ""]
    if len(set(ran.values())) == 1:
        return "\n".join(lines + [f"Every row: {next(iter(ran.values()))} linear layers.", ""])
    lines += ["| row | linear layers |", "| --- | --- |"] + [f"| {config} | {kernels} |" for config, kernels in sorted(ran.items())]
    return "\n".join(lines + [""])


def check_strict(records: List[dict], strict: bool) -> None:
    """With ``--strict``: exit with status 1, in one line, when any divergence is a disagreement."""
    bad = [r for r in records if (r.get("divergence") or {}).get("verdict") == "disagreement"]
    if strict and bad:
        raise SystemExit(f"error: --strict: {len(bad)} greedy divergence(s) are disagreements, not rounding near-ties "
                         f"(first: {bad[0]['config']} on question {bad[0]['question_id']} at token {bad[0]['diverged_at']})")


def divergence_columns(runs: List[dict]) -> dict:
    """Near-ties, disagreements, unclassified divergences, and the largest |margin| and rounding
    difference among the classified ones (None when there is none)."""
    found = [r["divergence"] for r in runs if r.get("divergence")]
    verdicts = [d["verdict"] for d in found]
    margins = [d for d in found if d.get("margin") is not None]
    return {"near_ties": verdicts.count("near-tie"), "disagreements": verdicts.count("disagreement"),
            "unclassified": verdicts.count("unclassified"),
            "max_margin": max((d["margin"] for d in margins), default=None),
            "max_rounding": max((d["rounding"] for d in margins), default=None)}


def divergence_cell(r: dict) -> str:
    """The table's "greedy divergences" cell: "0/6", or "2/6: 2 near-ties, margin <= 0.004, rounding <= 0.006"."""
    cell = f"{r['diverged']}/{r['runs']}"
    if not r["diverged"]:
        return cell
    names = (("near_ties", "near-tie", "near-ties"), ("disagreements", "disagreement", "disagreements"),
             ("unclassified", "unclassified", "unclassified"))
    parts = [f"{r[key]} {one if r[key] == 1 else many}" for key, one, many in names if r.get(key)]
    if r.get("max_margin") is not None:
        parts.append(f"margin <= {r['max_margin']:.2g}, rounding <= {r['max_rounding']:.2g}")
    return cell + (": " + ", ".join(parts) if parts else "")


def llama_cpp_tokens_per_s(binary: str, gguf: str, new_tokens: int, depth: int, threads: int) -> float:
    """llama.cpp's plain decoding speed (llama-bench's text-generation test, one repetition), tokens/s."""
    import subprocess

    base = [binary, "-m", gguf, "-p", "0", "-n", str(new_tokens), "-r", "1", "-t", str(threads), "-o", "json"]
    for command in (base + ["-d", str(depth)], base):  # -d (context depth) only in newer llama-bench
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode == 0:
            rows = json.loads(done.stdout)
            return float(next(r["avg_ts"] for r in rows if r.get("n_gen", 0) > 0))
    raise SystemExit(f"error: {binary} failed: {done.stderr.strip()[-300:]}")


def llama_cpp_report(bench, args, prompt: List[int]) -> str:
    """Target AR and llama.cpp's decoding of the same GGUF, alternated ``--repeats`` times (at least 3)."""
    import torch

    from utils.models import embedded_gguf

    gguf = args.gguf or str(embedded_gguf())
    threads = args.threads or torch.get_num_threads()
    ours, theirs = [], []
    for _ in range(max(3, args.repeats)):
        ours.append(bench.run(baseline(), prompt).tokens_per_second)
        theirs.append(llama_cpp_tokens_per_s(args.llama_cpp, gguf, args.max_new_tokens, len(prompt), threads))
    ratio = statistics.median(a / b for a, b in zip(ours, theirs))
    return (f"\n## llama.cpp, plain decoding of {Path(gguf).name} ({threads} threads), alternating with target AR\n\n"
            "| | tokens/s |\n| --- | ---: |\n"
            f"| llama.cpp | {statistics.median(theirs):.1f} |\n| target AR | {statistics.median(ours):.1f} |\n"
            f"| target AR / llama.cpp | {ratio:.2f}x |\n")


def versus_column(row: dict, peer: str, end: str) -> object:
    """summary.csv's vs_PEER, vs_PEER_low and vs_PEER_high cells (empty: not run, or no interval at n=1)."""
    if end == "":
        return row["versus"].get(peer, "")
    interval = row["versus_ci"].get(peer)
    return "" if interval is None else interval[end == "_high"]


def write_reports(records: List[dict], out: Path, title: str, extra: str = "", groups: tuple = (DEFAULT_GROUP,)) -> None:
    from strategies import PEERS

    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(records, groups)
    with open(out / "summary.csv", "w", newline="") as handle:
        flat = [{**{k: v for k, v in row.items() if k not in ("versus", "versus_ci", "setup")},
                 **{f"vs_{p.key}{end}": versus_column(row, p.key, end) for p in PEERS for end in ("", "_low", "_high")}}
                for row in summary]
        writer = csv.DictWriter(handle, fieldnames=list(flat[0]))
        writer.writeheader()
        writer.writerows(flat)
    report = markdown(summary, title) + extra
    (out / "results.md").write_text(report)
    written = plots(summary, records, out)
    print(report)
    print(f"wrote {out}/summary.csv, results.md, " + ", ".join(written), file=sys.stderr)

if __name__ == "__main__":
    main()
