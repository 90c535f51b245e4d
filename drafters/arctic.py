"""The authors' SuffixDecoding (``arctic-inference``'s ``SuffixDecodingCache``, C++) as a drafter:
the benchmark's peer for ``suffix``. Optional: install it with ``pip install arctic-inference==0.3.0``
(a source distribution; cmake and a C++20 compiler, no GPU)."""
import itertools
from dataclasses import dataclass
from typing import List, Tuple

from torch import Tensor

from drafters.base import Drafter, write_drafts
from drafters.spec import DraftContext, DrafterSpec
from drafters.suffix import SuffixSettings

_REQUESTS = itertools.count()


def arctic_cache(max_tree_depth: int = 24, global_memory: bool = False):
    """A ``SuffixDecodingCache``: with ``global_memory`` its global tree keeps every response
    (``max_cached_requests=-1``), else none is kept (0). ImportError (one line) when not installed."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError:
        raise ImportError("arctic-inference is not installed (optional: pip install arctic-inference==0.3.0)") from None
    return SuffixDecodingCache(max_tree_depth=max_tree_depth, max_cached_requests=-1 if global_memory else 0)


class ArcticSuffixDrafter(Drafter):
    """Drafts with ``cache.speculate`` for one request: path mode through ``propose``, tree mode
    through ``propose_tree`` (the protocol of ``SuffixDrafter.propose_tree``). The request's prompt
    is its local tree; emitted tokens are added as its response (also to the global tree when the
    cache keeps responses). Call ``stop()`` when the generation ends."""

    supports_trees = True

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

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, None]:
        return write_drafts(ids, len(tokens), list(self._speculate(tokens, k, False).token_ids)), None

    # accept, accept_tree: the base's (nothing): the next speculate adds the emitted tokens

    def stop(self) -> None:
        self.cache.stop_request(self.request)

    def finish(self, output: List[int] | None) -> None:
        self.stop()


@dataclass(frozen=True)
class ArcticSpec(SuffixSettings, DrafterSpec):
    """``SuffixSpec`` (path mode) with the authors' drafter: ``DraftContext.memory`` is its
    ``SuffixDecodingCache`` (``arctic_cache``), which keeps what its ``global_memory`` asked for across
    generations; None: a fresh one without global memory each generation."""

    def budget(self) -> int:
        return self.max_spec_tokens

    def make(self, prompt: List[int], target, config, context: DraftContext) -> ArcticSuffixDrafter:
        cache = context.memory if context.memory is not None else arctic_cache(self.max_tree_depth)
        return ArcticSuffixDrafter(cache, prompt, self)
