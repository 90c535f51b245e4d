"""One parser per value type, shared by the REPL's commands and the flags of infer.py and bench.py.

Each parser takes what the user typed and returns the value, or raises ``ValueError`` with one
line that says what is wrong and what is accepted. Every numeric setting has a finite range
(``LIMITS``): nothing typed can make the tool allocate or loop without bound.
"""
import math
import os
import re
from typing import Callable, List, Tuple

# name -> (lowest, highest) accepted; the upper bounds are caps on work and memory, not on meaning
LIMITS = {
    "gamma": (1, 128),  # drafts per step (the policy scans every length up to gamma)
    "length": (1, 1_000_000),  # new tokens (the model's context window bounds it further)
    "seed": (0, 2**32 - 1),
    "n": (2, 32),  # n-gram size: a storage keeps n - 1 tables
    "top_k_filler": (1, 1000),
    "pld_ngram": (1, 64),
    "pld_num_tokens": (1, 128),
    "tree_size": (1, 256),  # nodes of a draft tree: one pass over all of them
    "max_tree_depth": (1, 64),  # the suffix trie's depth
    "max_spec_tokens": (1, 128),  # suffix drafts per step
    "max_spec_factor": (0.0, 64.0),
    "max_spec_offset": (-64.0, 64.0),
    "min_token_prob": (0.0, 1.0),
    "min_draft": (0, 128),
    "pause_after": (0, 1_000_000),
    "pause_steps": (1, 1_000_000),
    "top_k": (1, 1_000_000),
    "temperature": (0.001, 1000.0),  # below it, logits / temperature overflow to inf and the sampler sees NaN
    "top_p": (0.0, 1.0),  # (0, 1]
    "p_min": (0.0, 1.0),  # [0, 1)
    "min_gain": (0.0, 1000.0),
    "repeats": (1, 1000),
    "rounds": (1, 100),  # the REPL's interleaved rounds of each comparison
    "limit": (1, 1_000_000),
}
MAX_PATH = 4096  # characters of a file name
MAX_LINE = 1_000_000  # characters of one line of input (a prompt or a command)

_INT = re.compile(r"[+-]?[0-9]{1,30}")
_FLOAT = re.compile(r"[+-]?([0-9]{1,30}(\.[0-9]{0,30})?|\.[0-9]{1,30})([eE][+-]?[0-9]{1,4})?")


def _shown(text) -> str:
    text = str(text)
    return repr(text if len(text) <= 24 else text[:21] + "...")


def parse_int(text, name: str, low: int, high: int) -> int:
    """An integer in [low, high], written in ASCII digits (``"12"``, ``"+3"``; no ``1e3``, no ``1_000``)."""
    if isinstance(text, bool):
        text = str(text)
    if isinstance(text, int):
        value = text
    else:
        text = str(text).strip()
        if not _INT.fullmatch(text):
            raise ValueError(f"{name} must be an integer from {low} to {high}, got {_shown(text)}")
        value = int(text)
    if not low <= value <= high:
        raise ValueError(f"{name} must be >= {low} and <= {high}, got {_shown(value)}")
    return value


def parse_float(text, name: str, low: float, high: float, low_open: bool = False, high_open: bool = False) -> float:
    """A finite decimal number in the interval from ``low`` to ``high`` (open ends as told); no nan, no inf."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        text = str(text).strip()
        if not _FLOAT.fullmatch(text):
            raise ValueError(f"{name} must be a number in {interval}, got {_shown(text)}")
        value = float(text)
    if not math.isfinite(value) or value < low or value > high or (low_open and value == low) or (high_open and value == high):
        raise ValueError(f"{name} must be in {interval}, got {_shown(text)}")
    return value


def parse_limited(text, name: str, key: str | None = None):
    """The setting ``key`` (default ``name``) of ``LIMITS``: an int or a float within its range."""
    key = key or name.lstrip("-/").replace("-", "_")
    low, high = LIMITS[key]
    if key == "top_p":
        return parse_float(text, name, low, high, low_open=True)
    if key == "p_min":
        return parse_float(text, name, low, high, high_open=True)
    if isinstance(low, float):
        return parse_float(text, name, low, high)
    return parse_int(text, name, low, high)


def parse_int_list(text: str, name: str, key: str | None = None, most: int = 64) -> List[int]:
    """Comma-separated integers, each within the range of ``key``; at most ``most`` of them."""
    parts = [part for part in str(text).split(",") if part.strip()]
    if not parts or len(parts) > most:
        raise ValueError(f"{name} takes 1 to {most} comma-separated integers, got {_shown(text)}")
    return [parse_limited(part, name, key) for part in parts]


def parse_path(text, name: str = "file") -> str:
    """A file name: not empty, no NUL byte, at most ``MAX_PATH`` characters; ``~`` is expanded."""
    text = str(text)
    if not text.strip() or "\0" in text or len(text) > MAX_PATH or _has_surrogates(text):
        raise ValueError(f"{name} must be a file name (1 to {MAX_PATH} characters, no NUL byte, valid UTF-8), got {_shown(text)}")
    return os.path.expanduser(text)


def _has_surrogates(text: str) -> bool:
    return any("\ud800" <= c <= "\udfff" for c in text)


def sanitize_text(text: str) -> Tuple[str, int]:
    """``text`` with every lone surrogate (what Python makes of bytes that are not UTF-8, with
    ``surrogateescape``) replaced by U+FFFD, and how many were replaced."""
    if not _has_surrogates(text):
        return text, 0
    count = 0
    out = []
    for c in text:
        if "\ud800" <= c <= "\udfff":
            count += 1
            c = "\ufffd"
        out.append(c)
    return "".join(out), count


def decode_bytes(data: bytes) -> Tuple[str, int]:
    """Bytes read from a terminal, a pipe or a file as text: invalid UTF-8 becomes U+FFFD (counted)."""
    return sanitize_text(data.decode("utf-8", "surrogateescape"))


def flag_type(name: str, key: str | None = None) -> Callable:
    """An argparse ``type=`` for the flag ``name`` (e.g. ``--gamma``), from the same parser as the command."""
    import argparse

    def convert(text):
        try:
            return parse_limited(text, name, key)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = name  # argparse names the type in its messages
    return convert


def flag_list_type(name: str, key: str | None = None) -> Callable:
    import argparse

    def convert(text):
        try:
            return parse_int_list(text, name, key)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = name
    return convert


class UsageError(ValueError):
    """A malformed command or flag: one line of usage, settings unchanged."""


def _processors() -> dict:
    """name -> (processor class, its parameters in the order they are typed)."""
    from utils.logits_processor import (
        GreedyProcessor,
        MultinomialProcessor,
        NucleusProcessor,
        TopKNucleusProcessor,
        TopKProcessor,
    )

    return {
        "greedy": (GreedyProcessor, [("temperature", float)]),
        "multinomial": (MultinomialProcessor, [("temperature", float)]),
        "topk": (TopKProcessor, [("temperature", float), ("top_k", int)]),
        "nucleus": (NucleusProcessor, [("temperature", float), ("top_p", float)]),
        "topknucleus": (TopKNucleusProcessor, [("temperature", float), ("top_k", int), ("top_p", float)]),
    }


def parse_processor(words: List[str]):
    """``["topk", "0.7", "50"]`` -> (processor, name, arguments); UsageError with the usage line otherwise."""
    processors = _processors()
    usage = "usage: /processor <" + "|".join(processors) + "> <args...>"
    if not words or words[0] not in processors:
        raise UsageError(usage if not words else f"unknown processor '{words[0]}'; {usage}")
    cls, params = processors[words[0]]
    names = " ".join(f"<{name}>" for name, _ in params)
    line = f"usage: /processor {words[0]} {names}"
    values = words[1:]
    if words[0] == "greedy" and not values:
        values = ["1"]
    if len(values) != len(params):
        raise UsageError(line)
    try:
        kwargs = {name: parse_limited(value, name) for (name, _), value in zip(params, values)}
        return cls(**kwargs), words[0], kwargs
    except ValueError as error:
        raise UsageError(f"{error}; {line}") from None


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value
