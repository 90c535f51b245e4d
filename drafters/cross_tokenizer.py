"""A drafter model with its own tokenizer (Timor et al., ICML 2025, "Universal Speculative Decoding";
transformers' Universal Assisted Generation): the target verifies target tokens, so greedy output
equals the target's whatever the drafter proposes.

* Greedy, text translation (UAG): the drafter continues the committed text greedily in its own
  tokens; the new text is re-tokenized by the target's tokenizer after an anchor of committed
  target tokens; the last target token is dropped unless the drafter ended on a special token,
  since the draft's text may end inside it (the drafter would have written more of it).
* Sampling, token-level intersection (USD): drafts are restricted to the tokens both vocabularies
  spell identically; the drafter's processed distribution over them, mapped to target ids, is
  ``q``, and the loop's standard rule (accept with ``min(1, p/q)``, resample a rejection from
  ``norm(max(0, p - q))`` over the target's vocabulary) keeps the output the target's distribution.

After each step the drafter's context is the committed target text re-encoded by its own
tokenizer after its own prompt; only the positions past the common prefix with what it has
cached are run again (the KV cache is rolled back to that prefix).
"""
from typing import Dict, List, Sequence, Tuple

import torch
from torch import Tensor

from drafters.base import Drafter
from utils.logits_processor import GreedyProcessor, LogitsProcessor

ANCHOR = 3  # committed tokens re-decoded before new text, so that a tokenizer sees the boundary as it was


def _decode(tokenizer, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _encode(tokenizer, text: str) -> List[int]:
    return tokenizer(text, add_special_tokens=False).input_ids if text else []


def model_name(tokenizer) -> str:
    """How a line names the model a tokenizer belongs to."""
    return str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def spelled(tokenizer) -> Dict[str, int]:
    """Each text one token of ``tokenizer`` spells alone, to its id: texts spelled by two ids,
    empty ones and partial characters (``\\ufffd``) left out, so the map is one-to-one."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False)
    seen: Dict[str, int] = {}
    clashes = set()
    for i, text in enumerate(texts):
        if not text or "\ufffd" in text:
            continue
        if text in seen:
            clashes.add(text)
        seen[text] = i
    return {text: i for text, i in seen.items() if text not in clashes}


def check_spelling(tokenizer, text: str, name: str | None = None) -> None:
    """ValueError, in one line naming the drafter (``name``, else the tokenizer's), when ``tokenizer``
    cannot write ``text`` back as it was (characters or bytes it has no token for)."""
    back = _decode(tokenizer, _encode(tokenizer, text))
    if back != text:
        at = next((i for i, (a, b) in enumerate(zip(text, back)) if a != b), min(len(text), len(back)))
        raise ValueError(f"the drafter '{name or model_name(tokenizer)}' cannot spell the target's text: its tokenizer "
                         f"turns {text[at:at + 12]!r} into {back[at:at + 12]!r}")


class Translation:
    """What two tokenizers share and how text goes between them: the shared tokens (spelled
    identically, ``drafter_ids[i]`` <-> ``target_ids[i]``), the round-trip check, and the target
    tokens that continue committed target tokens with new text."""

    def __init__(self, target_tokenizer, drafter_tokenizer):
        self.target, self.drafter = target_tokenizer, drafter_tokenizer
        target_texts, drafter_texts = spelled(target_tokenizer), spelled(drafter_tokenizer)
        shared = sorted(text for text in drafter_texts if text in target_texts)
        self.drafter_ids = torch.tensor([drafter_texts[t] for t in shared], dtype=torch.long)  # [S]
        self.target_ids = torch.tensor([target_texts[t] for t in shared], dtype=torch.long)  # [S]
        self.drafter_stops = frozenset(getattr(drafter_tokenizer, "all_special_ids", ()) or ())

    @property
    def shared(self) -> int:
        return int(self.drafter_ids.numel())

    def check(self, text: str) -> None:
        """ValueError, in one line, when the drafter's tokenizer cannot spell ``text`` back."""
        check_spelling(self.drafter, text)

    def to_drafter(self, target_ids: Sequence[int]) -> List[int]:
        """Target tokens as the drafter's tokenizer writes their text."""
        return _encode(self.drafter, _decode(self.target, target_ids))

    def stops(self, target_stops: Sequence[int]) -> List[int]:
        """The drafter's ids of the target's stop tokens it spells identically."""
        return [d for d, t in zip(self.drafter_ids.tolist(), self.target_ids.tolist()) if t in target_stops]

    def back(self, committed: Sequence[int], drafter_ids: Sequence[int]) -> List[int]:
        """The drafter's tokens, written after the ``committed`` target tokens, as target tokens."""
        return self.continuation(committed, _decode(self.drafter, drafter_ids))

    def continuation(self, committed: Sequence[int], text: str) -> List[int]:
        """The target tokens that write ``text`` after the ``committed`` target tokens: ``text``
        encoded after the text of the last committed tokens, when that encoding starts with them."""
        for j in range(min(ANCHOR, len(committed)), 0, -1):
            anchor = list(committed[-j:])
            encoded = _encode(self.target, _decode(self.target, anchor) + text)
            if encoded[:j] == anchor:
                return encoded[j:]
        return _encode(self.target, text)


def new_text(tokenizer, before: Sequence[int], new: Sequence[int]) -> str:
    """The text ``new`` tokens add after the ``before`` tokens (the last ``ANCHOR`` of them decoded
    with them, so that a tokenizer that writes a token's space by its position writes it right)."""
    anchor = list(before[-ANCHOR:])
    head = _decode(tokenizer, anchor)
    whole = _decode(tokenizer, anchor + list(new))
    return whole[len(head):] if whole.startswith(head) else _decode(tokenizer, new)


class CrossTokenizerDrafter(Drafter):
    """A drafter model ``M_q`` with another tokenizer than the target's (see the module's docstring).

    ``runner``: the drafter's runner (``config.make_runner(model, drafter=True)``); ``drafter_prompt``: the prompt as
    the drafter reads it (its own chat template's rendering); ``prompt_len``: the target prompt's
    length; ``width``: the target's logit columns; ``window``: the drafter's context window."""

    cheap = False

    def __init__(self, runner, translation: Translation, processor: LogitsProcessor, drafter_prompt: List[int],
                 prompt_len: int, width: int, window: int | None):
        self.runner, self.translation, self.processor = runner, translation, processor
        self.greedy = isinstance(processor, GreedyProcessor)
        self.memory_key = ("cross", id(runner.model))
        self.prompt, self.prompt_len, self.width, self.window = list(drafter_prompt), prompt_len, width, window
        self.context: List[int] = []  # the drafter's tokens: the first runner.cached of them are in its cache
        self.committed: List[int] = []  # the drafter's tokens for the committed text, as of the last sync
        self.passes = 0  # drafter forward passes

    def _sync(self, tokens: List[int]) -> None:
        """The drafter's context: its prompt, then the committed target text in its tokens; the
        cache rolled back to the prefix it shares with what was cached."""
        want = self.prompt + self.translation.to_drafter(tokens[self.prompt_len:])
        same = 0
        for a, b in zip(self.context, want):
            if a != b:
                break
            same += 1
        self.runner.rollback(min(same, getattr(self.runner, "cached", 0), len(want) - 1))
        self.context, self.committed = want, list(want)

    def _logits(self) -> Tensor | None:
        """The drafter's logits ``[V_drafter]`` after its context; None past its window."""
        if self.window is not None and len(self.context) >= self.window:
            return None
        self.passes += 1
        return self.runner(torch.tensor([self.context], dtype=torch.long), 1)[0]

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, Tensor | None]:
        self._sync(tokens)
        return self._translate(ids, tokens, k) if self.greedy else self._intersect(ids, len(tokens), k)

    def _translate(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, None]:
        """Greedy: up to ``2k + 1`` drafter tokens, until their text gives ``k`` target tokens followed by more."""
        new: List[int] = []
        drafts: List[int] = []
        ended = False
        for _ in range(2 * k + 1):
            logits = self._logits()
            if logits is None:
                break
            token = int(logits.argmax())
            self.context.append(token)
            new.append(token)
            ended = token in self.translation.drafter_stops
            drafts = self.translation.continuation(tokens, new_text(self.translation.drafter, self.committed, new))
            if ended or len(drafts) > k:
                break
        drafts = (drafts if ended else drafts[:-1])[:k]  # a draft may end inside the target's last token
        if drafts:
            ids[0, len(tokens) : len(tokens) + len(drafts)] = torch.tensor(drafts, dtype=torch.long)
        return len(drafts), None

    def _intersect(self, ids: Tensor, cur: int, k: int) -> Tuple[int, Tensor | None]:
        """Sampling: each draft drawn from the drafter's processed distribution over the shared
        tokens; ``q`` ``[count, width]`` that distribution on the target's ids (0 elsewhere)."""
        shared_d, shared_t = self.translation.drafter_ids, self.translation.target_ids
        qs: List[Tensor] = []
        if not shared_d.numel():
            return 0, None
        for i in range(k):
            logits = self._logits()
            if logits is None:
                break
            q_shared = self.processor(logits[shared_d.to(logits.device)].unsqueeze(0))  # [1, S]
            pick = int(self.processor.sample(q_shared)[0, 0])
            self.context.append(int(shared_d[pick]))
            ids[0, cur + i] = shared_t[pick]
            q = torch.zeros((1, self.width), dtype=q_shared.dtype, device=q_shared.device)
            q[0, shared_t.to(q.device)] = q_shared[0]
            qs.append(q)
        return len(qs), torch.cat(qs) if qs else None


# the last pairs' translations, oldest first; each entry keeps its tokenizers, so that the ids of its
# key stay theirs while it is kept. Bounded: a notebook loading pair after pair keeps the last few, not all.
_TRANSLATIONS: Dict[Tuple[int, int], Tuple[object, object, Translation]] = {}
TRANSLATIONS_KEPT = 4


def translation(target_tokenizer, drafter_tokenizer) -> Translation:
    """The ``Translation`` of two tokenizers, built once per pair (spelling a vocabulary takes a second)
    and kept while the pair is among the last ``TRANSLATIONS_KEPT`` used."""
    key = (id(target_tokenizer), id(drafter_tokenizer))
    found = _TRANSLATIONS.pop(key, None)
    if found is None:
        found = (target_tokenizer, drafter_tokenizer, Translation(target_tokenizer, drafter_tokenizer))
    _TRANSLATIONS[key] = found  # the most recent last
    while len(_TRANSLATIONS) > TRANSLATIONS_KEPT:
        del _TRANSLATIONS[next(iter(_TRANSLATIONS))]
    return found[2]


def same_vocabulary(tokenizer, other) -> bool:
    """Whether two tokenizers give every text the same ids (the same object, or the same vocabulary)."""
    return other is tokenizer or (tokenizer is not None and other.get_vocab() == tokenizer.get_vocab())


def cross_drafter(model, config, prompt: List[int], target, tokenizer, drafter_tokenizer,
                  drafter_prompt: List[int] | None = None) -> CrossTokenizerDrafter:
    """A ``CrossTokenizerDrafter`` for ``model`` under ``config`` (its processor and runner), after
    checking, in one line each, that the drafter can spell the target prompt's text. ``drafter_prompt``:
    the prompt as the drafter reads it (None: the target prompt's text in the drafter's tokens)."""
    from runners.limits import context_window, output_vocab_size

    if tokenizer is None:
        raise ValueError("a drafter with its own tokenizer needs the target's tokenizer (tokenizer=...)")
    spelling = translation(tokenizer, drafter_tokenizer)
    text = _decode(tokenizer, prompt)
    spelling.check(text)
    if drafter_prompt is None:
        drafter_prompt = _encode(drafter_tokenizer, text)
    if not drafter_prompt:
        raise ValueError(f"the drafter '{model_name(drafter_tokenizer)}' reads the prompt as no tokens")
    width = output_vocab_size(target)
    if spelling.target_ids.numel() and int(spelling.target_ids.max()) >= width or \
            spelling.drafter_ids.numel() and int(spelling.drafter_ids.max()) >= output_vocab_size(model):
        raise ValueError("a shared token's id is past the model's output rows: tokenizer and model disagree")
    return CrossTokenizerDrafter(config.make_runner(model, drafter=True), spelling, config.processor, drafter_prompt, len(prompt), width,
                                 context_window(model))


ROUND_TRIP_PROBE = "def area(r):\n    return 3.14159 * r ** 2  # café, naïve, ∑ → ✓\n\tdone."  # code, accents, symbols


def cross_problem(target_tokenizer, drafter_tokenizer, name: str, chat: bool = True) -> str | None:
    """What keeps a drafter ``name`` with another vocabulary from drafting for the target, in one
    line naming it (None: nothing): no tokenizer; no chat template where the target's prompts are
    rendered by one (``chat``); a tokenizer that cannot spell a probe, rendered as the target renders
    a prompt, back (each prompt is checked again when drafted for)."""
    if drafter_tokenizer is None:
        return f"the drafter '{name}' has another vocabulary and no tokenizer to translate it with"
    text = ROUND_TRIP_PROBE
    if chat and getattr(target_tokenizer, "chat_template", None):
        if not getattr(drafter_tokenizer, "chat_template", None):
            return f"the drafter '{name}' has no chat template and the target's prompts are rendered by one"
        text = target_tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    try:
        check_spelling(drafter_tokenizer, text, name)
    except ValueError as error:
        return str(error)
    return None


def relation(target_tokenizer, drafter_tokenizer) -> str:
    """How a drafter's tokenizer relates to the target's, for the drafter's header line."""
    shared = translation(target_tokenizer, drafter_tokenizer).shared
    return (f"its own tokenizer ({len(drafter_tokenizer)} tokens, the target's {len(target_tokenizer)}; {shared} spelled "
            f"identically) · translation: text (greedy) / intersection (sampling)")
