"""``--dtype auto`` on CPU (``--preset pair``) and the drafter's ``--drafter-dtype auto``: the model's own
one-position pass, as its rows run it (the C step where it takes the model: the same runner, kernels
and path), timed in float32 and in bfloat16, alternately, and bfloat16 chosen only where its median
takes at most ``CLEARLY_FASTER`` of float32's. The caller holds both copies (made once, the one not
chosen freed by it); this module only times them.

Why the pass and not a matmul of the model's shape: a decoding pass reads every weight once, so its
time is the bytes it reads from memory; one matrix of a 0.5B model fits in a server CPU's cache and
hid the halved bytes (0.84 from cache, against a pass twice as fast from memory). Alternating the two
copies makes each pass follow the other copy's, so a model whose two copies exceed the last-level
cache (``machine.last_level_cache``) is timed from memory, as a drafter is between the target's passes;
a tiny one fits, is timed from cache, and the line says so. The passes are ``measure.timing.dtype_race``'s
(every timed pass of the start-up is timing's); the medians, the rule and its line are here."""
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence, Tuple

from measure.machine import last_level_cache

if TYPE_CHECKING:
    from measure.timing import Budget

CLEARLY_FASTER = 0.8  # bfloat16's median pass must take at most this share of float32's
ROUNDS = 5  # alternating timed rounds (float32 then bfloat16), after one untimed round
MIN_ROUNDS = 2  # timed rounds needed before a budget may stop them; fewer: float32, the safe default


@dataclass(frozen=True)
class Race:
    """Median seconds of a one-position pass in each dtype over ``rounds`` timed rounds, and what ran them."""

    float32: float
    bfloat16: float
    rounds: int
    paths: Tuple[str, str]

    @property
    def ratio(self) -> float:
        return self.bfloat16 / self.float32 if self.float32 > 0 else float("inf")


def race(seconds: Sequence[Sequence[float]], paths: Sequence[str]) -> Optional[Race]:
    """The medians of ``measure.timing.dtype_race``'s seconds (float32's, then bfloat16's); None where fewer
    than ``MIN_ROUNDS`` rounds were timed (a budget spent first)."""
    if min(len(s) for s in seconds) < MIN_ROUNDS:
        return None
    return Race(statistics.median(seconds[0]), statistics.median(seconds[1]), len(seconds[0]), (paths[0], paths[1]))


def where_read(weight_bytes: int, cache_bytes: Optional[int] = None) -> str:
    """"from memory" where the two copies (``weight_bytes``: float32's and bfloat16's) exceed the last-level
    cache, else "from cache (...)": a tiny model's passes never leave it, and its choice is made there."""
    cache_bytes = last_level_cache() if cache_bytes is None else cache_bytes
    if not cache_bytes or weight_bytes > cache_bytes:
        return "from memory"
    return f"from cache (both copies, {weight_bytes / 2**20:.0f} MiB, fit in the {cache_bytes / 2**20:.0f} MiB last-level cache)"


def choose(found: Optional[Race], budget: "Budget", where: str) -> Tuple[str, str]:
    """``(dtype, line)``: "bfloat16" where ``found``'s ratio is at most ``CLEARLY_FASTER``, else "float32"
    (also when nothing was timed: the line says the budget ran out)."""
    if found is None:
        return "float32", f"float32 (fallback: {budget.reason})"
    chosen = "bfloat16" if found.ratio <= CLEARLY_FASTER else "float32"
    verdict = "clearly faster" if chosen == "bfloat16" else "not clearly faster"
    paths = found.paths[0] if found.paths[0] == found.paths[1] else f"float32 {found.paths[0]}, bfloat16 {found.paths[1]}"
    return chosen, (f"{chosen} by measurement: a one-position pass of the model ({paths}) took {found.bfloat16 * 1e3:.3g} ms "
                    f"in bfloat16, {found.float32 * 1e3:.3g} ms in float32 ({found.ratio:.2f}, {verdict}: at most "
                    f"{CLEARLY_FASTER}; medians of {found.rounds} alternating rounds, weights read {where})")
