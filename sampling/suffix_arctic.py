"""The authors' SuffixDecoding (``arctic-inference``'s ``SuffixDecodingCache``, C++) as a drafter
in this project's verification loop: the benchmark's peer for ``suffix``. Optional: install it with
``pip install arctic-inference==0.3.0`` (a source distribution; cmake and a C++20 compiler, no GPU)."""
from typing import List, Tuple

import torch
from torch.nn import Module

from drafters.arctic import ArcticSuffixDrafter, arctic_cache  # noqa: F401 (importable from here, as before)
from drafters.suffix import SuffixSettings
from sampling.entry import generate


@torch.no_grad()
def arctic_suffix_generate(inputs: List[int], target: Module, cache=None, settings: SuffixSettings | None = None,
                           **kwargs) -> Tuple[List[int], float]:
    """``suffix_generate`` with the authors' drafter: ``cache`` (``arctic_cache``; a fresh one
    without global memory when None) keeps what ``global_memory`` asked for across calls. The other
    keyword arguments are ``suffix_generate``'s (logits_processor, max_gen_len, use_cache, ...)."""
    settings = settings or SuffixSettings()

    def make(prompt, config):
        return ArcticSuffixDrafter(cache if cache is not None else arctic_cache(settings.max_tree_depth), prompt, settings)

    return generate(inputs, target, make, kwargs, gamma=settings.max_spec_tokens)
