"""The one description of the decoding strategies, read by the REPL (and the benchmark).

Each strategy has a key, a title, what it needs and takes (a drafter, a draft length, an n-gram
storage), its part in the benchmark (baseline, drafter alone, transformers peer, the peer it is
compared with), and how it runs on a prompt with a run's values (``RunConfig``) and live objects
(``RunContext``, both in ``configuration.py``): a function that returns the new tokens and their
statistics (ours in ``rows.py``, transformers' in ``peers.py``), or the drafter spec it builds from
the config (``spec``; a registered row: the drafter it makes, ``drafter``), run through the one
entry, ``sampling.generate``.
"""
import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

import torch

from configuration import PARAMS, Param, RunConfig, RunContext  # noqa: F401 (importable from here)
from ngram_assisted.persistence import KINDS as STORAGES  # noqa: F401 (the one table of storage kinds)
from sampling import GenerationStats
from peers import (  # transformers' paths, the benchmark's peers
    ASSISTANT_FIELDS,  # noqa: F401 (importable from here, as before)
    _hf_assisted,
    _hf_assisted_default,
    _hf_generate,
    _hf_generate_static,
    _hf_prompt_lookup,
    transformers_assisted_defaults,
)
from peers_openvino import _ov_plain, _ov_pld, _ov_pld10, unavailable as unavailable_openvino  # OpenVINO GenAI's rows
from rows import (  # our strategies' run functions, and the drafter specs of those that run through sampling.generate
    _arctic, _arctic_memory, _autoregressive, _chained, _drafter_ar, _eagle, _eagle_tree, _merged, _ngram, _prompt_lookup,
    _recycling, _speculative, _suffix, _suffix_memory, _target_eager, _tree_copy, _tree_ngram, _tree_suffix, arguments, spec_row,
)
from kernels.one_copy import held
from measure.kernels import OWN, PREPACKED, model_label
from runners import kernels, prepacked, synchronize

Run = Callable[[List[int], RunConfig, RunContext, GenerationStats], List[int]]  # a row's run: the new tokens


@dataclass
class Result:
    tokens: List[int]
    seconds: float
    stats: GenerationStats
    kernels: str = ""  # the target's linear layers during the run: "prepacked", "own" ("": not a choice here)
    config: Optional[RunConfig] = None  # the values it ran with

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Strategy:
    key: str
    title: str
    color: str
    needs_drafter: bool  # a drafter model (``RunContext.drafter``)
    speculative: bool
    decoder_only: bool
    # runs the row; None for a row that gives ``spec`` or ``drafter`` instead (run by ``sampling.generate``)
    generate: Optional[Run] = None
    takes_gamma: bool = False  # drafts at most ``RunConfig.gamma`` tokens a step
    auto_gamma: bool = False  # also lets the calibrated policy choose the draft length (gamma "auto")
    model_drafts: bool = False  # every draft is the drafter model's: its cost counts in the expected speedup
    takes_storage: bool = False  # drafts from an n-gram storage (kind, n, filler top-k)
    storages: Tuple[str, ...] = ()  # the storage kinds the benchmark runs it with; empty: those asked for
    baseline: bool = False  # target autoregressive: every speedup's denominator, every greedy run's reference
    drafter_ar: bool = False  # the drafter model alone: a draft's cost against the baseline, not the target's output
    peer: str = ""  # a transformers path (greedy only): how the benchmark names it in its table against them
    gamma_peer: str = ""  # the transformers peer that drafts as this strategy does, compared at the same gamma
    memory: Optional[Callable[[RunConfig, RunContext], object]] = None  # the benchmark gives it this memory across prompts (``suffix_memory``)
    suffix: bool = False  # takes ``RunConfig.suffix`` (the benchmark reports them)
    requires: str = ""  # an optional package it needs: the benchmark skips it, with a line, when not installed
    trees: bool = False  # verifies draft trees (``tree_size`` nodes at most): needs full attention (tree_unsupported)
    label_words: str = ""  # what else its benchmark label says it ran (a transformers peer's settings)
    drafter: Optional[Callable[[List[int], RunConfig], Any]] = None  # make(prompt, config) -> a drafters.Drafter
    params: Tuple[Param, ...] = ()  # its own settings (``Param``): REPL commands, limits, /help, benchmark label
    help: str = ""  # its REPL toggle's line in /help (default: the title)
    needs_head: bool = False  # drafts with a learned head (``RunContext.head``): skipped, or refused in the REPL, without one
    spec: Optional[Callable[[RunConfig], Any]] = None  # spec(config) -> the drafters.DrafterSpec the row runs
    unavailable: Optional[Callable[[Any], str]] = None  # unavailable(bench args) -> why it cannot run here ("": it can)
    versus: str = ""  # the row of its own engine it is also compared with (its own baseline), by key
    engine: str = ""  # another engine runs it, not the target's torch model: its name, the report's kernels for it

    def __post_init__(self):
        if self.generate is None and self.drafter is None and self.spec is None:
            raise ValueError(f"strategy {self.key}: give generate, spec or drafter")
        if self.generate is None:
            object.__setattr__(self, "generate", spec_row(self.spec) if self.spec is not None else _drafter_row(self))
        if self.params and not self.label_words:
            object.__setattr__(self, "label_words", " ".join(f"{p.name}={p.default}" for p in self.params))


def _drafter_row(strategy: "Strategy") -> Run:
    """A row's run from its ``drafter``: ``sampling.generate`` with the config, at most its ``gamma``
    drafts a step (``tree_size`` nodes for a tree row)."""
    from sampling import generate

    def run(prompt: List[int], config: RunConfig, context: RunContext, stats: GenerationStats) -> List[int]:
        values = dict(arguments(config, context, stats), trees=strategy.trees,
                      gamma=config.param("tree_size") if strategy.trees else config.gamma)
        return generate(prompt, context.target, lambda p, _: strategy.drafter(p, config), values)[0]

    return run


STRATEGIES = [
    Strategy("speculative", "Speculative", "green", True, True, False, _speculative, takes_gamma=True, auto_gamma=True,
             model_drafts=True, gamma_peer="hf_assisted", help="speculative decoding with the drafter"),
    Strategy("ngram", "N-gram assisted", "yellow", False, True, True, _ngram, takes_gamma=True, auto_gamma=True,
             takes_storage=True, help="n-gram assisted speculative decoding"),
    Strategy("pld", "Prompt lookup", "magenta", False, True, True, spec=_prompt_lookup, help="prompt lookup decoding"),
    Strategy("chained", "Chained n-gram+drafter", "bright_green", True, True, True, spec=_chained, takes_gamma=True,
             auto_gamma=True, takes_storage=True, storages=("basic",),
             help="n-gram storage drafts, drafter model when it knows nothing"),
    Strategy("suffix", "Suffix tree", "bright_magenta", False, True, True, spec=_suffix, suffix=True,
             help="suffix-tree drafting (SuffixDecoding)"),
    Strategy("tree_ngram", "N-gram tree", "bright_yellow", False, True, True, spec=_tree_ngram, takes_storage=True,
             storages=("basic",), trees=True, help="n-gram storage drafts a tree of its top branches, verified in one pass"),
    Strategy("recycling", "Token recycling", "bright_magenta", False, True, True, spec=_recycling, trees=True,
             help="token recycling: a static tree from the target's past top-k, verified in one pass"),
    Strategy("tree_suffix", "Suffix tree, draft trees", "magenta", False, True, True, spec=_tree_suffix, suffix=True, trees=True,
             help="suffix tree drafts a tree of its most frequent branches, verified in one pass"),
    Strategy("tree_copy", "Copy tree (best occurrences, gated)", "bright_red", False, True, True, spec=_tree_copy, trees=True,
             help="the best earlier occurrences' next tokens as siblings, the best continued, gated by match length, in one pass"),
    Strategy("merged", "Merged tree (suffix, n-gram, recycling, drafter)", "bright_cyan", False, True, True, spec=_merged,
             takes_storage=True, storages=("basic",), suffix=True, trees=True,
             help="one draft tree merged from every drafter (and the head, with one), verified in one pass"),
    Strategy("eagle", "EAGLE-3 head", "bright_blue", False, True, True, spec=_eagle, takes_gamma=True, needs_head=True,
             help="the learned EAGLE-3 head drafts chains from the target's hidden states (--head)"),
    Strategy("eagle_tree", "EAGLE-3 head, dynamic trees", "blue", False, True, True, spec=_eagle_tree, trees=True,
             needs_head=True, help="the learned EAGLE-3 head drafts dynamic trees (EAGLE-2), verified in one pass"),
    Strategy("target", "Target AR", "blue", False, False, False, lambda p, c, x, st: _autoregressive(x.target, p, c, x, st),
             baseline=True, help="target autoregressive"),
    Strategy("drafter", "Drafter AR", "cyan", True, False, False, _drafter_ar, drafter_ar=True, help="drafter autoregressive"),
]
BY_KEY = {s.key: s for s in STRATEGIES}


class Registration:
    """What ``register`` added, removed by ``unregister()`` (or on leaving its ``with`` block)."""

    def __init__(self, strategy: Strategy):
        self.strategy = strategy

    def unregister(self) -> None:
        from utils.parsing import LIMITS

        key = self.strategy.key
        if BY_KEY.get(key) is self.strategy:
            STRATEGIES.remove(self.strategy)
            del BY_KEY[key], EVERY[key]
            for param in self.strategy.params:
                PARAMS.pop(param.name, None)
                LIMITS.pop(param.name, None)

    def __enter__(self) -> Strategy:
        return self.strategy

    def __exit__(self, *exc) -> None:
        self.unregister()


def register(strategy: Strategy) -> Registration:
    """Add a row: the REPL shows its toggle ``/key`` and a command per parameter, the benchmark runs
    it by key (``--strategies``), ``utils.parsing.LIMITS`` holds its parameters' ranges."""
    from utils.parsing import LIMITS

    if strategy.key in EVERY:
        raise ValueError(f"a strategy {strategy.key!r} exists already")
    taken = [p.name for p in strategy.params if p.name in LIMITS or p.name in PARAMS]
    if taken:
        raise ValueError(f"parameter names taken already: {', '.join(taken)}")
    STRATEGIES.append(strategy)
    BY_KEY[strategy.key] = EVERY[strategy.key] = strategy
    for param in strategy.params:
        PARAMS[param.name] = param
        LIMITS[param.name] = (param.type(param.low), param.type(param.high))
    return Registration(strategy)


def set_seed(seed: int) -> None:
    import random

    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def row_kernels(strategy: Strategy, config: RunConfig) -> Optional[str]:
    """The target's kernels for ``strategy``'s row: None, the model's plan as the kernel measurement
    gave it (``KernelChoice``: each pass width on its faster kernels), the same for every row, so that
    no row pays for a choice made for another width; the model's own layers for transformers' compiled
    static-cache peer, which compiles them (a prepacked one would be our kernel inside its graph)."""
    if strategy.key == "hf_generate_static" and config.hf_compile:
        return OWN
    return None


def row_config(strategy: Strategy, config: RunConfig) -> RunConfig:
    """The values ``strategy``'s row runs with: ``config``, under gamma auto (its policy's ``auto``: the
    length cost-optimal up to the longest measured pass) when the row is one of ``config.auto_rows``, takes
    gamma auto and the policy has the measured costs auto needs; else ``config`` as it is (gamma its bound)."""
    policy = config.policy
    if strategy.key in config.auto_rows and strategy.auto_gamma and policy.row_costs is not None and not policy.auto:
        return config.with_policy(auto=True)
    return config


def row_setting(strategy: Strategy, config: RunConfig) -> str:
    """What ``row_config`` changed for ``strategy``'s row, as its label says it ("gamma auto"); "" when nothing."""
    return "gamma auto" if row_config(strategy, config) is not config else ""


def auto_rows_line(strategies, config: RunConfig, drafter: bool = True) -> str:
    """The rows among ``strategies`` that ``row_config`` puts under gamma auto, with their bound, for a
    header: "N-gram assisted: gamma auto (4 first, up to 11)"; "" when none. Rows that need a drafter
    model are named only with one (``drafter``)."""
    rows = [s for s in strategies if row_setting(s, config) and (drafter or not s.needs_drafter)]
    if not rows:
        return ""
    most = min(config.policy.max_gamma, max(config.gamma, row_config(rows[0], config).policy.bound()))
    return f"{', '.join(s.title for s in rows)}: gamma auto ({config.gamma} first, up to {most})"


def run_strategy(strategy: Strategy, prompt: List[int], config: RunConfig, context: RunContext, seed: int = 42) -> Result:
    """Run one strategy with ``config``'s values as its row takes them (``row_config``) and ``context``'s
    live objects, after ``seed``, on its row's kernels (``row_kernels``), timing it with the device
    synchronised on both ends."""
    config = row_config(strategy, config)
    target = context.target
    models = [m for m in (target, context.drafter) if m is not None]
    option = row_kernels(strategy, config)
    # a row on the model's own layers (transformers' compiled peer) gets its own weights back for the
    # row, where the C step freed them (``kernels.one_copy``): MKL over them, not over ones unblocked per pass
    own_weights = held(target) if option == OWN else contextlib.nullcontext()
    with kernels(target, None if option is None else option == PREPACKED), own_weights:
        set_seed(seed)
        stats = GenerationStats()
        for model in models:
            synchronize(model)
        start = time.perf_counter()
        tokens = strategy.generate(prompt, config, context, stats)
        for model in models:
            synchronize(model)
        seconds = time.perf_counter() - start
        used = model_label(target) if option is not None or prepacked(target) or config.kernel_choice is not None else ""
    ours = not strategy.peer or strategy.key == "target_eager"  # rows whose target passes go through config.runner
    if config.runner.gguf is not None and ours and not strategy.drafter_ar:
        used = "llama.cpp"
    if strategy.engine:
        used = strategy.engine
    return Result(tokens, seconds, stats, used, config)


# ---- peers: transformers' own generation paths, for the benchmark (their code: ``peers.py``) ----
_HF_DEFAULTS = transformers_assisted_defaults()
PEERS = [
    Strategy("target_eager", "Target AR, eager runner", "blue", False, False, False, _target_eager,
             peer="target AR on our eager runner"),
    Strategy("hf_generate", "transformers generate", "white", False, False, True, _hf_generate, peer="generate"),
    Strategy("hf_generate_static", "transformers generate, static cache (compiled by transformers on CUDA; on CPU with --compile)",
             "white", False, False, True, _hf_generate_static, peer="generate (static cache)"),
    Strategy("hf_prompt_lookup", "transformers prompt lookup, our pld's settings", "white", False, False, True, _hf_prompt_lookup,
             peer="prompt lookup", label_words=f"g={PARAMS['pld_num_tokens'].default} n<={PARAMS['pld_max_ngram'].default}"),
    Strategy("hf_assisted", "transformers assisted, same draft length, constant, no confidence stop", "white", True, False, True,
             _hf_assisted, takes_gamma=True, model_drafts=True, peer="assisted, same draft length", label_words="constant"),
    Strategy("hf_assisted_default", "transformers assisted, its defaults ({num_assistant_tokens} tokens, "
             "{num_assistant_tokens_schedule}, confidence stop {assistant_confidence_threshold})".format(**_HF_DEFAULTS),
             "white", True, False, True, _hf_assisted_default, model_drafts=True, peer="assisted, transformers' defaults",
             label_words="{num_assistant_tokens} {num_assistant_tokens_schedule} conf={assistant_confidence_threshold}".format(
                 **_HF_DEFAULTS)),
]
# run by the benchmark only (the REPL runs suffix with its /suffix_global memory): the suffix
# drafter with a global memory across the prompts, and the authors' implementation (arctic-inference,
# optional) through our verification loop, without and with its global tree
SUFFIX_PEERS = [
    Strategy("suffix_global", "Suffix tree + global memory", "bright_magenta", False, True, True, spec=_suffix, memory=_suffix_memory,
             suffix=True),
    Strategy("arctic", "arctic-inference suffix", "bright_white", False, True, True, spec=_arctic, suffix=True,
             requires="arctic_inference"),
    Strategy("arctic_global", "arctic-inference suffix + global tree", "bright_white", False, True, True, spec=_arctic,
             memory=_arctic_memory, suffix=True, requires="arctic_inference"),
]
# OpenVINO GenAI (optional: make openvino; docs/openvino.md), run when named: its plain decoding and its prompt
# lookup on the embedded model's float32 export, each prompt lookup row compared with its plain row too
_OV = dict(unavailable=unavailable_openvino, engine="OpenVINO GenAI")
OPENVINO_PEERS = [
    Strategy("ov_plain", "OpenVINO GenAI, plain greedy decoding", "bright_white", False, False, True, _ov_plain,
             peer="OpenVINO plain", label_words="f32", **_OV),
    Strategy("ov_pld", "OpenVINO GenAI prompt lookup, its sample's settings", "bright_white", False, False, True, _ov_pld,
             peer="OpenVINO prompt lookup", label_words="g=5 n<=3", versus="ov_plain", **_OV),
    Strategy("ov_pld10", "OpenVINO GenAI prompt lookup, our pld's draft count", "bright_white", False, False, True, _ov_pld10,
             peer="OpenVINO prompt lookup", label_words="g=10 n<=3", versus="ov_plain", **_OV),
]
EVERY = {s.key: s for s in STRATEGIES + PEERS + SUFFIX_PEERS + OPENVINO_PEERS}  # ours and transformers' paths, by key
