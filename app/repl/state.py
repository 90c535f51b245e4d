"""What a REPL command reads and changes: the REPL's state as a Protocol, so that the commands
(``app.repl.commands``) need not import the REPL (``app.repl.repl``), which dispatches to them; and
where each command's value lives (``Owner``: the run's config, replaced, or the REPL's own state)."""
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Protocol, Tuple

if TYPE_CHECKING:
    from configuration import RunConfig, RunContext
    from sampling import SuffixMemory


class ReplState(Protocol):
    config: "RunConfig"  # the run's values: a command that changes one replaces it
    context: "RunContext"  # the run's live objects: models, storages, the suffix memory on or off
    enabled: Dict[str, bool]  # strategy key -> run on each prompt
    chat: bool
    processor_name: str  # read from the config's processor
    processor_args: Dict[str, Any]
    storage_kind: str
    storage_n: int
    reset_in_between: bool
    stream: bool
    rounds: int  # interleaved rounds of each comparison (app.repl.rounds)
    last: List[Tuple[Any, Any]]  # (strategy, result) of the last prompt, for /stats
    startup: Tuple[str, ...]  # the start-up lines in full (each model's, the measurements), for /stats
    suffix_memory: "SuffixMemory"  # the global suffix memory, on or off (/suffix_global)

    def new_storage(self) -> None:
        """A new empty n-gram storage of ``storage_kind`` and ``storage_n``."""

    def value_of(self, name: str) -> str:
        """The current value of the command ``name``, as /help shows it."""


@dataclass(frozen=True)
class Owner:
    """Where a command's value lives: ``get(repl, name)`` reads it, ``set(repl, name, value)`` changes it."""

    get: Callable[[ReplState, str], Any]
    set: Callable[[ReplState, str, Any], None]


def _set_config(repl, name: str, value) -> None:
    repl.config = repl.config.with_(**{name: value})


def _set_policy(repl, name: str, value) -> None:
    repl.config = repl.config.with_policy(**{name: value})


# the run's config (a field or a row parameter) and its policy: replaced, never changed; the REPL's own state
SETTINGS = Owner(lambda repl, name: repl.config.value(name), _set_config)
POLICY = Owner(lambda repl, name: getattr(repl.config.policy, name), _set_policy)
REPL = Owner(getattr, setattr)
