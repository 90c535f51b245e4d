"""The benchmark (``python bench.py``): ``cli`` (flags, ``main``) -> ``run`` (``Bench``, the timed loop, records)
-> ``report`` (summary, tables, markdown) with ``intervals`` (bootstrap), ``plots``, ``llama_cpp`` and ``replay``;
``configs`` and ``prompts`` say what is run, on what."""
