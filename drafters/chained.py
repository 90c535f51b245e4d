"""A chain of drafters: the first that proposes something drafts (llama.cpp tries its n-gram caches
before the draft model)."""
from dataclasses import dataclass
from typing import List, Tuple

from torch import Tensor

from drafters.base import Drafter, as_drafter
from drafters.model import ModelDrafter
from drafters.ngram import ngram_drafter
from drafters.spec import DraftContext, DrafterSpec
from runners.limits import common_vocab_size
from utils.parsing import check_positive_int


class ChainedDrafter(Drafter):
    """Each step, the first drafter of the chain that proposes something drafts. Every drafter hears
    the outcome of every step."""

    def __init__(self, *drafters):
        self.drafters = tuple(as_drafter(d) for d in drafters)
        self.cheap = all(d.cheap for d in self.drafters)
        self.memory_key = ("chained",) + tuple(d.memory_key for d in self.drafters)
        self.used: List[int] = [0] * len(drafters)  # steps drafted by each

    def max_drafts(self, position: int) -> int:
        return max(d.max_drafts(position) for d in self.drafters)

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, Tensor | None]:
        for i, drafter in enumerate(self.drafters):
            count, q = drafter.propose(ids, tokens, min(k, drafter.max_drafts(len(tokens))))
            if count > 0:
                self.used[i] += 1
                return count, q
        return 0, None

    def fetch(self, target_probs: Tensor) -> list:
        return [d.fetch(target_probs) for d in self.drafters]

    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: list) -> None:
        for drafter, wanted in zip(self.drafters, fetched):
            drafter.accept(tokens, start, n_accepted, wanted)

    def finish(self, output: List[int] | None) -> None:
        for drafter in self.drafters:
            drafter.finish(output)


@dataclass(frozen=True)
class ChainedSpec(DrafterSpec):
    """Chained drafting: the n-gram storage ``DraftContext.storage`` drafts when it knows the context
    (it learns from every step as in NASD, ``filler_top_k``), else the drafter model
    ``DraftContext.drafter``. A storage's step is verified by token comparison, a model's by rejection
    sampling: both keep greedy exact and sampling lossless."""

    filler_top_k: int = 3

    def __post_init__(self):
        check_positive_int("filler_top_k", self.filler_top_k)

    def prepare(self, target, context: DraftContext) -> dict:
        drafter = context.need("drafter", "chained drafting")
        return {**super().prepare(target, context), "vocab_size": common_vocab_size(drafter, target, context.tokenizer)}

    def make(self, prompt: List[int], target, config, context: DraftContext) -> ChainedDrafter:
        storage = context.need("storage", "chained drafting")
        return ChainedDrafter(ngram_drafter(storage, prompt, self.filler_top_k, stop_if_unknown=True),
                              ModelDrafter.of(context.drafter, config))
