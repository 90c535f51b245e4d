"""How one generation runs: the configuration every public function builds once and the loops
take whole, and the observers through which anything outside a loop (a screen, a stream) sees it."""
from dataclasses import dataclass, field
from typing import Any, Callable, List, Mapping, Sequence, Tuple

from runners.config import EAGER, RunnerConfig
from sampling.common import stop_token_set
from utils.parsing import check_positive_int
from sampling.draft_policy import DraftPolicy
from sampling.stats import GenerationStats
from utils.logits_processor import GreedyProcessor, LogitsProcessor


@dataclass(frozen=True)
class Step:
    """One step of a generation, as observers see it: a verification pass of a speculative loop,
    or one token of plain decoding (``speculative`` false, nothing proposed)."""

    tokens: List[int]  # the sequence after the step, prompt included (the loop's own list: read only)
    start: int  # where the step's tokens begin in ``tokens``
    prompt_length: int
    proposed: List[int]  # drafts verified in the step
    accepted: int  # how many of them the target accepted
    own: int  # the target's own token after the accepted drafts
    stopped: bool  # the step emitted a stop token: the generation ends with it
    speculative: bool = True
    rows: int = 1  # positions the step's target pass scored (drafts + 1, or more when padded)

    @property
    def emitted(self) -> List[int]:
        """The step's new tokens: accepted drafts then the target's own token, cut after a stop token."""
        return self.tokens[self.start :]


class Observer:
    """Sees a generation from outside its loop; every method does nothing unless overridden."""

    def on_step(self, step: Step) -> None:
        """After each step, once its tokens are in ``step.tokens``."""

    def on_beams(self, beams: Sequence[Tuple[float, List[int]]], position: int) -> None:
        """After each beam search step: the kept beams as (score, tokens with the prompt), the newest at ``position - 1``."""


class Streamer(Observer):
    """The public functions' ``streamer(tokens, n_drafted)`` callback as an observer: each step's
    emitted tokens, the first ``n_drafted`` of them accepted drafts."""

    def __init__(self, callback: Callable[[List[int], int], None]):
        self.callback = callback

    def on_step(self, step: Step) -> None:
        emitted = step.emitted
        self.callback(emitted, min(step.accepted, len(emitted)))


@dataclass(frozen=True)
class GenerationConfig:
    """Everything a generation loop needs besides the prompt, the models and the drafter: built once
    per generation (from a public function's arguments, or a strategy row's ``RunConfig``), carried
    whole, never changed (``dataclasses.replace`` makes another).

    ``gamma`` bounds the drafts per step (``policy`` may choose fewer, or more only with
    ``policy.auto``); with ``trees`` it is a draft tree's most nodes and ``sampling.generate`` runs the
    tree loop. ``vocab_size`` is the number of logit columns drafter and target share (None: all of
    them). The generation's own live parts: ``policy`` (its state is the generation's), ``stats``
    (filled as it goes) and ``observers``."""

    processor: LogitsProcessor = field(default_factory=GreedyProcessor)
    max_gen_len: int = 40
    stop_tokens: frozenset = frozenset()
    use_cache: bool = False
    first_target: bool = True
    gamma: int = 5
    trees: bool = False
    skip_sample_adjustment: bool = False
    vocab_size: int | None = None
    policy: DraftPolicy = field(default_factory=DraftPolicy)
    stats: GenerationStats = field(default_factory=GenerationStats)
    observers: Tuple[Observer, ...] = ()
    runner: RunnerConfig = EAGER  # how the target's passes run: cache kind, compiled or not
    drafter_runner: RunnerConfig = EAGER  # how a drafter model's passes run

    @classmethod
    def of(cls, arguments: Mapping[str, Any], **fields) -> "GenerationConfig":
        """The configuration a public function's ``arguments`` (its ``locals()``) describe, by the
        reference's names: ``logits_processor``, ``max_gen_len``, ``eos_tokens_id``, ``use_cache``,
        ``first_target``, ``gamma``, ``trees``, ``skip_sample_adjustment``, ``debug`` (the debug view, with
        ``tokenizer``), and this project's ``stats``, ``policy``, ``streamer``, ``runner`` and
        ``drafter_runner`` (``RunnerConfig``s; the drafter's defaults to the target's) and ``compile``
        (a bool that overrides both configurations' ``compile``). ``fields`` set fields directly.
        Every value is checked here, once."""
        a = dict(arguments)
        observers = []
        if a.get("debug"):
            from utils.printing import DebugView  # the screen is imported only when a caller asks for it

            observers.append(DebugView(a.get("tokenizer")))
        streamer = a.get("streamer")  # a callback, an Observer, or a tuple of these
        for each in streamer if isinstance(streamer, tuple) else () if streamer is None else (streamer,):
            observers.append(each if isinstance(each, Observer) else Streamer(each))
        values = dict(
            processor=a.get("logits_processor", GreedyProcessor()),
            max_gen_len=check_positive_int("max_gen_len", a.get("max_gen_len", 40)),
            stop_tokens=stop_token_set(a.get("eos_tokens_id", 1)),
            use_cache=bool(a.get("use_cache", False)),
            first_target=bool(a.get("first_target", True)),
            gamma=check_positive_int("gamma", a.get("gamma", 5)),
            trees=bool(a.get("trees", False)),
            skip_sample_adjustment=bool(a.get("skip_sample_adjustment", False)),
            policy=a["policy"] if a.get("policy") is not None else DraftPolicy(),
            stats=a["stats"] if a.get("stats") is not None else GenerationStats(),
            observers=tuple(observers),
            **_runner_configs(a.get("runner"), a.get("drafter_runner"), a.get("compile")),
        )
        return cls(**{**values, **fields})

    def make_runner(self, model, encoder_input_ids: List[int] | None = None, drafter: bool = False):
        """The runner of ``model`` for this generation, as ``runner`` (``drafter_runner`` for a
        drafter model) says: its cache kind, compiled passes where the model can take them."""
        from runners import make_runner

        return make_runner(model, self.use_cache, encoder_input_ids, self.drafter_runner if drafter else self.runner)

    def observe(self, step: Step) -> None:
        for observer in self.observers:
            observer.on_step(step)


def _runner_configs(runner: RunnerConfig | None, drafter_runner: RunnerConfig | None, compile: bool | None) -> dict:
    """The target's and the drafter's ``RunnerConfig`` from a public function's arguments."""
    for name, value in (("runner", runner), ("drafter_runner", drafter_runner)):
        if value is not None and not isinstance(value, RunnerConfig):
            raise TypeError(f"{name} must be a runners.RunnerConfig, got {type(value).__name__}")
    runner = runner or EAGER
    drafter_runner = drafter_runner or runner
    if compile is not None:
        runner, drafter_runner = runner.with_(compile=bool(compile)), drafter_runner.with_(compile=bool(compile))
    return dict(runner=runner, drafter_runner=drafter_runner)
