"""Which KV cache a runner uses: "static" or "dynamic", named by a ``RunnerConfig`` or the device's default."""
import inspect

from torch.nn import Module

from runners.device import model_device

CACHES = ("static", "dynamic")
# The CPU default, chosen by measurement (docs/cpu-kernels.md: the static cache measured no faster on
# CPU); CUDA defaults to static (not compared with the dynamic cache on a GPU).
DEFAULT_CPU_CACHE = "dynamic"


def check_cache(cache: str | None) -> None:
    """Refuse a cache name other than None and ``CACHES``."""
    if cache is not None and cache not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")


def default_cache(model: Module) -> str:
    """The cache a runner of ``model`` uses when none is named: static on CUDA, ``DEFAULT_CPU_CACHE`` on CPU."""
    return "static" if model_device(model).type == "cuda" else DEFAULT_CPU_CACHE


def runner_cache(model: Module, cache: str | None = None) -> str:
    """The cache a runner of ``model`` starts with and keeps: ``cache``, else ``default_cache(model)``; the
    dynamic one for encoder-decoder models, models whose forward takes no ``position_ids``, and models
    whose cache is no plain key/value store (linear attention, convolution states: ``static_cache`` makes
    none, and the eager runner would run the dynamic one while the headers said static)."""
    from runners.static import static_cache

    static_possible = not getattr(model.config, "is_encoder_decoder", False) and "position_ids" in inspect.signature(model.forward).parameters
    chosen = (cache or default_cache(model)) if static_possible else "dynamic"
    return "dynamic" if chosen == "static" and static_cache(model, 8) is None else chosen


def cache_keyword(model: Module) -> str:
    """The keyword by which ``model``'s forward (and ``generate``) takes its KV cache: ``cache`` where the
    installed transformers renamed it (5.24 on: ``past_key_values`` is deprecated, to be removed in
    5.40), else ``past_key_values``. Read from the forward's own signature, so both kinds of release run."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(out):
    """The KV cache a forward returned, by the field name its output class declares (``cache`` or
    ``past_key_values``; None when it returned none)."""
    fields = getattr(type(out), "__dataclass_fields__", {})
    return getattr(out, "cache" if "cache" in fields else "past_key_values", None)
