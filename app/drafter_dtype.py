"""The drafter's dtype (``--drafter-dtype``): the target's by default; under ``--preset pair`` with a float32
target on CPU, bfloat16 where the drafter's own one-position pass (its C step) measures clearly faster in
bfloat16 than in float32 (``measure.pass_dtype``, the rule ``--dtype auto`` applies to the target; both
copies loaded and timed by ``app.pair``, the one chosen kept). A drafter's dtype changes which
drafts are proposed, never what is emitted: the target verifies every draft in its own dtype (greedy: its
own tokens; sampling: accepted with ``min(1, p / q)`` for whatever ``q`` the drafter drew from), so the
output stays the target's. The choice is named in the drafter's header line."""
from dataclasses import dataclass
from typing import Optional

from app.session import SetupError

CHOICES = ("auto", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class DrafterDtype:
    """The drafter's dtype as ``load_model`` takes it (``"auto"``: the target's rule), and why: ``note``
    for the full header line, ``short`` for the short one ("" when the drafter runs in the target's dtype)."""

    value: str
    note: str = ""
    short: str = ""


def measures(asked: Optional[str], target_dtype: str, drafter: str, device: str, measured: bool) -> bool:
    """Whether the drafter's dtype is decided by measuring it: nothing asked (or "auto"), ``measured``
    (``--preset pair``'s dtype measurement), a float32 target on CPU, and a drafter of its own."""
    return (asked in (None, "auto") and measured and target_dtype == "float32" and device == "cpu"
            and not drafter.startswith("layers:"))


def drafter_dtype(asked: Optional[str], target_dtype: str, drafter: str, device: str, measured: bool,
                  found: object = None) -> DrafterDtype:
    """The drafter's dtype: ``asked`` (``--drafter-dtype``) when given, else the target's (``target_dtype``),
    except where it ``measures``: then ``found`` (the drafter's ``measure.Finding``, whose value is
    "bfloat16" or "float32", measured by the caller) decides. A ``layers:N`` drafter is a copy of the
    target's layers, in the target's dtype."""
    if drafter.startswith("layers:"):
        if asked not in (None, "auto", target_dtype):
            raise SetupError(f"--drafter-dtype {asked}: a layers:N drafter is the target's own layers, in its dtype")
        return DrafterDtype(target_dtype)
    why = f"the {target_dtype} target verifies every draft: the output is its own"
    if asked not in (None, "auto"):
        if asked == target_dtype or target_dtype == "auto":
            return DrafterDtype(asked)
        return DrafterDtype(asked, f"{asked} drafter (--drafter-dtype); {why}", f"drafts in {asked}")
    if not measures(asked, target_dtype, drafter, device, measured):
        return DrafterDtype(target_dtype)
    if getattr(found, "value", "float32") != "bfloat16":  # the measured figures named in the full line all the same
        return DrafterDtype(target_dtype, getattr(found, "line", ""))
    return DrafterDtype("bfloat16", f"bfloat16 drafter for the float32 target, {found.line}; {why} "
                        f"(--drafter-dtype float32: the target's)", "drafts in bfloat16 by measurement")
