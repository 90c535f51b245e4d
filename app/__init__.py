"""The two programs and what they share: ``app.repl`` (``python infer.py``), ``app.bench``
(``python bench.py``) and ``app.session`` (flags, the model pair, the settings)."""
