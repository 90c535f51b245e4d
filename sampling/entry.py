"""The one generation entry every drafting strategy runs through: check the prompt and the
configuration, make the drafter (from its spec and the live objects of a ``DraftContext``), run the
chain or the tree loop, tell the drafter it is done. The reference's public functions
(``speculative_generate``, ``ngram_assisted_speculative_generate``) are thin wrappers over it."""
from dataclasses import replace
from typing import Any, Callable, List, Mapping, Tuple

import torch
from torch.nn import Module

from drafters.base import Drafter, as_drafter
from drafters.spec import DraftContext, DrafterSpec
from runners import Runner, tree_unsupported
from runners.limits import context_window
from sampling.common import check_prompt, generation_end
from sampling.config import GenerationConfig
from sampling.encoder_decoder import decoder_inputs
from sampling.chain_decoding import draft_and_verify
from sampling.tree_decoding import draft_tree_and_verify

MakeDrafter = Callable[[List[int], GenerationConfig], Drafter]


@torch.no_grad()
def generate(inputs, target: Module | Runner, drafter: DrafterSpec | Drafter | MakeDrafter,
             config: GenerationConfig | Mapping[str, Any] | None = None, context: DraftContext | None = None,
             loop: Callable | None = None) -> Tuple[List[int], float]:
    """Speculative decoding of ``inputs`` (token ids) on ``target`` with ``drafter``; returns (new
    token ids, acceptance rate), as the reference's public functions do.

    ``target``: a model (an encoder-decoder one's encoder reads the prompt, its decoder generates
    from its start token), or a runner made for it (``GenerationConfig.make_runner``; decoder-only).
    ``drafter``: a spec (``drafters.PromptLookupSpec(num_pred_tokens=10)``, ...), whose live objects
    (an n-gram storage, a suffix memory, a drafter model, a head) come from ``context``; or a
    ``Drafter``; or ``make(prompt, config)`` returning one. A spec sets its configuration fields
    (``DrafterSpec.prepare``: its draft budget, the tree loop, a shared vocabulary); the drafter is
    made once the prompt and the room to generate are checked (so that a storage learns no prompt that
    is refused). ``config``: a ``GenerationConfig``, or the arguments of a public function by the
    reference's names (``GenerationConfig.of``: ``max_gen_len``, ``eos_tokens_id``, ``use_cache``,
    ``gamma``, ``trees``, ``policy``, ``stats``, ``streamer``, ...). ``trees``: the tree loop
    (``draft_tree_and_verify``), refused here, in one line, where the runner that verifies cannot take them (transformers'
        forward on a target without full attention; the lean forward takes sliding windows); else
    the chain loop (``draft_and_verify``). Both keep greedy exact and sampling lossless. ``loop``:
    another loop with their signature (a test's). The drafter's ``finish`` hears the output (None on
    failure)."""
    prompt = check_prompt(inputs)
    config = config if isinstance(config, GenerationConfig) else GenerationConfig.of(dict(config or {}))
    context = context if context is not None else DraftContext()
    model = target.model if isinstance(target, Runner) else target
    encoder_ids = None
    if not isinstance(target, Runner):
        prompt, encoder_ids = decoder_inputs(prompt, model, context.drafter)
        if encoder_ids is not None:
            context = replace(context, encoder_input_ids=encoder_ids)
    if isinstance(drafter, DrafterSpec):
        config = replace(config, **drafter.prepare(model, context))
    runner = target if isinstance(target, Runner) else None
    if config.trees:  # the runner that will verify says (the lean forward takes sliding windows into its trees)
        runner = runner or config.make_runner(model, encoder_ids)
        refusal = getattr(runner, "_tree_refusal", None)
        reason = refusal() if callable(refusal) else tree_unsupported(model)
        if reason is not None:
            raise ValueError(reason)
    generation_end(len(prompt), config.max_gen_len, context_window(model))  # no room: refused before the drafter learns
    made = as_drafter(_make(drafter, prompt, model, config, context))
    if config.trees and not made.supports_trees:
        raise ValueError(f"{type(made).__name__} does not draft trees")
    runner = runner or config.make_runner(model, encoder_ids)
    output = None
    try:
        loop = loop or (draft_tree_and_verify if config.trees else draft_and_verify)
        output = loop(prompt, runner, made, config)
    finally:
        made.finish(output)
    return output, config.stats.acceptance_rate


def _make(drafter, prompt: List[int], model: Module, config: GenerationConfig, context: DraftContext):
    """The generation's drafter: a spec's ``make``, a maker's call, or the drafter itself."""
    if isinstance(drafter, DrafterSpec):
        return drafter.make(prompt, model, config, context)
    return drafter if isinstance(drafter, Drafter) or not callable(drafter) else drafter(prompt, config)
