"""The set-up both programs share now lives in ``app/session.py``; this module keeps ``import session`` working."""
from app.session import (
    Pair,
    Say,
    SetupError,
    add_shared_flags,
    build_settings,
    describe,
    encode,
    first_line,
    load_pair,
    pair_preset,
    read_processor,
    row_costs_flag,
    to_stderr,
)

__all__ = ["Pair", "Say", "SetupError", "add_shared_flags", "build_settings", "describe", "encode", "first_line", "load_pair",
           "pair_preset", "read_processor", "row_costs_flag", "to_stderr"]
