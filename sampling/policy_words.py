"""The words naming what a ``DraftPolicy`` does on its own (``DraftPolicy.describe``): headers, labels, the REPL's /stats."""


def describe(policy, gamma: int | None = None) -> str:
    """One line naming what ``policy`` (a ``DraftPolicy``: not imported, it imports this) does on its own, for headers
    and labels (with the bound on drafts per step when ``gamma`` is given)."""
    parts = []
    if gamma is not None:
        parts.append(f"gamma auto ({gamma} first, up to {max(gamma, policy.bound())})" if policy.auto else f"gamma <= {gamma}")
    if policy.row_costs is not None:
        parts.append("cost-optimal length" + (" by draft depth and evidence" if policy.by_depth else "") + ", padded passes")
    if policy.adaptive:
        parts.append("adaptive")
    if policy.min_draft:
        parts.append(f"min_draft {policy.min_draft}")
    if policy.p_min:
        parts.append(f"p_min {policy.p_min}")
    if policy.pause_after:
        parts.append(f"pause after {policy.pause_after} for {policy.pause_steps}")
    if policy.min_gain:
        parts.append(f"pausing below {policy.min_gain:g} tokens per unit of cost")
    if policy.live and policy.row_costs is not None:
        parts.append("costs measured in the loop")
    if policy.remember:
        parts.append(f"memory on ({policy.remembered} remembered)")
    return ", ".join(parts) or "constant length"
