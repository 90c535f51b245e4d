"""How a model's passes run: which KV cache and whether compiled. Built once (from the flags, or
from a Python call), carried whole in ``sampling.GenerationConfig``, never stored on the model."""
import inspect
from dataclasses import dataclass, replace
from typing import Optional

from torch.nn import Module

from models.layer_spec import family_name
from models.llama import ATTENTION, lean_unsupported

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
    only says what the loops read of it: its config and vocabulary); None: torch runs them.
    ``forward``: whose forward an eager run with a cache takes: "lean" (``runners.lean``, the Llama
    family's own over a static cache; refused with its reason for another model), "transformers"
    (the model's own, ``KVCacheModel``), or "auto": lean where ``lean_unsupported`` finds nothing and
    no dynamic cache is asked for, else transformers'; "step": the lean forward as compiled steps, one
    graph per pass width and key bucket (``runners.step``), which "auto" picks for the family on CUDA
    unless ``eager`` (``--eager``: the eager forward kept on CUDA, for comparison); on CUDA "auto" never
    runs eager by default: a model the step cannot take runs transformers' forward compiled
    (``compiles_by_default``) unless ``eager``, whose reason ``why_eager`` gives where the programs chose it
    (its graphs not ready within the first-answer limit: ``app.steps.compiled_within``). ``graphs``: how that
    step turns passes into graphs (``--step-graphs``, ``STEP_GRAPHS``): "regional" (one decoder layer
    compiled for every layer, each pass captured whole as a CUDA graph) or "whole" (each pass compiled
    whole, inductor's CUDA graphs); ``runners.step_graphs``. ``drafter_head``: read only where the model drafts
    (``drafters.model``; a target computes every row): its output layer's rows its C step passes compute, the
    first ``drafter_head`` ids (BPE's most frequent) and every token fed (``runners.lean.LeanRunner.output_rows``);
    0: every row."""

    cache: Optional[str] = None
    compile: bool = False
    gguf: Optional[str] = None
    forward: str = "auto"
    eager: bool = False
    graphs: str = "regional"
    why_eager: str = ""
    drafter_head: int = 0

    def __post_init__(self):
        check_cache(self.cache)
        if self.why_eager:
            object.__setattr__(self, "eager", True)
        object.__setattr__(self, "compile", bool(self.compile))
        object.__setattr__(self, "eager", bool(self.eager))
        if self.forward not in FORWARDS:
            raise ValueError(f"forward must be one of {', '.join(FORWARDS)}, got {self.forward!r}")
        if self.graphs not in STEP_GRAPHS:
            raise ValueError(f"graphs must be one of {', '.join(STEP_GRAPHS)}, got {self.graphs!r}")
        if not isinstance(self.drafter_head, int) or self.drafter_head < 0:
            raise ValueError(f"drafter_head is a count of rows (0: all), got {self.drafter_head!r}")
        if self.eager and (self.compile or self.forward == "step"):
            raise ValueError("eager keeps the eager forward: it cannot be asked for with compile or forward='step'")

    def cache_for(self, model: Module) -> str:
        """The cache a runner of ``model`` starts with under this configuration (llama.cpp's, the lean forward's
        and compiled passes': static)."""
        static = self.gguf is not None or self.lean_for(model) or self.compiled_for(model)
        return "static" if static else runner_cache(model, self.cache)

    def lean_for(self, model: Module) -> bool:
        """Whether ``model``'s eager cached passes run the lean forward (``runners.lean``) under this configuration."""
        if self.forward == "transformers" or self.gguf is not None or self.compiled_for(model):
            return False  # on CUDA the family's default is the compiled step (``step_for``) unless ``eager``
        if self.forward == "lean":
            return True  # make_runner refuses a model outside the family, with its reason
        return self.cache != "dynamic" and lean_unsupported(model) is None

    def compiled_for(self, model: Module) -> bool:
        """Whether ``model``'s runner runs compiled passes under this configuration (never on llama.cpp):
        ``runners.step``'s (``step_for``) or ``runners.compiled``'s."""
        if self.gguf is not None:
            return False
        return self.step_for(model) or (self.compile or self.compiles_by_default(model)) and why_not_compiled(model) is None

    def compiles_by_default(self, model: Module) -> bool:
        """Whether ``model`` runs transformers' forward compiled (``runners.compiled``) without ``compile``:
        on CUDA, never eager by default, a model the step cannot take (``lean_unsupported``) that compiles,
        under the default forward and not held ``eager``."""
        if self.gguf is not None or self.eager or self.compile or self.forward != "auto":
            return False
        return model_device(model).type == "cuda" and lean_unsupported(model) is not None and why_not_compiled(model) is None

    def compiled_reason(self, model: Module) -> str:
        """Why transformers' compiled forward runs ``model`` (for the header), "" where ``--compile`` asked or it does not."""
        if not self.compiles_by_default(model):
            return ""
        return f"the default on CUDA for a model the step cannot take ({lean_unsupported(model)}); --eager keeps the eager forward"

    def eager_reason(self, model: Module) -> str:
        """Why ``model`` runs eager on CUDA, in one line ("" where it does not, and off CUDA)."""
        if self.gguf is not None or model_device(model).type != "cuda" or self.compiled_for(model):
            return ""
        if self.why_eager or self.eager:
            return self.why_eager or "--eager"
        return why_not_compiled(model) or (f"--forward {self.forward} without --compile" if self.forward != "auto" else "")

    def step_for(self, model: Module) -> bool:
        """Whether ``model``'s passes are the compiled lean step (``runners.step.StepRunner``): asked for
        (``forward="step"``; a model outside the family is refused by ``make_runner``), or, on CUDA, a
        Llama-family model with the default forward that is not held ``eager``, compiled or not (with or
        without ``compile``: the step is the family's runner there; transformers' compiled forward only with
        ``forward="transformers"``)."""
        if self.gguf is not None or self.eager or self.forward in ("lean", "transformers"):
            return False
        if self.forward == "step":
            return True
        return model_device(model).type == "cuda" and lean_unsupported(model) is None and why_not_compiled(model) is None

    def step_reason(self, model: Module) -> str:
        """Why the compiled lean step runs ``model`` (for the header), "" where it does not."""
        if not self.step_for(model):
            return ""
        if self.forward == "step":
            return "--forward step"
        return f"the default on CUDA for the {family_name(model)} family; --eager keeps the eager forward"

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
        hooked = self.hooks_note(model)
        if hooked:
            return f"{self.cache_for(model)} KV cache · {hooked}"
        if self.step_for(model):
            return f"static KV cache · {step_name(model)} ({self.step_reason(model)})"
        if self.compiles_by_default(model):
            return f"static KV cache · compiled ({self.compiled_reason(model)})"
        why = self.eager_reason(model)
        how = "compiled" if self.compiled_for(model) else "eager" + (f" ({why})" if why else "")
        return f"{self.cache_for(model)} KV cache · {how}{self.forward_note(model)}"

    def hooks_note(self, model: Module) -> str:
        """Where a fast path (the lean forward, the C step, compiled passes) would run ``model`` and it has
        forward hooks (``runners.hooks``): "transformers' forward (the model has forward hooks: ...)", the
        runner's passes while they are there; else ""."""
        if self.gguf is not None or not (self.lean_for(model) or self.compiled_for(model)):
            return ""
        from runners.hooks import hooks_note

        return hooks_note(model)

    def forward_note(self, model: Module) -> str:
        """" · lean Qwen3 forward (attention: SDPA)" (``lean_label``) where the lean forward runs ``model``'s eager passes
        (and transformers' attention where the model's differs: its peers' rows run that), else "";
        with " on the C step (...)" where its decoding passes run the C step (``kernels.c_step.step_for``:
        its attention is its own), or why not where the model has no kernel plan (as loaded) and still cannot.
        While the model has forward hooks: " · transformers' forward (the model has forward hooks: ...)"."""
        if not self.lean_for(model):
            return ""
        hooked = self.hooks_note(model)
        if hooked:
            return f" · {hooked}"
        from kernels.prepacking import plan
        from kernels.c_step import STEP_ATTENTION, label, step_for, step_unsupported

        step = step_for(model, 1)
        words = label(model) if step else ""  # a bfloat16 model's: its weights' path named
        own = getattr(model.config, "_attn_implementation", None)
        note = f" · {lean_label(model)} (attention: {STEP_ATTENTION if step else ATTENTION}" + \
            (f"; transformers' paths: {own})" if own != "sdpa" else ")")
        if step:
            from kernels.one_copy import note as one_copy

            held_once = one_copy(model)
            return f"{note} on the " + (f"{words[:-1]}; {held_once})" if held_once else words)
        why = step_unsupported(model) if plan(model) is None else None
        return note + (f" (no C step: {why})" if why else "")


FORWARDS = ("auto", "lean", "transformers", "step")
STEP_GRAPHS = ("regional", "whole")  # how the compiled step makes graphs (``RunnerConfig.graphs``)
EAGER = RunnerConfig()  # the default: eager passes, but the compiled step for the Llama family on CUDA (``step_for``)


def lean_label(model: Module) -> str:
    """The headers' name of ``runners.lean``'s passes of ``model``: "lean Llama forward", "lean Qwen3 forward"."""
    return f"lean {family_name(model)} forward"


def step_name(model: Module) -> str:
    """And of ``runners.step``'s: "compiled lean Gemma 3 step"."""
    return f"compiled lean {family_name(model)} step"


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

