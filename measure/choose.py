"""The one-call choices a notebook or a script makes to run what the REPL and the benchmark run:
``choose_kernels`` (the decoding kernels by ``measure.timing.measure_kernels``, then a long prompt's
GEMM by ``measure.prompt.choose_prompt``) and ``choose_prepack``. Not saved: the start-up's own
path (``measure.steps``) saves and reuses each measurement."""
from typing import Optional, Tuple

import torch
from torch.nn import Module

from measure.kernels import KernelChoice, decide
from measure.prompt import choose_prompt
from measure.timing import Budget, measure_kernels
from runners import prepackable


@torch.no_grad()
def choose_kernels(model: Module, budget: Optional[Budget] = None) -> Tuple[Optional[KernelChoice], str]:
    """Measure the kernel options of ``model`` (``measure_kernels``), give it the faster for plain
    decoding, and return the measurement with one line saying what was measured and chosen (None
    and the model's own linears when nothing could be measured). A notebook calls this once per
    model to run what the REPL and the benchmark run: every pass on the kernels measured faster for
    its width, a long prompt's on the many-row GEMM measured fastest (``measure.prompt.choose_prompt``,
    its line after "; " where the model's long passes run the float32 C step)."""
    if not prepackable(model):
        return None, "no float32 CPU linear layers to prepack"
    choice, line = decide(model, measure_kernels(model, budget=budget), budget)
    prompt = choose_prompt(model, budget)
    return choice, line if prompt is None else f"{line}; {prompt}"


@torch.no_grad()
def choose_prepack(model: Module, budget: Optional[Budget] = None) -> str:
    """``choose_kernels``' line only: the model gets the kernels that decode fastest."""
    return choose_kernels(model, budget)[1]
