"""How long each start-up measurement may take: ``BUDGETS`` (seconds, set for the embedded
SmolLM2-135M) times ``budget_scale`` (a larger model's passes take longer). The ``Budget`` that
counts them down between passes is ``measure.timing.Budget``."""
from typing import Dict, Optional

from torch.nn import Module


# Seconds each start-up measurement may take. On a quiet 2-core CPU the embedded 135M model needs
# well under these (cache ~1 s, kernels ~7 s for three options, verification costs ~3 s, the prompt GEMM's variants
# under 1 s); on a busy one they are
# the ceiling: a measurement stops at its first check past the budget (at most one pass later).
BUDGETS: Dict[str, float] = {"cache": 3.0, "prepack": 10.0, "verification": 5.0, "drafter": 2.0, "dtype": 2.0,
                             "prompt": 3.0}

EMBEDDED_PARAMETERS = 135e6  # the budgets are set for the embedded SmolLM2-135M
MAX_SCALE = 8.0


def budget_scale(model: Optional[Module]) -> float:
    """How many times the budgets a model gets: its parameters against the embedded model's (a pass
    of a 1.5B model costs about ten of SmolLM2's), at least 1, at most ``MAX_SCALE``."""
    if model is None:
        return 1.0
    return min(MAX_SCALE, max(1.0, parameter_count(model) / EMBEDDED_PARAMETERS))


def budget_seconds(kind: str, model: Optional[Module] = None) -> float:
    """Seconds of one ``kind`` of measurement for ``model``: ``BUDGETS[kind] * budget_scale(model)``, to 0.1 s."""
    return round(BUDGETS[kind] * budget_scale(model), 1)


def parameter_count(model) -> int:
    """``model``'s parameters, the weights ``kernels.one_copy`` released counted (kept only as blocked
    copies, they are no parameters any more), and those ``kernels.holding`` parked (oneDNN's copies): what the measurements' keys and budgets read. Written
    here, not called there: the start-up reads the kernels' files only where it runs them."""
    released = sum(m.in_features * m.out_features for m in model.modules() if type(m).__name__ == "PrepackedLinear" and
                   (getattr(m, "blocks", None) is not None or getattr(m, "parked", False)))  # parked: an empty Parameter
    return sum(p.numel() for p in model.parameters()) + released

