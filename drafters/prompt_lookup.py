"""Prompt lookup (Saxena 2023; transformers' ``prompt_lookup_num_tokens``, vLLM's ``ngram``)."""
from dataclasses import dataclass
from typing import List, Sequence, Tuple

from torch import Tensor

from drafters.base import Drafter, write_drafts
from drafters.spec import DraftContext, DrafterSpec
from utils.parsing import check_positive_int


MATCH_CAP = 64  # how far back a match is measured: enough to tell a verbatim copy, bounded work


def lookup_continuation(tokens: Sequence[int], min_ngram: int, max_ngram: int, count: int) -> List[int]:
    """Up to ``count`` tokens that followed the earliest earlier occurrence of the sequence's last
    n-gram, trying n from ``max_ngram`` down to ``min_ngram``; [] when none occurs."""
    return lookup_with_match(tokens, min_ngram, max_ngram, count)[0]


def lookup_with_match(tokens: Sequence[int], min_ngram: int, max_ngram: int, count: int) -> Tuple[List[int], int]:
    """``lookup_continuation``'s drafts and how long the match is: the n-gram's tokens and as many
    before them (up to ``MATCH_CAP``) as agree with the sequence's (0 when nothing matched). The
    drafts do not depend on it: it only tells how verbatim the copy is."""
    length = len(tokens)
    for size in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        tail = list(tokens[length - size :])
        first = tail[0]
        for start in range(length - size):
            if tokens[start] == first and list(tokens[start : start + size]) == tail:
                match = size
                while match < MATCH_CAP and start - (match - size) > 0 and tokens[start - 1 - (match - size)] == tokens[length - 1 - match]:
                    match += 1
                return list(tokens[start + size : start + size + count]), match
    return [], 0


class PromptLookupDrafter(Drafter):
    """Drafts by copying what followed the last n-gram earlier in the prompt or the generation;
    each draft's evidence is the match's length (``lookup_with_match``)."""

    reports_evidence = True

    def __init__(self, min_ngram: int = 1, max_ngram: int = 3):
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self._evidence: List[int] = []

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, None]:
        drafts, match = lookup_with_match(tokens, self.min_ngram, self.max_ngram, k)
        self._evidence = [match] * len(drafts)
        return write_drafts(ids, len(tokens), drafts), None

    def evidence(self) -> List[int]:
        return self._evidence


@dataclass(frozen=True)
class PromptLookupSpec(DrafterSpec):
    """Prompt lookup decoding (Saxena 2023; transformers' ``prompt_lookup_num_tokens``, vLLM's ``ngram``):
    the longest suffix n-gram (``max_ngram_size`` down to ``min_ngram_size`` tokens) is searched in the
    prompt and the generated text; the ``num_pred_tokens`` tokens that followed its earliest
    occurrence are the drafts. Deterministic: greedy exact, sampling lossless."""

    num_pred_tokens: int = 10
    max_ngram_size: int = 3
    min_ngram_size: int = 1

    def __post_init__(self):
        check_positive_int("num_pred_tokens", self.num_pred_tokens)
        low, high = check_positive_int("min_ngram_size", self.min_ngram_size), check_positive_int("max_ngram_size", self.max_ngram_size)
        if low > high:
            raise ValueError(f"min_ngram_size ({low}) must be <= max_ngram_size ({high})")

    def budget(self) -> int:
        return self.num_pred_tokens

    def make(self, prompt: List[int], target, config, context: DraftContext) -> PromptLookupDrafter:
        return PromptLookupDrafter(self.min_ngram_size, self.max_ngram_size)
