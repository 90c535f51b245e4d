"""The authors' SuffixDecoding (``arctic-inference``'s ``SuffixDecodingCache``, C++) as a drafter
in this project's verification loop: the benchmark's peer for ``suffix``. Optional: install it with
``pip install arctic-inference==0.3.0`` (a source distribution; cmake and a C++20 compiler, no GPU)."""
import itertools
from typing import List, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from sampling.common import check_prompt, context_window, generation_end
from sampling.config import GenerationConfig
from sampling.drafters import UNLIMITED, _write
from sampling.speculative_decoding import speculative
from sampling.suffix import SuffixSettings

_REQUESTS = itertools.count()


def arctic_cache(max_tree_depth: int = 24, global_memory: bool = False):
    """A ``SuffixDecodingCache``: with ``global_memory`` its global tree keeps every response
    (``max_cached_requests=-1``), else none is kept (0). ImportError (one line) when not installed."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError:
        raise ImportError("arctic-inference is not installed (optional: pip install arctic-inference==0.3.0)") from None
    return SuffixDecodingCache(max_tree_depth=max_tree_depth, max_cached_requests=-1 if global_memory else 0)


class ArcticSuffixDrafter:
    """Drafts with ``cache.speculate`` for one request: path mode through ``propose``, tree mode
    through ``propose_tree`` (the protocol of ``SuffixDrafter.propose_tree``). The request's prompt
    is its local tree; emitted tokens are added as its response (also to the global tree when the
    cache keeps responses). Call ``stop()`` when the generation ends."""

    cheap = True

    def __init__(self, cache, prompt: List[int], settings: SuffixSettings):
        self.cache, self.settings = cache, settings
        self.memory_key = ("arctic-suffix",)
        self.request = next(_REQUESTS)
        cache.start_request(self.request, prompt)
        self.seen = len(prompt)

    def _speculate(self, tokens: List[int], budget: int, tree: bool):
        s = self.settings
        if len(tokens) > self.seen:
            self.cache.add_active_response(self.request, tokens[self.seen :])
            self.seen = len(tokens)
        return self.cache.speculate(self.request, tokens[-s.max_tree_depth :], max_spec_tokens=min(budget, s.max_spec_tokens),
                                    max_spec_factor=s.max_spec_factor, max_spec_offset=s.max_spec_offset,
                                    min_token_prob=s.min_token_prob, use_tree_spec=tree)

    def propose_tree(self, tokens: List[int], budget: int) -> Tuple[List[int], List[int]]:
        draft = self._speculate(tokens, budget, True)
        return list(draft.token_ids), list(draft.parents)

    def max_drafts(self, position: int) -> int:
        return UNLIMITED

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, None]:
        return _write(ids, len(tokens), list(self._speculate(tokens, k, False).token_ids)), None

    def fetch(self, target_probs: Tensor) -> None:
        return None

    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: None) -> None:
        pass  # the next speculate adds the emitted tokens

    def stop(self) -> None:
        self.cache.stop_request(self.request)


@torch.no_grad()
def arctic_suffix_generate(inputs: List[int], target: Module, cache=None, settings: SuffixSettings | None = None,
                           **kwargs) -> Tuple[List[int], float]:
    """``suffix_generate`` with the authors' drafter: ``cache`` (``arctic_cache``; a fresh one
    without global memory when None) keeps what ``global_memory`` asked for across calls. The other
    keyword arguments are ``suffix_generate``'s (logits_processor, max_gen_len, use_cache, ...)."""
    prompt = check_prompt(inputs)
    settings = settings or SuffixSettings()
    config = GenerationConfig.of(kwargs, gamma=settings.max_spec_tokens)
    generation_end(len(prompt), config.max_gen_len, context_window(target))
    drafter = ArcticSuffixDrafter(cache if cache is not None else arctic_cache(settings.max_tree_depth), prompt, settings)
    try:
        return speculative(prompt, config.runner(target), drafter, config)
    finally:
        drafter.stop()
