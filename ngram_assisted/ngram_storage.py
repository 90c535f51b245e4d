"""N-gram storages: counts of which token followed which context, on plain Python ints.

``INgramStorage`` is the reference's abstract interface (tensor methods ``next_token``,
``has_gram``, ``update``, ``initialize``, ``reset``). This project's storages derive from
``CountingNGramStorage``, which adds the int methods the decoding loop uses (``predict``,
``add``, ``add_sequence``), never touching a device.
"""
import abc
from typing import Dict, Iterable, Sequence, Tuple

import torch
from torch import Tensor


class _Counts:
    """Counts of the tokens seen after one context, and the most frequent one (first seen wins ties)."""

    __slots__ = ("counts", "best")

    def __init__(self, token: int):
        self.counts: Dict[int, int] = {}
        self.best = token

    def add(self, token: int, count: int = 1) -> None:
        c = self.counts.get(token, 0) + count
        self.counts[token] = c
        if c > self.counts.get(self.best, 0):
            self.best = token


def _rows(input_ids: Tensor) -> list:
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    return input_ids.tolist()


class INgramStorage(abc.ABC):
    """The reference's interface of an n-gram storage, on tensors: predicts the next token from the
    tokens before it. A storage written against it (these five methods, nothing else) drafts for
    ``ngram_assisted_speculative_generate`` and chained drafting (``drafters.ChainedSpec``) through its tensor
    methods; this project's storages (``CountingNGramStorage``) are read through a faster int path.
    """

    def __init__(self, n: int, vocab_size: int):
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ValueError(f"n must be an integer >= 2, got {n!r}")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
        self.n = n
        self.vocab_size = vocab_size

    @abc.abstractmethod
    def next_token(self, input_ids: Tensor) -> Tuple[Tensor, Tensor]:
        """Per row of ``input_ids`` ``[B, L]``: the predicted next token ``[B]`` and whether the
        context was known ``[B]`` (bool; the token is then a filler of the storage's choice)."""

    @abc.abstractmethod
    def has_gram(self, ngram: Tensor) -> bool:
        """Whether the last token of ``ngram`` ``[L]`` was seen after the tokens before it."""

    @abc.abstractmethod
    def update(self, input_ids: Tensor, next_tokens: Tensor) -> None:
        """Count ``next_tokens[b]`` ``[B, 1 or more]`` as continuations of ``input_ids[b]`` ``[B, L]``."""

    @abc.abstractmethod
    def initialize(self, input_ids: Tensor) -> None:
        """Count the n-grams of each row of ``input_ids`` ``[B, L]`` (the prompt)."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget everything."""


class CountingNGramStorage(INgramStorage):
    """An ``INgramStorage`` kept as plain-int counts per context, with an int API for the decoding
    loop (``predict``, ``add``, ``add_sequence``, ``count``) that never touches a device; the
    reference's tensor methods are written on top of it."""

    # --- int API, used by the decoding loop -------------------------------------------------
    @property
    def int_path(self) -> bool:
        """Whether the drafters may read this storage through the int API: its tensor methods are
        this project's own (a subclass that overrides them is read through them instead)."""
        return all(getattr(type(self), name) is getattr(CountingNGramStorage, name) for name in _TENSOR_METHODS)

    @abc.abstractmethod
    def context_lengths(self, available: int) -> range:
        """Context lengths to consult, longest first, for a sequence of ``available`` tokens."""

    @abc.abstractmethod
    def table(self, length: int) -> Dict[Tuple[int, ...], _Counts]:
        """The counts for contexts of ``length`` tokens."""

    def predict(self, tokens: Sequence[int]) -> int | None:
        """Most frequent next token after the longest known context ending ``tokens``; None if unknown."""
        for j in self.context_lengths(len(tokens)):
            entry = self.table(j).get(tuple(tokens[len(tokens) - j :]))
            if entry is not None:
                return entry.best
        return None

    def predict_matched(self, tokens: Sequence[int]) -> Tuple[int | None, int]:
        """``predict``'s token and the length of the context it was found after (0: unknown)."""
        for j in self.context_lengths(len(tokens)):
            entry = self.table(j).get(tuple(tokens[len(tokens) - j :]))
            if entry is not None:
                return entry.best, j
        return None, 0

    def add(self, context: Sequence[int], tokens: Iterable[int]) -> None:
        """Count each of ``tokens`` once as a continuation of ``context`` (its last n - 1 tokens)."""
        tokens = list(tokens)
        if not tokens:
            return
        for j in self.context_lengths(len(context)):
            gram = tuple(context[len(context) - j :])
            table = self.table(j)
            entry = table.get(gram)
            if entry is None:
                entry = table[gram] = _Counts(tokens[0])
            for token in tokens:
                entry.add(token)

    def add_sequence(self, tokens: Sequence[int]) -> None:
        """Count every k-gram of ``tokens`` (what ``initialize`` does with a prompt)."""
        for i in range(1, len(tokens)):
            self.add(tokens[max(0, i - self.n + 1) : i], (tokens[i],))

    def continuations(self, tokens: Sequence[int]) -> Dict[int, int]:
        """Counts of every token seen after the longest known context ending ``tokens`` ({} if none)."""
        for j in self.context_lengths(len(tokens)):
            entry = self.table(j).get(tuple(tokens[len(tokens) - j :]))
            if entry is not None:
                return entry.counts
        return {}

    def count(self, context: Sequence[int], token: int) -> int:
        """Times ``token`` followed the longest stored context ending ``context`` (0 if none)."""
        for j in self.context_lengths(len(context)):
            entry = self.table(j).get(tuple(context[len(context) - j :]))
            if entry is not None:
                return entry.counts.get(token, 0)
        return 0

    # --- the reference's tensor API ---------------------------------------------------------
    def next_token(self, input_ids: Tensor) -> Tuple[Tensor, Tensor]:
        """Per row of ``input_ids`` ``[B, L]``: the predicted token ``[B]`` (random when unknown)
        and whether it was known ``[B]`` (bool)."""
        rows = _rows(input_ids)
        out = torch.randint(self.vocab_size, size=(len(rows),))
        known = torch.zeros(len(rows), dtype=torch.bool)
        for i, row in enumerate(rows):
            token = self.predict(row)
            if token is not None:
                out[i], known[i] = token, True
        return out.to(input_ids.device), known.to(input_ids.device)

    def has_gram(self, ngram: Tensor) -> bool:
        """Whether the last token of ``ngram`` ``[L]`` was seen after (a suffix of) the tokens before it."""
        tokens = ngram.tolist()
        if len(tokens) < 2:
            return False
        context, token = tokens[:-1], tokens[-1]
        return any(
            token in self.table(j).get(tuple(context[len(context) - j :]), _Counts(-1)).counts
            for j in self.context_lengths(len(context))
        )

    def update(self, input_ids: Tensor, next_tokens: Tensor) -> None:
        """Count ``next_tokens[b]`` (one or more) after the context ``input_ids[b]``."""
        for context, tokens in zip(_rows(input_ids), _rows(next_tokens.reshape(len(_rows(input_ids)), -1))):
            self.add(context, tokens)

    def initialize(self, input_ids: Tensor) -> None:
        """Count every k-gram of each row of ``input_ids`` ``[B, L]``."""
        for row in _rows(input_ids):
            self.add_sequence(row)


_TENSOR_METHODS = ("next_token", "has_gram", "update", "initialize")


class NGramStorage(CountingNGramStorage):
    """k-grams for every k in [2, n]: contexts of 1 to n - 1 tokens, the longest known one first.

    Unlike the reference, whose loop stops before contexts of one token (so that ``n=2``
    never predicts anything), a 2-gram storage here predicts from the last token.
    """

    def __init__(self, n: int, vocab_size: int):
        super().__init__(n, vocab_size)
        self.grams: Dict[int, Dict[Tuple[int, ...], _Counts]] = {j: {} for j in range(1, n)}

    def context_lengths(self, available: int) -> range:
        return range(min(self.n - 1, available), 0, -1)

    def table(self, length: int) -> Dict[Tuple[int, ...], _Counts]:
        return self.grams[length]

    def reset(self) -> None:
        self.grams = {j: {} for j in range(1, self.n)}


class OneLevelNGramStorage(CountingNGramStorage):
    """Only n-grams: a prediction needs the full context of n - 1 tokens."""

    def __init__(self, n: int, vocab_size: int):
        super().__init__(n, vocab_size)
        self.grams: Dict[Tuple[int, ...], _Counts] = {}

    def context_lengths(self, available: int) -> range:
        return range(self.n - 1, self.n - 2, -1) if available >= self.n - 1 else range(0)

    def table(self, length: int) -> Dict[Tuple[int, ...], _Counts]:
        return self.grams

    def reset(self) -> None:
        self.grams = {}
