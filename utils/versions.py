"""The oldest torch the programs run on, checked once at start (``check_torch``): transformers 5.24 (the
floor of requirements.txt) needs torch 2.6 and turns PyTorch off below it, and the lean forward's SDPA call
passes ``enable_gqa`` (torch 2.5)."""
import re
from typing import Optional, Tuple

TORCH_FLOOR: Tuple[int, int] = (2, 6)


def torch_problem() -> Optional[str]:
    """Why the installed torch cannot run the programs (one line), or None."""
    try:
        import torch
    except ImportError:
        return f"torch is not installed; the programs need torch >= {_floor()}: see the README's setup"
    version = str(torch.__version__)
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None or (int(found.group(1)), int(found.group(2))) < TORCH_FLOOR:
        return f"torch {version} is installed; the programs need torch >= {_floor()} (transformers 5.24 does): see the README's setup"
    return None


def check_torch() -> None:
    """Exit with one line when the installed torch is older than ``TORCH_FLOOR``."""
    problem = torch_problem()
    if problem is not None:
        raise SystemExit(f"error: {problem}")


def _floor() -> str:
    return ".".join(map(str, TORCH_FLOOR))
