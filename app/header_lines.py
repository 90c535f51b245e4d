"""How a model is named in the headers: ``describe`` (the full line: device, weights, KV cache, runner,
kernels), ``summary`` (the short one) and ``passes_label`` (what runs its passes, in a few words)."""
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional

if TYPE_CHECKING:
    from torch.nn import Module


def describe(model: "Module", label: str, quantize: str, notes: Optional[Dict[str, str]] = None, runner=None) -> str:
    """One line: the model, where it runs, its weights, its KV cache, its runner (``runner``, a ``RunnerConfig``;
    None: the defaults) and, eager, its prepacked linears; ``notes``: how the cache, the kernels and the
    prompt GEMM (its long passes' variant and chunk length, ``measure.prompt``) were chosen."""
    from kernels.prepacking import PREPACKED, plan
    from runners import EAGER, compiled_label, step_label
    from utils.quantization import model_quantization

    notes, runner = notes or {}, runner or EAGER
    if runner.gguf is not None:  # the torch model is only what the loops read of it (and the peers' model)
        return f"{label} · target on {runner.describe(model)}, {Path(runner.gguf).name} · cpu"
    if model_quantization(model) in ("int4", "int8"):
        quantize += " (CPU weight-only kernels, bfloat16 activations)"
    line = f"{label} · {next(model.parameters()).device} · {model.dtype} · quantization {quantize} · "
    if runner.hooks_note(model):  # transformers' forward runs its passes while it has hooks (runners.hooks)
        return line + runner.describe(model)
    if runner.step_for(model):
        return line + f"static KV cache · {step_label(model)}: {runner.step_reason(model)}"
    if runner.compiled_for(model):
        why = runner.compiled_reason(model)  # CUDA's default for a model the step cannot take
        return line + f"static KV cache · {compiled_label(model)}" + (f": {why}" if why else "")
    why = runner.eager_reason(model)  # on CUDA: why not compiled
    line += notes.get("cache", f"{runner.cache_for(model)} KV cache") + " · eager" + (f" ({why})" if why else "") + runner.forward_note(model)
    prompt = f" · {notes['prompt']}" if "prompt" in notes else ""
    if "kernels" in notes:
        return line + f" · {notes['kernels']}" + prompt
    return line + (" · prepacked linears" if PREPACKED in (plan(model) or ()) else "") + prompt


def summary(model: "Module", label: str, quantize: str, runner=None) -> str:
    """One short line: the model, its device and dtype (and weight format), and what runs its passes,
    e.g. "SmolLM2-135M-Instruct · cpu float32 · C step"."""
    from runners import EAGER
    from utils.quantization import model_quantization

    runner = runner or EAGER
    if runner.gguf is not None:
        return f"{label} · cpu · llama.cpp ({Path(runner.gguf).name})"
    weights = f"{next(model.parameters()).device} {str(model.dtype).removeprefix('torch.')}"
    if model_quantization(model) in ("int4", "int8"):
        weights += f", {quantize} weights"
    return f"{label} · {weights} · {passes_label(model, runner)}"


def passes_label(model: "Module", runner) -> str:
    """What runs ``model``'s passes under ``runner``, in a few words: "C step" (a bfloat16 model's with its
    weights' path and why: "C step, AVX-512 widening load by measurement"), "compiled lean step",
    "compiled passes", "lean forward, prepacked linears", "transformers' forward"."""
    from kernels.c_step import short_label, step_for
    from kernels.prepacking import plan

    if runner.step_for(model):
        return "compiled lean step"
    if runner.compiled_for(model):
        return "compiled passes"
    lean = runner.lean_for(model)
    if lean and step_for(model, 1):
        return short_label(model)
    forward = "lean forward" if lean else "transformers' forward"
    route = set(plan(model) or ())
    if route <= {"own"}:
        return forward
    return forward + (f", {route.pop()} linears" if len(route) == 1 else ", linears by pass width")
