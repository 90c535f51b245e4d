"""The range checks of a draft policy's values, shared by ``DraftPolicy`` and ``PolicySettings``."""
from typing import Any, Tuple


def checked(values: Any) -> Tuple[float, ...] | None:
    """Refuse, in one line, a value out of range among ``values``' policy fields; returns its
    ``row_costs`` as a tuple of floats (None stays None)."""
    for name in ("min_draft", "pause_after", "pause_steps", "max_gamma"):
        value = getattr(values, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if not isinstance(values.min_gain, (int, float)) or values.min_gain < 0:
        raise ValueError(f"min_gain must be >= 0, got {values.min_gain!r}")
    costs = values.row_costs
    if costs is not None:
        costs = tuple(float(c) for c in costs)
        if not costs or any(not c > 0 for c in costs):
            raise ValueError(f"row_costs must be positive relative costs, got {costs!r}")
    draft_cost, p_min = values.draft_cost, values.p_min
    if isinstance(draft_cost, bool) or not isinstance(draft_cost, (int, float)) or not 0 <= draft_cost < 1e3:
        raise ValueError(f"draft_cost must be >= 0, got {draft_cost!r}")
    if isinstance(p_min, bool) or not isinstance(p_min, (int, float)) or not 0.0 <= p_min < 1.0:
        raise ValueError(f"p_min must be in [0, 1), got {p_min!r}")
    if values.auto and costs is None:
        raise ValueError("auto draft lengths need measured row_costs (measure_row_costs)")
    return costs
