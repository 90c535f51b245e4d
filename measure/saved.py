"""What is remembered between runs: each start-up result saved per machine, model and settings in
``cache_dir()/measurements/<kind>-<digest of its key>.json`` (written atomically), read back with the
shape its kind must have. ``measure.steps`` decides when one is reused and when it is measured again."""
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

from measure.budgets import parameter_count
from measure.costs import plausible_row_costs
from measure.kernels import OPTIONS, OWN, PREPACKED, SKINNY
from runners.cache_kind import CACHES
from utils.files import write_atomically
from utils.models import cache_dir


@dataclass
class Saved:
    result: dict
    when: str  # YYYY-MM-DD HH:MM, local time
    noisy: bool  # measured on a busy machine, or stopped by its budget


def model_identity(model) -> dict:
    """A model's name and a cheap fingerprint: its config's hash, parameter count, dtype and device.
    The folder's last component only: a measurement is about speed, which the moved folder keeps."""
    config = model.config
    name = str(getattr(config, "_name_or_path", "") or type(model).__name__)
    text = config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else repr(config)
    # the config's own copy of the path would tie the key to the folder: hash it as its last component
    text = text.replace(json.dumps(name)[1:-1], json.dumps(Path(name).name)[1:-1]) if name else text
    params = next(model.parameters())
    return {"name": Path(name).name or name, "config": hashlib.sha256(text.encode()).hexdigest()[:16],
            "parameters": parameter_count(model), "dtype": str(params.dtype).replace("torch.", ""),
            "device": str(params.device)}


def measurements_dir() -> Path:
    """``cache_dir()/measurements`` (the test suite points the cache folder at one of its own)."""
    return cache_dir() / "measurements"


def saved_path(kind: str, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return measurements_dir() / f"{kind}-{digest}.json"


def save(kind: str, key: dict, result: dict, noisy: bool, when: Optional[str] = None) -> Path:
    """Write ``result`` for ``kind`` and ``key`` (a reader in another process sees the old file or the new one)."""
    path = saved_path(kind, key)
    record = {"kind": kind, "key": key, "when": when or time.strftime("%Y-%m-%d %H:%M"), "noisy": noisy, "result": result}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(record, indent=1, sort_keys=True).encode())
    return path


def recall(kind: str, key: dict) -> Tuple[Optional[Saved], str]:
    """``(saved, "")`` for the result saved for ``kind`` and ``key``; ``(None, "")`` when none is;
    ``(None, why)`` for one that cannot be read, does not parse, or has the wrong shape (``SHAPES``)."""
    path = saved_path(kind, key)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, ""
    except OSError as error:
        return None, f"cannot read it ({error.strerror})"
    try:
        record = json.loads(text)
        if not isinstance(record, dict) or not isinstance(record.get("result"), dict):
            raise ValueError("not a saved measurement")
        if record.get("key") != key:
            raise ValueError("saved for other settings")
        if not isinstance(record.get("when"), str) or not isinstance(record.get("noisy"), bool):
            raise ValueError("no date or noise flag")
        SHAPES.get(kind, lambda result: None)(record["result"])
    except (ValueError, TypeError, KeyError) as error:  # json's errors are ValueErrors
        return None, str(error).splitlines()[0] if str(error) else type(error).__name__
    return Saved(record["result"], record["when"], record["noisy"]), ""


def _choice(field: str, values: tuple) -> Callable[[dict], None]:
    def check(result: dict) -> None:
        if result.get(field) not in values or not isinstance(result.get("line"), str):
            raise ValueError(f"expected {field} in {values} and a line")
    return check


def _kernels(result: dict) -> None:
    seconds = result.get("seconds")
    if seconds is None:
        if not isinstance(result.get("line"), str):
            raise ValueError("expected a line")
        return
    if not isinstance(seconds, dict) or not {PREPACKED, OWN} <= set(seconds) <= set(OPTIONS) or not isinstance(result.get("line"), str):
        raise ValueError(f"expected seconds of {PREPACKED}, {OWN} (and {SKINNY}) and a line")
    options = tuple(seconds)
    lengths = {len(seconds[o]) for o in options}
    if len(lengths) != 1 or not all(isinstance(t, (int, float)) and t > 0 for o in options for t in seconds[o]):
        raise ValueError("expected as many positive seconds for each option")


def _costs(result: dict) -> None:
    costs = result.get("costs")
    if not isinstance(costs, list) or not isinstance(result.get("note"), str):
        raise ValueError("expected a list of costs and a note")
    if costs and not plausible_row_costs(tuple(costs)):
        raise ValueError(f"costs {costs} are not plausible")


def _cost(result: dict) -> None:
    cost = result.get("cost")
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 <= cost < 1e3 or not isinstance(result.get("note"), str):
        raise ValueError("expected a cost from 0 to 1000 and a note")
    rows = result.get("rows")  # the drafter's output rows timed (None or absent: every row)
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows <= 0):
        raise ValueError(f"expected the rows timed as a positive count or none, got {rows!r}")


def _pairs(found, least: int) -> bool:
    """Whether ``found`` is a non-empty list of [whole number >= least, positive seconds]."""
    return isinstance(found, list) and bool(found) and all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], int) and p[0] >= least
        and isinstance(p[1], (int, float)) and p[1] > 0 for p in found)


def _prompt(result: dict) -> None:
    if not isinstance(result.get("line"), str):
        raise ValueError("expected a line")
    if result.get("tiles") is None:  # a fallback: the default plan
        return
    flops = result.get("flops")
    if not _pairs(result["tiles"], 0) or not _pairs(result.get("chunks"), 1) or not isinstance(flops, (int, float)) or flops <= 0:
        raise ValueError("expected [variant, seconds] and [chunk, seconds] pairs and positive flops")


# the shape each kind of saved result must have (ValueError: why not); a kind not named is taken as it is
SHAPES: Dict[str, Callable[[dict], None]] = {
    "kernels": _kernels, "cache": _choice("cache", CACHES), "verification": _costs, "drafter": _cost,
    "dtype": _choice("dtype", ("float32", "bfloat16")), "prompt": _prompt,
    "pass-dtype": _choice("dtype", ("float32", "bfloat16")),
}
