"""The set-up both programs share now lives in ``app/session.py``, ``app/pair.py`` and ``app/header_lines.py``;
this module keeps ``import session`` working."""
from app.header_lines import describe
from app.pair import Pair, load_pair, pair_preset
from app.session import (
    Say,
    SetupError,
    add_shared_flags,
    build_settings,
    encode,
    first_line,
    read_processor,
    row_costs_flag,
    to_stderr,
)

__all__ = ["Pair", "Say", "SetupError", "add_shared_flags", "build_settings", "describe", "encode", "first_line", "load_pair",
           "pair_preset", "read_processor", "row_costs_flag", "to_stderr"]
