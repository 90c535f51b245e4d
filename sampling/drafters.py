"""Every source of drafts, behind one protocol: a drafter model, prompt lookup, an n-gram storage
(this project's, or one written against the reference's tensor interface) and a chain of them."""
import heapq
import itertools
from typing import Any, List, Protocol, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from sampling.common import context_window
from sampling.config import GenerationConfig
from runners import Runner
from utils.logits_processor import LogitsProcessor

UNLIMITED = 1 << 30
TREE_CHILDREN = 4  # continuations an n-gram tree considers after each node: the most frequent ones


class Drafter(Protocol):
    """What the verification loop needs from a source of drafts. A drafter keeps no state between
    its calls within a step: what it asks of the target's distributions comes back to it whole.

    A drafter whose ``cheap`` attribute is true (n-gram storage, prompt lookup) costs nothing next to
    a verification pass; with ``DraftPolicy.auto`` it is asked to fill padded passes. ``memory_key``
    (optional) is what a ``DraftPolicy`` with ``remember`` knows it by across generations.
    """

    cheap: bool

    def max_drafts(self, position: int) -> int:
        """How many drafts it can propose for a sequence of ``position`` tokens."""

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, Tensor | None]:
        """Write up to ``k`` drafts into ``ids[0, len(tokens):]``; return how many, and their
        probabilities ``q`` ``[count, V]`` under the drafter (None for a deterministic drafter)."""

    def fetch(self, target_probs: Tensor) -> Any:
        """What the drafter needs on the host from the target's distributions ``[k + 1, V]``: a
        tensor, None, or a list of these, fetched in the step's single device sync."""

    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: Any) -> None:
        """Told after each step: ``tokens[start:]`` were emitted, the first ``n_accepted`` of them
        accepted drafts; ``fetched`` is what ``fetch`` returned, each tensor as nested lists."""


class ModelDrafter:
    """A small language model ``M_q`` drafting with the target's logits processor. It owns its
    confidence cutoff ``p_min`` (llama.cpp's ``--draft-p-min``) and never stops below ``min_draft``."""

    cheap = False

    def __init__(
        self, model: Runner, logits_processor: LogitsProcessor, vocab_size: int, window: int | None,
        p_min: float = 0.0, min_draft: int = 0,
    ):
        self.model = model
        self.memory_key = ("model", id(model.model))
        self.p_min, self.min_draft = p_min, min_draft
        self.logits_processor = logits_processor
        self.vocab_size = vocab_size
        self.window = window

    @classmethod
    def of(cls, model: Module, config: GenerationConfig, encoder_input_ids: List[int] | None = None) -> "ModelDrafter":
        """A drafter for ``model`` under ``config``: its processor, cache setting, shared
        vocabulary, and the policy's confidence cutoff and floor."""
        runner = config.runner(model, encoder_input_ids)
        policy = config.policy
        return cls(runner, config.processor, config.vocab_size, context_window(model), policy.p_min, policy.min_draft)

    def max_drafts(self, position: int) -> int:
        return self.window - position + 1 if self.window is not None else UNLIMITED

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, Tensor | None]:
        cur = len(tokens)
        k = min(k, self.max_drafts(cur))
        if k < self.min_draft:  # known before any draft is drawn: nothing is dropped after sampling
            return 0, None
        qs = []
        for i in range(k):
            q = self.logits_processor(self.model(ids[:, : cur + i], 1)[:, : self.vocab_size])
            # not confident: stop here, decided before this draft is drawn (never below min_draft)
            if self.p_min > 0 and i >= self.min_draft and float(q.max()) < self.p_min:
                break
            ids[0, cur + i] = self.logits_processor.sample(q)[0, 0]
            qs.append(q)
        return len(qs), torch.cat(qs) if qs else None

    def fetch(self, target_probs: Tensor) -> None:
        return None

    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: None) -> None:
        self.model.rollback(start + n_accepted)


def _write(ids: Tensor, at: int, drafts: List[int]) -> int:
    """Put ``drafts`` into ``ids[0, at:]``; returns how many."""
    if drafts:
        ids[0, at : at + len(drafts)] = torch.tensor(drafts, dtype=torch.long)
    return len(drafts)


def lookup_continuation(tokens: Sequence[int], min_ngram: int, max_ngram: int, count: int) -> List[int]:
    """Up to ``count`` tokens that followed the earliest earlier occurrence of the sequence's last
    n-gram, trying n from ``max_ngram`` down to ``min_ngram``; [] when none occurs."""
    length = len(tokens)
    for size in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        tail = list(tokens[length - size :])
        first = tail[0]
        for start in range(length - size):
            if tokens[start] == first and list(tokens[start : start + size]) == tail:
                return list(tokens[start + size : start + size + count])
    return []


class PromptLookupDrafter:
    """Drafts by copying what followed the last n-gram earlier in the prompt or the generation."""

    cheap = True

    def __init__(self, min_ngram: int = 1, max_ngram: int = 3):
        self.min_ngram, self.max_ngram = min_ngram, max_ngram

    def max_drafts(self, position: int) -> int:
        return UNLIMITED

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, None]:
        return _write(ids, len(tokens), lookup_continuation(tokens, self.min_ngram, self.max_ngram, k)), None

    def fetch(self, target_probs: Tensor) -> None:
        return None

    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: None) -> None:
        pass


class NGramDrafter:
    """Drafts by chaining an n-gram storage's predictions; learns from every verification step.

    After a step, each emitted token is counted after its context, and so are the target's
    ``filler_top_k`` most probable tokens at that position when ``filler_top_k > 1``
    (``filler_top_k=1`` is NAPD, Ou et al. 2024). An unknown context ends the draft when
    ``stop_if_unknown``; otherwise a random token fills the slot, as in the reference.
    """

    cheap = True

    def __init__(self, storage, filler_top_k: int = 3, stop_if_unknown: bool = False):
        self.storage = storage
        self.filler_top_k = filler_top_k
        self.stop_if_unknown = stop_if_unknown

    def max_drafts(self, position: int) -> int:
        return UNLIMITED

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, None]:
        context = tokens[max(0, len(tokens) - self.storage.n + 1) :]
        drafts: List[int] = []
        for _ in range(k):
            token = self.storage.predict(context)
            if token is None:
                if self.stop_if_unknown:
                    break
                token = int(torch.randint(self.storage.vocab_size, ()))
            drafts.append(token)
            context = context[1:] + [token] if len(context) >= self.storage.n - 1 else context + [token]
        return _write(ids, len(tokens), drafts), None

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
    or the draft ends with ``stop_if_unknown``."""

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
    from ngram_assisted.ngram_storage import has_int_path  # ngram_assisted imports sampling: not at import time

    if has_int_path(storage):
        storage.add_sequence(prompt)
        return NGramDrafter(storage, filler_top_k, stop_if_unknown)
    storage.initialize(torch.tensor([prompt], dtype=torch.long))
    return TensorStorageDrafter(storage, filler_top_k, stop_if_unknown)


class ChainedDrafter:
    """Each step, the first drafter of the chain that proposes something drafts (llama.cpp tries its
    n-gram caches before the draft model). Every drafter hears the outcome of every step."""

    def __init__(self, *drafters):
        self.drafters = drafters
        self.cheap = all(d.cheap for d in drafters)
        self.memory_key = ("chained",) + tuple(getattr(d, "memory_key", None) for d in drafters)
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
