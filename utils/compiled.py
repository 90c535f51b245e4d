"""Compatibility shim: compiled passes live in ``runners/compiled.py`` now, and ``make_runner`` (the
one place that picks a runner) in ``runners/__init__.py``. New code imports from ``runners``;
these names stay importable from here."""
from runners import make_runner
from runners.compiled import (
    BUCKETS, MIN_CAPACITY, CompiledRunner, bucket, compile_events, compiled, compiled_graphs,
    compiled_label, prepare, why_not_compiled,
)

__all__ = [
    "BUCKETS", "MIN_CAPACITY", "CompiledRunner", "bucket", "compile_events", "compiled",
    "compiled_graphs", "compiled_label", "make_runner", "prepare", "why_not_compiled",
]
