"""What a run of the strategies is given, in two parts: ``RunConfig``, the values (everything a user
sets or a start-up measurement chose), frozen; and ``RunContext``, the live objects (the models, the
tokenizers, the n-gram storages, the suffix memory, the head, the stream, the policy's memory).

Both are built once per run (``app.session.build_settings``); a REPL command that changes a setting
replaces the config (``RunConfig.with_``), never changes it; the benchmark writes each run's
config beside its result (``RunConfig.to_dict``, read back by ``RunConfig.from_dict``). Every row
parameter, built-in or registered (``strategies.register``), is a ``Param`` in ``PARAMS``, and the
config holds the values set of all of them in one mapping (``RunConfig.param``).
"""
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable, Dict, List, Optional, Tuple

from torch.nn import Module

from drafters.spec import DraftContext
from drafters.suffix import SETTINGS as SUFFIX_SETTINGS, SuffixSettings
from ngram_assisted import INgramStorage, TieredStorage
from runners.config import EAGER, RunnerConfig
from measure.kernels import KernelChoice
from sampling.draft_policy import DraftPolicy
from sampling.policy_settings import PolicySettings
from utils.parsing import LIMITS, parse_processor


@dataclass(frozen=True)
class Param:
    """One parameter of a strategy row: its limits (``utils.parsing.LIMITS``), its REPL command (a
    registered row's ``/name <value>``; the built-in rows' are the built-in commands) and its line in
    /help, and ``RunConfig.param(name)``."""

    name: str
    type: type  # int or float
    default: Any
    low: Any
    high: Any
    help: str = ""

    def __post_init__(self):
        if self.type not in (int, float) or not self.low <= self.default <= self.high:
            raise ValueError(f"parameter {self.name}: an int or float type, and low <= default <= high")


def _built_in(name: str, kind: type, default: Any, help: str, limit: str = "") -> Param:
    return Param(name, kind, default, *LIMITS[limit or name], help)


# the built-in rows' parameters, in the one table with the registered rows' (their commands are built in)
BUILT_IN_PARAMS = (
    _built_in("top_k_filler", int, 3, "target top-k tokens added to the storage (1 = NAPD)"),
    _built_in("tree_size", int, 16, "most nodes of a draft tree (the calibrated policy keeps those that pay)"),
    _built_in("pld_min_ngram", int, 1, "prompt lookup: shortest n-gram matched", "pld_ngram"),
    _built_in("pld_max_ngram", int, 3, "prompt lookup: longest n-gram matched", "pld_ngram"),
    _built_in("pld_num_tokens", int, 10, "prompt lookup: drafts per step"),
    _built_in("max_tree_depth", int, 24, "suffix trie depth"),
    _built_in("max_spec_tokens", int, 24, "suffix drafts per step, at most"),
    _built_in("max_spec_factor", float, 1.0, "suffix drafts per token of the match"),
    _built_in("max_spec_offset", float, 0.0, "suffix drafts added to factor x match"),
    _built_in("min_token_prob", float, 0.1, "suffix drafts' lowest estimated probability"),
)
PARAMS: Dict[str, Param] = {p.name: p for p in BUILT_IN_PARAMS}  # every row parameter, by name (registered rows' too)


def processor_words(text: str) -> str:
    """The processor ``text`` names (the REPL's ``/processor`` words), written one way: its name
    and values (``"topk 0.7 20"``; ``"greedy"`` alone). ValueError, one line, for a bad one."""
    try:
        _, name, values = parse_processor(str(text).split())
    except ValueError as error:  # a UsageError: its message is the usage line
        raise ValueError(str(error)) from None
    shown = [] if name == "greedy" and values == {"temperature": 1.0} else [repr(v) for v in values.values()]
    return " ".join([name, *shown])


@dataclass(frozen=True)
class RunConfig:
    """The values a run of the strategies uses besides the prompt: they print, compare, hash and
    are written as JSON (``to_dict``). ``processor``: the sampling, as ``/processor`` takes it;
    ``eos_tokens_id``: the end tokens; ``stop_if_unknown``: NASD ends a draft at an unknown context
    (the REPL: on); ``hf_compile``: transformers' static-cache peer compiles its forward; ``policy``:
    the draft policy's values; ``kernel_choice``: the target's measured kernel options by pass
    width, the plan every row runs (None: the model's as they are); ``runner``, ``drafter_runner``: how the target's and the drafter
    model's passes run; ``drafter_head``: the output rows of a drafter model's passes while it drafts (``drafting_runner``; 0: all); ``params``: every row parameter set away from its default (``Param``); ``auto_rows``: the rows (by key)
    that run under gamma auto whatever ``gamma`` says, where the policy has measured costs (``strategies.row_config``: the
    REPL's NASD row when no gamma was given, named in its output; docs/reference.md)."""

    processor: str = "greedy"
    gamma: int = 4
    max_gen_len: int = 35
    eos_tokens_id: Tuple[int, ...] = ()
    use_cache: bool = True
    debug: bool = False
    stop_if_unknown: bool = False
    hf_compile: bool = False
    policy: PolicySettings = PolicySettings()
    kernel_choice: Optional[KernelChoice] = field(default=None, hash=False)  # a mapping inside: compared, not hashed
    runner: RunnerConfig = EAGER
    drafter_runner: RunnerConfig = EAGER
    drafter_head: int = 0
    params: Tuple[Tuple[str, Any], ...] = ()
    auto_rows: Tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "processor", processor_words(self.processor))
        object.__setattr__(self, "auto_rows", tuple(self.auto_rows))  # a list read back from JSON
        object.__setattr__(self, "eos_tokens_id", tuple(int(t) for t in self.eos_tokens_id))
        unknown = [name for name, _ in self.params if name not in PARAMS]
        if unknown:
            raise ValueError(f"unknown parameters: {', '.join(unknown)}")
        kept = {name: value for name, value in self.params if value != PARAMS[name].default}  # equal settings, equal configs
        object.__setattr__(self, "params", tuple(sorted(kept.items())))

    def param(self, name: str) -> Any:
        """The row parameter ``name``: as set, else its default."""
        for known, value in self.params:
            if known == name:
                return value
        return PARAMS[name].default

    @property
    def drafting_runner(self) -> RunnerConfig:
        """How a drafter model's passes run while it drafts: ``drafter_runner`` with ``drafter_head``'s rows
        (``runners.RunnerConfig.drafter_head``; the drafter alone, as a row of its own, computes them all)."""
        return self.drafter_runner.with_(drafter_head=self.drafter_head) if self.drafter_head else self.drafter_runner

    def value(self, name: str) -> Any:
        """The field or the row parameter ``name``."""
        return getattr(self, name) if name in _FIELDS else self.param(name)

    def with_(self, **changes) -> "RunConfig":
        """A copy with ``changes``: fields by name, row parameters (``PARAMS``) by theirs."""
        params = {name: value for name, value in changes.items() if name not in _FIELDS}
        own = {name: value for name, value in changes.items() if name in _FIELDS}
        if params:
            own["params"] = tuple({**dict(self.params), **params}.items())
        return replace(self, **own)

    def with_policy(self, **changes) -> "RunConfig":
        """A copy whose policy has ``changes``."""
        return replace(self, policy=replace(self.policy, **changes))

    def logits_processor(self):
        """The ``LogitsProcessor`` that ``processor`` names (a new one; it keeps no state)."""
        return parse_processor(self.processor.split())[0]

    @property
    def greedy(self) -> bool:
        return self.processor.split()[0] == "greedy"

    @property
    def suffix(self) -> SuffixSettings:
        """SuffixDecoding's settings, from their row parameters."""
        return SuffixSettings(**{name: self.param(name) for name in SUFFIX_SETTINGS})

    def to_dict(self) -> Dict[str, Any]:
        """Every value, as JSON takes it."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        choice = self.kernel_choice
        return {**out, "eos_tokens_id": list(self.eos_tokens_id), "policy": asdict(self.policy),
                "kernel_choice": None if choice is None else {k: list(v) for k, v in choice.seconds.items()},
                "runner": asdict(self.runner), "drafter_runner": asdict(self.drafter_runner), "params": dict(self.params),
                "auto_rows": list(self.auto_rows)}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "RunConfig":
        """The config ``to_dict`` wrote."""
        choice = data.get("kernel_choice")
        return cls(**{**data, "eos_tokens_id": tuple(data["eos_tokens_id"]), "policy": PolicySettings(**data["policy"]),
                      "kernel_choice": None if choice is None else KernelChoice({k: tuple(v) for k, v in choice.items()}),
                      "runner": RunnerConfig(**data["runner"]), "drafter_runner": RunnerConfig(**data["drafter_runner"]),
                      "params": tuple(data["params"].items())})


_FIELDS = frozenset(f.name for f in fields(RunConfig))


@dataclass
class RunContext:
    """The live objects a run of the strategies uses: the target and its tokenizer, the drafter model
    (its own tokenizer and prompt renderer when it has another vocabulary), the learned head, the
    n-gram storage (and its read-only static tier), the suffix memory (None: off), the stream (a
    callback, an observer, or a tuple of these) and ``policy_memory``: what a remembering policy
    learned of drafter models, kept across the run's generations."""

    target: Module
    tokenizer: Any
    drafter: Optional[Module] = None
    drafter_tokenizer: Any = None
    drafter_prompt: Optional[Callable[[List[int]], Optional[List[int]]]] = None
    head: Optional[Module] = None
    storage: Optional[INgramStorage] = None
    static_storage: Optional[INgramStorage] = None
    suffix_memory: Any = None
    streamer: Any = None
    policy_memory: dict = field(default_factory=dict)

    @property
    def encoder_decoder(self) -> bool:
        return bool(getattr(self.target.config, "is_encoder_decoder", False))

    def lookup_storage(self) -> Optional[INgramStorage]:
        """The n-gram storage a strategy drafts from: the generation's own, then the static tier."""
        return self.storage if self.static_storage is None else TieredStorage(self.storage, self.static_storage)

    def drafting(self) -> DraftContext:
        """The live objects a drafter spec draws on."""
        return DraftContext(tokenizer=self.tokenizer, drafter=self.drafter, drafter_tokenizer=self.drafter_tokenizer,
                            drafter_prompt=self.drafter_prompt, storage=self.lookup_storage(), memory=self.suffix_memory,
                            head=self.head)

    def policy(self, config: RunConfig) -> DraftPolicy:
        """One generation's ``DraftPolicy``: ``config``'s values, this run's memory."""
        return config.policy.policy(self.policy_memory)
