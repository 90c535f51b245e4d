"""Compile once per machine, not per start: inductor's on-disk caches (the FX graph cache with its
compiled C++ libraries, the AOTAutograd cache, the autotune cache) kept in the project's cache folder.

Inductor keys every entry by the graph, the inputs' metadata (frozen weights by shape and dtype
only), its configuration, the torch version and the CPU's ISA, so an entry is reused only where it
computes the same thing; it writes each entry to a temporary file and renames it into place, so two
processes compiling at once both finish with whole entries (the later rename wins; both are valid).
Dynamo still traces each pass shape at every start (its bytecode is not cached); what the caches skip
is the lowering and the C++ compiler, most of the time.

``compile_cache_dir()``: ``$TORCHINDUCTOR_CACHE_DIR`` where the user
set one, else ``utils.models.cache_dir()/inductor``. ``use_compile_cache()`` points inductor at it
(before the first graph is built); ``CacheCount`` tells whether a build was served from it.
"""
import os
from dataclasses import dataclass
from pathlib import Path

_INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
_USER_SET = os.environ.get(_INDUCTOR_ENV)  # read at import: inductor writes its default there once it compiles


def _users_folder() -> str | None:
    """``$TORCHINDUCTOR_CACHE_DIR`` as it was before we set it, unless it is inductor's own default
    (a temporary folder, which inductor writes there itself the first time it looks)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    if not _USER_SET or os.path.abspath(_USER_SET) == os.path.abspath(default_cache_dir()):
        return None
    return _USER_SET


def compile_cache_dir() -> Path:
    """Where compiled graphs are kept between starts (see the module's docstring)."""
    from utils.models import cache_dir

    chosen = _users_folder()
    return Path(chosen) if chosen else cache_dir() / "inductor"


def use_compile_cache() -> Path:
    """Point inductor's on-disk caches at ``compile_cache_dir()`` (and make sure they are on);
    returns the folder. Cheap and idempotent: called before every build."""
    import torch._inductor.config as inductor

    folder = compile_cache_dir().absolute()
    inductor.fx_graph_cache = True
    inductor.autotune_local_cache = True
    if os.environ.get(_INDUCTOR_ENV) != str(folder):
        folder.mkdir(parents=True, exist_ok=True)
        os.environ[_INDUCTOR_ENV] = str(folder)
        from torch._inductor.utils import clear_caches

        clear_caches()  # in-memory lookups that remember the previous folder
    return folder


def _counts() -> tuple:
    from torch._dynamo.utils import counters

    inductor, aot = counters["inductor"], counters["aot_autograd"]
    hits = inductor["fxgraph_cache_hit"] + aot["autograd_cache_hit"]
    return hits, inductor["fxgraph_cache_miss"] + inductor["fxgraph_cache_bypass"]  # a bypass compiles afresh


@dataclass
class CacheCount:
    """Inductor's cache hits and misses since it was made (``finish`` reads them)."""

    hits: int = 0
    misses: int = 0

    def __post_init__(self):
        self._start = _counts()

    def finish(self) -> "CacheCount":
        hits, misses = _counts()
        self.hits, self.misses = hits - self._start[0], misses - self._start[1]
        return self

    @property
    def source(self) -> str:
        """"cached" (every graph from the disk), "fresh" (none) or "partly cached"; "" when nothing was built."""
        if not self.hits and not self.misses:
            return ""
        return "cached" if not self.misses else "fresh" if not self.hits else "partly cached"
