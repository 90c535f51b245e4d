"""The one entry every drafting strategy's public function is a thin wrapper over: check the prompt
and the settings, make the drafter, run the chain or the tree loop, tell the drafter it is done."""
from typing import Any, Callable, List, Mapping, Tuple

import torch
from torch.nn import Module

from drafters.base import Drafter, as_drafter
from sampling.common import check_prompt, generation_end
from runners.limits import context_window
from sampling.config import GenerationConfig
from sampling.speculative_decoding import draft_and_verify
from sampling.tree_decoding import draft_tree_and_verify
from runners import tree_unsupported

MakeDrafter = Callable[[List[int], GenerationConfig], Drafter]


@torch.no_grad()
def generate(inputs, target: Module, drafter: Drafter | MakeDrafter, arguments: Mapping[str, Any] = (), trees: bool = False,
             loop: Callable | None = None, **fields) -> Tuple[List[int], float]:
    """Speculative decoding of ``inputs`` on ``target`` with ``drafter``; returns (new token ids,
    acceptance rate), as the reference's public functions do.

    ``drafter``: a ``Drafter``, or ``make(prompt, config)`` returning one, called once the prompt
    and the room to generate are checked (so that a storage learns no prompt that is refused).
    ``arguments``: the public function's arguments by the reference's names (its ``locals()``,
    ``GenerationConfig.of``); ``fields`` set configuration fields directly (``gamma``,
    ``vocab_size``). ``trees``: the tree loop (``draft_tree_and_verify``), refused here, in one
    line, for a target without full attention; else the chain loop (``draft_and_verify``). Both
    keep greedy exact and sampling lossless. ``loop``: another loop with their signature (a
    test's). The drafter's ``finish`` hears the output (None on failure).
    """
    prompt = check_prompt(inputs)
    config = GenerationConfig.of(dict(arguments), **fields)
    if trees:
        reason = tree_unsupported(target)
        if reason is not None:
            raise ValueError(reason)
    generation_end(len(prompt), config.max_gen_len, context_window(target))  # no room: refused before the drafter learns
    made = as_drafter(drafter if isinstance(drafter, Drafter) or not callable(drafter) else drafter(prompt, config))
    if trees and not made.supports_trees:
        raise ValueError(f"{type(made).__name__} does not draft trees")
    output = None
    try:
        loop = loop or (draft_tree_and_verify if trees else draft_and_verify)
        output = loop(prompt, config.make_runner(target), made, config)
    finally:
        made.finish(output)
    return output, config.stats.acceptance_rate
