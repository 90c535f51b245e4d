"""The REPL (``python infer.py``): ``cli`` (flags, ``main``) -> ``repl`` (``Repl``: lines, prompts, results,
the table) -> ``commands`` (the /commands, one table), which sees the REPL as a ``state.ReplState``."""
