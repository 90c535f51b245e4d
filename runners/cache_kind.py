"""Which KV cache a runner uses: "static" or "dynamic", named by a ``RunnerConfig`` or the device's default."""
import inspect

from torch.nn import Module

from runners.device import model_device

CACHES = ("static", "dynamic")
# The CPU default, chosen by measurement (README, "CPU weights that read fewer bytes, and the static
# cache": the static cache measured no faster on CPU); CUDA defaults to static (unmeasured).
DEFAULT_CPU_CACHE = "dynamic"


def check_cache(cache: str | None) -> None:
    """Refuse a cache name other than None and ``CACHES``."""
    if cache is not None and cache not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")


def default_cache(model: Module) -> str:
    """The cache a runner of ``model`` uses when none is named: static on CUDA, ``DEFAULT_CPU_CACHE`` on CPU."""
    return "static" if model_device(model).type == "cuda" else DEFAULT_CPU_CACHE


def runner_cache(model: Module, cache: str | None = None) -> str:
    """The cache a runner of ``model`` starts with: ``cache``, else ``default_cache(model)``; the
    dynamic one for encoder-decoder models and models whose forward takes no ``position_ids``."""
    static_possible = not getattr(model.config, "is_encoder_decoder", False) and "position_ids" in inspect.signature(model.forward).parameters
    return (cache or default_cache(model)) if static_possible else "dynamic"
