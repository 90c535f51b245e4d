"""A small language model ``M_q`` drafting for the target (Leviathan et al. 2023; Chen et al. 2023)."""
from dataclasses import dataclass
from typing import List, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from drafters.base import UNLIMITED, Drafter
from drafters.cross_tokenizer import cross_drafter, same_vocabulary
from drafters.spec import DraftContext, DrafterSpec
from runners.limits import common_vocab_size, context_window
from runners import KVCacheModel
from utils.logits_processor import GreedyProcessor, LogitsProcessor


class ModelDrafter(Drafter):
    """A small language model ``M_q`` drafting with the target's logits processor. It owns its
    confidence cutoff ``p_min`` (llama.cpp's ``--draft-p-min``) and never stops below ``min_draft``.
    Its runner computes the output rows ``drafter_runner.drafter_head`` asks for (``drafted_rows``)."""

    cheap = False

    def __init__(
        self, model: KVCacheModel, logits_processor: LogitsProcessor, vocab_size: int, window: int | None,
        p_min: float = 0.0, min_draft: int = 0,
    ):
        self.model = model
        self.memory_key = ("model", id(model.model))
        self.p_min, self.min_draft = p_min, min_draft
        self.logits_processor = logits_processor
        self.vocab_size = vocab_size
        self.window = window

    @classmethod
    def of(cls, model: Module, config, encoder_input_ids: List[int] | None = None) -> "ModelDrafter":
        """A drafter for ``model`` under ``config`` (a ``sampling.GenerationConfig``, read, not
        imported: the loops sit above the drafters): its processor, runner, shared vocabulary, and
        the policy's confidence cutoff and floor."""
        runner = config.make_runner(model, encoder_input_ids, drafter=True)
        policy = config.policy
        drafted_rows(runner, config.drafter_runner.drafter_head)
        return cls(runner, config.processor, config.vocab_size, context_window(model), policy.p_min, policy.min_draft)

    def max_drafts(self, position: int) -> int:
        return self.window - position + 1 if self.window is not None else UNLIMITED

    def propose(self, ids: Tensor, tokens: List[int], k: int) -> Tuple[int, Tensor | None]:
        cur = len(tokens)
        k = min(k, self.max_drafts(cur))
        if k < self.min_draft:  # known before any draft is drawn: nothing is dropped after sampling
            return 0, None
        if self.draws_only:
            return self._greedy(ids, cur, k), None
        qs = []
        for i in range(k):
            q = self.logits_processor(self.model(ids[:, : cur + i], 1)[:, : self.vocab_size])
            # not confident: stop here, decided before this draft is drawn (never below min_draft)
            if self.p_min > 0 and i >= self.min_draft and float(q.max()) < self.p_min:
                break
            ids[0, cur + i] = self.logits_processor.sample(q)[0, 0]
            qs.append(q)
        return len(qs), torch.cat(qs) if qs else None

    @property
    def draws_only(self) -> bool:
        """Whether no draft's probabilities are needed: greedy (the loop compares tokens) with no confidence cutoff."""
        return type(self.logits_processor) is GreedyProcessor and not self.p_min

    def _greedy(self, ids: Tensor, cur: int, k: int) -> int:
        """``k`` greedy drafts written into ``ids`` from position ``cur``, each the argmax of the drafter's
        logits (``GreedyProcessor.choose``: the token ``sample(softmax)`` gives, without the softmax over the
        vocabulary a draft does not need); returns ``k``."""
        for i in range(k):
            ids[0, cur + i] = self.logits_processor.choose(self.model(ids[:, : cur + i], 1)[:, : self.vocab_size])[0, 0]
        return k

    def accept(self, tokens: List[int], start: int, n_accepted: int, fetched: None) -> None:
        self.model.rollback(start + n_accepted)


def drafted_rows(runner, count: int) -> int | None:
    """Ask ``runner`` (a drafter's) to compute only ``count`` rows of its output layer, the most frequent ids,
    and those of every token it is fed (``runners.lean.LeanRunner.output_rows``; FR-Spec, arXiv 2502.14856).
    The drafts are drawn from what it computes, and the loop is told that distribution (zero past the rows),
    so greedy stays exact and sampling lossless. Returns the rows before any token, or None: every row (0
    asked, or a runner that computes them all)."""
    ask = getattr(runner, "output_rows", None) if count else None
    return ask(count) if ask is not None else None


def drafted_rows_words(model: Module, runner_config, count: int) -> str:
    """The header's words for a drafter ``model`` asked for ``count`` rows under ``runner_config`` (a
    ``runners.RunnerConfig``): "drafter head: 32,768 of 151,936 tokens (...)" where its passes will compute
    them (the lean forward on the C step), else ""."""
    from kernels.c_step import step_unsupported
    from kernels.head_rows import rows_words

    vocab = model.get_output_embeddings().out_features
    if not 0 < count < vocab or not runner_config.lean_for(model) or runner_config.step_for(model) or step_unsupported(model):
        return ""
    return rows_words(count, vocab)


@dataclass(frozen=True)
class ModelSpec(DrafterSpec):
    """Speculative decoding with the drafter model ``DraftContext.drafter`` (Leviathan et al. 2023;
    Chen et al. 2023): it drafts the generation's ``gamma`` tokens a step with the target's processor,
    verified by rejection sampling (greedy: token comparison). Decoder-only or encoder-decoder pairs
    sharing one vocabulary (``DraftContext.tokenizer`` lets output layers differ by padding rows); with
    ``DraftContext.drafter_tokenizer`` of another vocabulary, it drafts across tokenizers
    (``drafters.cross_tokenizer``; decoder-only; ``drafter_prompt`` renders its prompt)."""

    def crosses(self, context: DraftContext) -> bool:
        """Whether the drafter drafts in a vocabulary of its own."""
        return context.drafter_tokenizer is not None and not same_vocabulary(context.tokenizer, context.drafter_tokenizer)

    def prepare(self, target: Module, context: DraftContext) -> dict:
        drafter = context.need("drafter", "speculative decoding")
        if not self.crosses(context):
            return {**super().prepare(target, context), "vocab_size": common_vocab_size(drafter, target, context.tokenizer)}
        if getattr(target.config, "is_encoder_decoder", False):
            raise ValueError("a drafter with its own tokenizer drafts for decoder-only models only")
        return super().prepare(target, context)

    def make(self, prompt: List[int], target: Module, config, context: DraftContext) -> Drafter:
        if not self.crosses(context):
            return ModelDrafter.of(context.drafter, config, encoder_input_ids=context.encoder_input_ids)
        own = context.drafter_prompt(prompt) if context.drafter_prompt is not None else None
        return cross_drafter(context.drafter, config, prompt, target, context.tokenizer, context.drafter_tokenizer, own)
