"""A ``DraftPolicy``'s values frozen (``PolicySettings``: what a ``RunConfig`` carries and writes), and
a notebook's calibrated policy (``calibrated_policy``: costs measured now)."""
from dataclasses import asdict, field, fields, make_dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from sampling.draft_policy import DEFAULT_MIN_GAIN, DraftPolicy
from sampling.policy_checks import checked

if TYPE_CHECKING:
    from torch.nn import Module

    from runners.config import RunnerConfig


def calibrated_policy(target: "Module", min_gain: float = DEFAULT_MIN_GAIN, drafter: Optional["Module"] = None,
                      row_costs: Optional[Sequence[float]] = None, runner: Optional["RunnerConfig"] = None,
                      drafter_runner: Optional["RunnerConfig"] = None, **policy) -> DraftPolicy:
    """A notebook's calibrated policy: ``DraftPolicy.calibrated`` over costs measured now on ``target``
    where it runs (``measure.measure_costs``: verification costs, a few seconds, taken again once when
    not plausible; a ``drafter`` model's pass cost). ``row_costs`` given (measured before, ``--row-costs``)
    are checked, not measured (ValueError when they cannot be real). ``runner`` and ``drafter_runner``:
    the configurations the rows run the models under (default eager), measured as they run."""
    from measure import measure_costs
    from runners.config import EAGER

    costs = measure_costs(target, runner or EAGER, drafter, drafter_runner, row_costs)
    return DraftPolicy.calibrated(costs, min_gain=min_gain, **policy)

class _Values:
    """What ``PolicySettings`` adds to ``DraftPolicy``'s value fields."""

    def __post_init__(self):
        object.__setattr__(self, "row_costs", checked(self))

    @classmethod
    def of(cls, policy: DraftPolicy) -> "PolicySettings":
        """The values of ``policy`` (what it learned is not a value: it is left out), as checked when
        ``policy`` was made (not checked twice: one place checks a policy's values on each way in)."""
        made = object.__new__(cls)
        for f in fields(cls):
            object.__setattr__(made, f.name, getattr(policy, f.name))
        return made

    def policy(self, memory: dict | None = None) -> DraftPolicy:
        """A ``DraftPolicy`` with these values; ``memory``: the records it keeps of drafter models with
        ``remember`` (a dict shared by every generation of a run; None: its own)."""
        made = DraftPolicy(**asdict(self))
        if memory is not None:
            made._memory = memory
        return made

    def bound(self) -> int | None:
        """``DraftPolicy.bound``: the most drafts a step may ask for beyond ``gamma``; None: ``gamma`` is the bound."""
        return len(self.row_costs) - 1 if self.auto else None


# made from ``DraftPolicy``'s fields, so that the two never differ
PolicySettings = make_dataclass("PolicySettings", [(f.name, f.type, field(default=f.default)) for f in fields(DraftPolicy)],
                                bases=(_Values,), frozen=True, namespace={"__module__": __name__, "__doc__": (
                                    "A ``DraftPolicy``'s values, frozen: they print, compare, hash and are written as a "
                                    "dict (``asdict``). ``policy(memory)`` makes the policy of one generation.")})
