"""NASD's drafter (n-gram assisted speculative decoding): drafts by chaining an n-gram storage's
predictions (``ngram_assisted.ngram_storage``), chains or trees, and learns from every step."""
import heapq
import itertools
from dataclasses import dataclass
from typing import List, Tuple

import torch
from torch import Tensor

from drafters.base import UNREAD, Drafter, write_drafts
from drafters.spec import DraftContext, DrafterSpec
from kernels.row_topk import row_topk
from utils.logits_processor import clear_ranks, largest
from utils.parsing import check_positive_int

TREE_CHILDREN = 4  # continuations an n-gram tree considers after each node: the most frequent ones


class NGramDrafter(Drafter):
    """Drafts by chaining an n-gram storage's predictions; learns from every verification step.

    After a step, each emitted token is counted after its context, and so are the target's
    ``filler_top_k`` most probable tokens at that position when ``filler_top_k > 1``
    (``filler_top_k=1`` is NAPD, Ou et al. 2024). An unknown context ends the draft when
    ``stop_if_unknown``; otherwise a random token fills the slot, as in the reference.
    """

    supports_trees = True

    def __init__(self, storage, filler_top_k: int = 3, stop_if_unknown: bool = False):
        self.storage = storage
        self.filler_top_k = filler_top_k
        self.stop_if_unknown = stop_if_unknown
        self._matched = matched_reader(storage)
        self.reports_evidence = self._matched is not None
        self._evidence: List[int] | None = None

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, None]:
        context = tokens[max(0, len(tokens) - self.storage.n + 1) :]
        drafts: List[int] = []
        evidence: List[int] = []  # each draft's matched context length (0: a random filler)
        for _ in range(k):
            token, matched = self._matched(context) if self._matched is not None else (self.storage.predict(context), 1)
            if token is None:
                if self.stop_if_unknown:
                    break
                token, matched = int(torch.randint(self.storage.vocab_size, ())), 0
            drafts.append(token)
            evidence.append(matched)
            context = context[1:] + [token] if len(context) >= self.storage.n - 1 else context + [token]
        self._evidence = evidence if self._matched is not None else None
        return write_drafts(ids, len(tokens), drafts), None

    def evidence(self) -> List[int] | None:
        """Each draft's matched context length in the storage (0: a random filler)."""
        return self._evidence

    def propose_tree(self, tokens: List[int], budget: int) -> Tuple[List[int], List[int]]:
        """Up to ``budget`` nodes and their parents (-1: the root): the most probable branches by the
        storage's counts, best first (a node's estimate is the product of its path's count
        fractions), so every prefix of the nodes is the best smaller tree. [] when the context is unknown."""
        width = self.storage.n - 1
        nodes: List[int] = []
        parents: List[int] = []
        heap: list = []
        order = itertools.count()  # ties: the earlier candidate first

        def push(parent: int, context: List[int], mass: float) -> None:
            counts = self.storage.continuations(context)
            total = sum(counts.values())
            for token, count in heapq.nlargest(TREE_CHILDREN, counts.items(), key=lambda item: item[1]):
                heapq.heappush(heap, (-mass * count / total, next(order), parent, token, context))

        push(-1, list(tokens[max(0, len(tokens) - width) :]), 1.0)
        while heap and len(nodes) < budget:
            negative, _, parent, token, context = heapq.heappop(heap)
            nodes.append(token)
            parents.append(parent)
            push(len(nodes) - 1, (context + [token])[max(0, len(context) + 1 - width) :], -negative)
        return nodes, parents

    def accept_tree(self, tokens: List[int], start: int, nodes: List[int], parents: List[int], path: List[int], fetched) -> None:
        """Told after a tree step: learn as after a chain of the accepted branch ``path`` (the
        target's top-k of the root's row and of the branch's rows)."""
        rows = None if fetched is None else [fetched[0]] + [fetched[1 + i] for i in path]
        self.accept(tokens, start, len(path), rows)

    def fetch(self, target_probs: Tensor) -> Tensor | None:
        """The target's ``filler_top_k`` most probable tokens at every verified position ``[k + 1, top_k]``."""
        if self.filler_top_k <= 1:
            return None
        return target_probs.topk(min(self.filler_top_k, target_probs.size(-1)), dim=-1).indices

    def fetch_logits(self, logits: Tensor, temperature: float) -> Tensor | None:
        """``fetch``'s top-k read from the logits: the same indices in the same order where each row's ``filler_top_k + 1``
        largest logits stand clear of each other (``clear_ranks``: then the softmax keeps their order strictly), else ``UNREAD``."""
        if self.filler_top_k <= 1:
            return None
        count = min(self.filler_top_k, logits.size(-1))
        if count >= logits.size(-1):
            return UNREAD
        # the same as a top-k of each row where the ranks are clear: in C, one read of the row (else numpy's partition)
        values, indices = row_topk(logits, count + 1) or largest(logits, count + 1)
        if not all(clear_ranks(row, temperature, logits.dtype) for row in values.tolist()):
            return UNREAD
        return indices[:, :count]

    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: List[List[int]] | None) -> None:
        width = self.storage.n - 1
        for i in range(n_accepted + 1):
            position = start + i
            context = tokens[max(0, position - width) : position]
            self.storage.add(context, (tokens[position],))
            if fetched is not None:
                self.storage.add(context, fetched[i])


class TensorStorageDrafter(NGramDrafter):
    """``NGramDrafter`` for a storage that implements only the reference's tensor interface
    (``next_token``, ``update``, ``initialize``): the same drafting and learning, through its
    tensor methods, with the whole sequence so far as context (``[1, L]``, as the reference
    passes it). When the storage does not know the context, its own filler token is drafted,
    or the draft ends with ``stop_if_unknown``. No trees: they need the storage's counts."""

    supports_trees = False

    def __init__(self, storage, filler_top_k: int = 3, stop_if_unknown: bool = False):
        super().__init__(storage, filler_top_k, stop_if_unknown)
        self.reports_evidence = False  # the tensor methods tell no match length

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, None]:
        cur, count = len(tokens), 0
        for i in range(k):
            token, known = self.storage.next_token(ids[:, : cur + i])
            if not bool(torch.as_tensor(known).reshape(-1)[0]) and self.stop_if_unknown:
                break
            ids[0, cur + i] = int(torch.as_tensor(token).reshape(-1)[0])
            count += 1
        return count, None

    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: List[List[int]] | None) -> None:
        for i in range(n_accepted + 1):
            position = start + i
            context = torch.tensor([tokens[:position]], dtype=torch.long)
            self.storage.update(context, torch.tensor([[tokens[position]]], dtype=torch.long))
            if fetched is not None:
                self.storage.update(context, torch.tensor([fetched[i]], dtype=torch.long))


def ngram_drafter(storage, prompt: List[int], filler_top_k: int = 3, stop_if_unknown: bool = False) -> NGramDrafter:
    """The drafter for ``storage`` (an ``INgramStorage``), seeded with the prompt's n-grams: the int
    path for this project's storages, the tensor methods for a storage written against the
    reference's interface only."""
    if has_int_path(storage):
        storage.add_sequence(prompt)
        return NGramDrafter(storage, filler_top_k, stop_if_unknown)
    storage.initialize(torch.tensor([prompt], dtype=torch.long))
    return TensorStorageDrafter(storage, filler_top_k, stop_if_unknown)


def ngram_tree_drafter(storage, prompt: List[int], filler_top_k: int = 3) -> NGramDrafter:
    """``ngram_drafter`` for draft trees: refused (one line) for a storage without this project's int methods."""
    if not has_int_path(storage):
        raise ValueError("draft trees need a storage with this project's int methods (a CountingNGramStorage)")
    return ngram_drafter(storage, prompt, filler_top_k)


def matched_reader(storage):
    """``storage.predict_matched`` when it answers as the storage's ``predict`` does (both defined
    by the same class), else None: a storage that overrides ``predict`` alone drafts without evidence."""
    owner = next((c for c in type(storage).__mro__ if "predict" in vars(c)), None)
    return storage.predict_matched if owner is not None and "predict_matched" in vars(owner) else None


def has_int_path(storage) -> bool:
    """Whether ``storage`` is read through its int API (``CountingNGramStorage.int_path``); any other
    storage (the reference's ``INgramStorage`` interface alone) through its tensor methods."""
    return bool(getattr(storage, "int_path", False))


@dataclass(frozen=True)
class NGramSpec(DrafterSpec):
    """NASD: chains drafted from the n-gram storage ``DraftContext.storage`` (seeded with the prompt's
    n-grams), at most the generation's ``gamma`` a step; the storage learns every emitted token and
    the target's ``filler_top_k`` most probable tokens at each verified position (1: NAPD). An unknown
    context ends a draft with ``stop_if_unknown``, else a random token fills it (the reference)."""

    filler_top_k: int = 3
    stop_if_unknown: bool = False

    def __post_init__(self):
        check_positive_int("filler_top_k", self.filler_top_k)

    def make(self, prompt: List[int], target, config, context: DraftContext) -> NGramDrafter:
        return ngram_drafter(context.need("storage", "n-gram drafting"), prompt, self.filler_top_k, self.stop_if_unknown)


@dataclass(frozen=True)
class NGramTreeSpec(DrafterSpec):
    """NASD with draft trees: the storage ``DraftContext.storage`` (this project's int methods) proposes
    its most probable branches by count, up to ``tree_size`` nodes best first, verified in one target
    pass; it learns as ``NGramSpec``'s does. Needs a decoder-only target with full attention."""

    tree_size: int = 16
    filler_top_k: int = 3
    trees = True

    def __post_init__(self):
        check_positive_int("filler_top_k", self.filler_top_k)
        check_positive_int("tree_size", self.tree_size)

    def budget(self) -> int:
        return self.tree_size

    def make(self, prompt: List[int], target, config, context: DraftContext) -> NGramDrafter:
        return ngram_tree_drafter(context.need("storage", "n-gram drafting"), prompt, self.filler_top_k)
