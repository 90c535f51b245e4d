"""How a model's passes run: which KV cache and whether compiled. Built once (from the flags, or
from a Python call), carried whole in ``sampling.GenerationConfig``, never stored on the model."""
import inspect
from dataclasses import dataclass, replace
from typing import Optional

from torch.nn import Module

from runners.cache_kind import check_cache, runner_cache
from runners.device import model_device
from runners.static import static_cache
from utils.quantization import model_quantization


@dataclass(frozen=True)
class RunnerConfig:
    """``cache``: "static", "dynamic", or None (the device's default: static on CUDA,
    ``DEFAULT_CPU_CACHE`` on CPU). ``compile``: compiled passes over a static cache
    (``runners.compiled``) where the model can take them, else eager passes. ``gguf``: the path of a
    GGUF file whose llama.cpp kernels run the passes instead (``runners.llama_cpp``, the model then
    only says what the loops read of it: its config and vocabulary); None: torch runs them."""

    cache: Optional[str] = None
    compile: bool = False
    gguf: Optional[str] = None

    def __post_init__(self):
        check_cache(self.cache)
        object.__setattr__(self, "compile", bool(self.compile))

    def cache_for(self, model: Module) -> str:
        """The cache a runner of ``model`` starts with under this configuration (llama.cpp's: static)."""
        return "static" if self.gguf is not None else runner_cache(model, self.cache)

    def compiled_for(self, model: Module) -> bool:
        """Whether ``model``'s runner runs compiled passes under this configuration (never on llama.cpp)."""
        return self.compile and self.gguf is None and why_not_compiled(model) is None

    def with_(self, **changes) -> "RunnerConfig":
        """A copy with ``changes`` (``cache=``, ``compile=``)."""
        return replace(self, **changes)

    def describe(self, model: Module) -> str:
        """One phrase: "dynamic KV cache · eager", "static KV cache · compiled", "llama.cpp (Q4_1 GGUF kernels)"."""
        if self.gguf is not None:
            from runners.llama_model import gguf_model

            model = gguf_model(self.gguf)
            caveat = "" if model.exact else ", with llamafile's kernels: passes of 1 and of 2+ positions round apart"
            return f"llama.cpp ({model.weights} GGUF kernels{caveat})"
        return f"{self.cache_for(model)} KV cache · " + ("compiled" if self.compiled_for(model) else "eager")


EAGER = RunnerConfig()


def why_not_compiled(model: Module) -> Optional[str]:
    """Why ``model`` cannot run compiled passes (one line), or None when it can."""
    if getattr(model.config, "is_encoder_decoder", False):
        return "encoder-decoder models run eagerly (their cross-attention cache is not static)"
    if "position_ids" not in inspect.signature(model.forward).parameters:
        return f"{type(model).__name__} takes no position_ids: it runs eagerly"
    if model_device(model).type == "cuda" and model_quantization(model) in ("bitsandbytes", "quanto"):
        return "bitsandbytes and quanto layers do not compile: the quantized model runs eagerly"
    if static_cache(model, 8) is None:
        return f"{type(model).__name__}'s cache is not a plain key/value store: it runs eagerly"
    return None

