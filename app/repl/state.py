"""What a REPL command reads and changes: the REPL's state as a Protocol, so that the commands
(``app.repl.commands``) need not import the REPL (``app.repl.repl``), which dispatches to them."""
from typing import TYPE_CHECKING, Any, Dict, List, Protocol, Tuple

if TYPE_CHECKING:
    from sampling import SuffixMemory
    from strategies import Settings


class ReplState(Protocol):
    settings: "Settings"
    enabled: Dict[str, bool]  # strategy key -> run on each prompt
    chat: bool
    processor_name: str
    processor_args: Dict[str, Any]
    storage_kind: str
    storage_n: int
    reset_in_between: bool
    stream: bool
    last: List[Tuple[Any, Any]]  # (strategy, result) of the last prompt, for /stats
    suffix_memory: "SuffixMemory"  # the global suffix memory, on or off (/suffix_global)

    def new_storage(self) -> None:
        """A new empty n-gram storage of ``storage_kind`` and ``storage_n``."""

    def value_of(self, name: str) -> str:
        """The current value of the command ``name``, as /help shows it."""
