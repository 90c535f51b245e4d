"""The drafter's dtype (``--drafter-dtype``): the target's by default; under ``--preset pair`` with a float32
target on CPU, bfloat16 where a bfloat16 matmul of the drafter's own shape measures clearly faster
(``measure.dtype``, the rule ``--dtype auto`` applies to the target). A drafter's dtype changes which
drafts are proposed, never what is emitted: the target verifies every draft in its own dtype (greedy: its
own tokens; sampling: accepted with ``min(1, p / q)`` for whatever ``q`` the drafter drew from), so the
output stays the target's. The choice is named in the drafter's header line."""
from dataclasses import dataclass
from typing import Callable, Optional

from app.session import SetupError

CHOICES = ("auto", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class DrafterDtype:
    """The drafter's dtype as ``load_model`` takes it (``"auto"``: the target's rule), and why: ``note``
    for the full header line, ``short`` for the short one ("" when the drafter runs in the target's dtype)."""

    value: str
    note: str = ""
    short: str = ""


def drafter_dtype(asked: Optional[str], target_dtype: str, drafter: str, device: str, measured: bool,
                  measure: Callable[[str], object]) -> DrafterDtype:
    """The drafter's dtype: ``asked`` (``--drafter-dtype``) when given, else the target's (``target_dtype``),
    except with ``measured`` (``--preset pair``'s dtype measurement) for a float32 target on CPU: then
    ``measure(drafter)`` (a ``measure.Finding`` whose value is "bfloat16" or "float32") decides. A
    ``layers:N`` drafter is a copy of the target's layers, in the target's dtype."""
    if drafter.startswith("layers:"):
        if asked not in (None, "auto", target_dtype):
            raise SetupError(f"--drafter-dtype {asked}: a layers:N drafter is the target's own layers, in its dtype")
        return DrafterDtype(target_dtype)
    why = f"the {target_dtype} target verifies every draft: the output is its own"
    if asked not in (None, "auto"):
        if asked == target_dtype or target_dtype == "auto":
            return DrafterDtype(asked)
        return DrafterDtype(asked, f"{asked} drafter (--drafter-dtype); {why}", f"drafts in {asked}")
    if not (measured and target_dtype == "float32" and device == "cpu"):
        return DrafterDtype(target_dtype)
    found = measure(drafter)
    if getattr(found, "value", "float32") != "bfloat16":
        return DrafterDtype(target_dtype)
    return DrafterDtype("bfloat16", f"bfloat16 drafter for the float32 target, {found.line}; {why} "
                        f"(--drafter-dtype float32: the target's)", "drafts in bfloat16 by measurement")
