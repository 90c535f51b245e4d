"""One-time work a process does lazily, logged: each race of a choice kept for the process (``kernels.bf16_choice``'s
path and many-row variant, ``kernels.ahead``'s prefetch distance), each C step made (``kernels.c_step.CStep``), each
drafter's output rows copied (``kernels.head_rows.HeadRows``). The programs do such work before anything is timed
(the start-up measurements, the REPL's and the benchmark's untimed warm-up); ``count`` before and after a timed run
tells whether one paid for it (tests/test_first_round.py), and ``since`` names what and when (docs/startup.md, "One-time
work"). Recording only: nothing here changes what runs or a bit of any output."""
import time
from dataclasses import dataclass
from typing import List, Tuple

START = time.perf_counter()


@dataclass(frozen=True)
class Event:
    """One piece of one-time work: ``at`` seconds after this module's import, its ``kind`` ("race", "C step",
    "drafter rows"), ``what`` in a few words, and the ``seconds`` it took."""

    at: float
    kind: str
    what: str
    seconds: float

    def line(self) -> str:
        return f"{self.at:9.3f} s  {self.kind}: {self.what} ({self.seconds * 1e3:.1f} ms)"


_EVENTS: List[Event] = []


def note(kind: str, what: str, started: float) -> None:
    """Log one piece of one-time work of ``kind``, begun at ``started`` (``time.perf_counter()``) and done now."""
    now = time.perf_counter()
    _EVENTS.append(Event(started - START, kind, what, now - started))


def count() -> int:
    """How many pieces of one-time work this process has done so far."""
    return len(_EVENTS)


def since(start: int) -> Tuple[Event, ...]:
    """The events after the first ``start`` (a ``count`` taken before)."""
    return tuple(_EVENTS[start:])
