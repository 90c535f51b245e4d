"""NASD: n-gram assisted speculative decoding (an n-gram storage replaces the drafter model)."""
from typing import Callable, List, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from ngram_assisted.ngram_storage import INgramStorage, has_int_path
from sampling.common import check_positive_int, check_prompt, context_window, generation_end, reference_keywords, stop_token_set
from sampling.draft_policy import DraftPolicy
from sampling.speculative_decoding import check_gamma, draft_and_verify
from sampling.stats import GenerationStats
from utils.caching import KVCacheModel
from utils.logits_processor import GreedyProcessor, LogitsProcessor


class NGramDrafter:
    """Drafts by chaining the storage's predictions; learns from every verification step.

    After a step, each emitted token is counted after its context, and so are the target's
    ``filler_top_k`` most probable tokens at that position when ``filler_top_k > 1``
    (``filler_top_k=1`` is NAPD, Ou et al. 2024). An unknown context ends the draft when
    ``stop_if_unknown``; otherwise a random token fills the slot, as in the reference.
    """

    cheap = True

    def __init__(self, storage: INgramStorage, filler_top_k: int = 3, stop_if_unknown: bool = False):
        self.storage = storage
        self.filler_top_k = filler_top_k
        self.stop_if_unknown = stop_if_unknown

    def max_drafts(self, position: int) -> int:
        return 1 << 30

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
        if drafts:
            ids[0, len(tokens) : len(tokens) + len(drafts)] = torch.tensor(drafts, dtype=torch.long)
        return len(drafts), None

    def fetch(self, target_probs: Tensor) -> Tensor | None:
        """The target's ``filler_top_k`` most probable tokens at every verified position."""
        if self.filler_top_k <= 1:
            return None
        self._width = min(self.filler_top_k, target_probs.size(-1))
        return target_probs.topk(self._width, dim=-1).indices

    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: List[int]) -> None:
        fillers = None
        if self.filler_top_k > 1:
            fillers = [fetched[i * self._width : (i + 1) * self._width] for i in range(n_accepted + 1)]
        width = self.storage.n - 1
        for i in range(n_accepted + 1):
            position = start + i
            context = tokens[max(0, position - width) : position]
            self.storage.add(context, (tokens[position],))
            if fillers is not None:
                self.storage.add(context, fillers[i])


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

    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: List[int]) -> None:
        width = getattr(self, "_width", 0)
        for i in range(n_accepted + 1):
            position = start + i
            context = torch.tensor([tokens[:position]], dtype=torch.long)
            self.storage.update(context, torch.tensor([[tokens[position]]], dtype=torch.long))
            if self.filler_top_k > 1:
                fillers = fetched[i * width : (i + 1) * width]
                self.storage.update(context, torch.tensor([fillers], dtype=torch.long))


def ngram_drafter(storage: INgramStorage, prompt: List[int], filler_top_k: int = 3, stop_if_unknown: bool = False) -> NGramDrafter:
    """The drafter for ``storage``, seeded with the prompt's n-grams: the int path for this project's
    storages, the tensor methods for a storage written against the reference's interface only."""
    if has_int_path(storage):
        storage.add_sequence(prompt)
        return NGramDrafter(storage, filler_top_k, stop_if_unknown)
    storage.initialize(torch.tensor([prompt], dtype=torch.long))
    return TensorStorageDrafter(storage, filler_top_k, stop_if_unknown)


@reference_keywords
@torch.no_grad()
def ngram_assisted_speculative_generate(
    inputs: List[int],
    ngramstorage: INgramStorage,
    target: Module,
    tokenizer=None,
    gamma: int = 5,
    filler_top_k: int = 3,
    logits_processor: LogitsProcessor = GreedyProcessor(),
    max_gen_len: int = 40,
    eos_tokens_id: int | List[int] = 1,
    pad_token_id: int = 0,
    use_cache: bool = False,
    first_target: bool = True,
    stop_if_unknown: bool = False,
    debug: bool = False,
    stats: GenerationStats | None = None,
    policy: DraftPolicy | None = None,
    streamer: Callable[[List[int], int], None] | None = None,
) -> Tuple[List[int], float]:
    """N-gram assisted speculative decoding (NASD; Leviathan et al. 2023 with an n-gram drafter).

    The storage (seeded with the prompt's k-grams) proposes ``gamma`` tokens by chaining its
    predictions; the target (M_p) verifies them in one forward pass. The drafts are deterministic,
    so acceptance compares tokens: the target draws its own token ``t_i ~ p_i`` (argmax when
    greedy), drafts are accepted while they equal ``t_i``, and the first differing ``t_i`` is
    emitted. Greedy output therefore equals greedy autoregressive output, and sampled output is the
    target's own sample at every position. (The reference draws a second, fresh sample at the
    mismatch, which biases the output toward the draft.)

    ``ngramstorage`` is any ``INgramStorage``: this project's storages are read through their int
    methods; one that implements only the reference's five tensor methods is read through those.
    ``stats``, ``policy`` and ``streamer`` are as in ``speculative_generate``.

    Returns:
        (new token ids, acceptance rate = accepted drafts / drafted tokens).
    """
    prompt = check_prompt(inputs)
    check_gamma(gamma)
    check_positive_int("filler_top_k", filler_top_k)
    end = generation_end(len(prompt), max_gen_len, context_window(target))
    stats = stats if stats is not None else GenerationStats()
    drafter = ngram_drafter(ngramstorage, prompt, filler_top_k, stop_if_unknown)
    out = draft_and_verify(
        prompt, KVCacheModel(target, use_cache), drafter, logits_processor, gamma, end,
        stop_token_set(eos_tokens_id), None, first_target, False, stats, debug, tokenizer, policy, streamer,
    )
    return out, stats.acceptance_rate
