"""Speculative decoding with a drafter model (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023,
arXiv:2302.01318): the reference's ``speculative_generate``, a thin wrapper over the one entry
(``sampling.generate`` with ``drafters.ModelSpec``). The loop is ``sampling.chain_decoding``'s
(``draft_and_verify``, importable from here as in the reference's layout)."""
from typing import Callable, List, Tuple

import torch
from torch.nn import Module

from drafters.model import ModelDrafter  # noqa: F401 (importable from here, as before)
from drafters.model import ModelSpec
from drafters.spec import DraftContext
from runners.config import RunnerConfig
from sampling.chain_decoding import draft_and_verify, speculative  # noqa: F401 (importable from here, as before)
from sampling.common import max_fn, reference_keywords  # noqa: F401 (max_fn: the reference's public helper, importable from here)
from sampling.draft_policy import DraftPolicy
from sampling.entry import generate
from sampling.stats import GenerationStats
from utils.logits_processor import GreedyProcessor, LogitsProcessor


@reference_keywords
@torch.no_grad()
def speculative_generate(
    inputs: List[int], drafter: Module, target: Module, tokenizer=None, gamma: int = 5,
    logits_processor: LogitsProcessor = GreedyProcessor(), max_gen_len: int = 40, eos_tokens_id: int | List[int] = 1,
    pad_token_id: int = 0, use_cache: bool = False, skip_sample_adjustment: bool = False, first_target: bool = True,
    debug: bool = False, stats: GenerationStats | None = None, policy: DraftPolicy | None = None,
    streamer: Callable[[List[int], int], None] | None = None, compile: bool | None = None,
    runner: RunnerConfig | None = None, drafter_runner: RunnerConfig | None = None,
    drafter_tokenizer=None, drafter_inputs: List[int] | None = None,
) -> Tuple[List[int], float]:
    """Speculative decoding with a drafter model (Leviathan et al. 2023; Chen et al. 2023), for
    decoder-only models and for encoder-decoder models sharing one decoder vocabulary (both
    encoders read ``inputs`` once; the decoders generate, without the decoder start token).

    ``drafter`` (M_q) proposes ``gamma`` tokens autoregressively; ``target`` (M_p) verifies them in
    one forward pass. Acceptance rule (see ``draft_and_verify``): greedy compares tokens, so the
    output equals greedy ``autoregressive_generate`` on the target exactly; sampling accepts
    ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))`` and resamples a rejection from
    ``norm(max(0, p_i - q_i))``, so the output follows the target's distribution.
    ``skip_sample_adjustment=True`` resamples from ``p_i`` instead: faster to reason about, lossy.

    Args:
        inputs: prompt token ids (batch size 1). tokenizer: for the debug view, and to allow
            vocabularies that differ only by padding rows. gamma: most drafts per step (>= 1).
        max_gen_len: most new tokens. eos_tokens_id: one id or a list; generation stops after the
            first. pad_token_id: kept for compatibility (nothing is padded). use_cache: KV caches on,
            fed only new tokens and rolled back after a rejection. first_target: start with one
            plain target step. debug: show each step (accepted drafts green, rejected red, the
            target's token blue). stats: a ``GenerationStats`` to fill. policy: a ``DraftPolicy``
            (adaptive length, minimum draft, pauses, ``p_min`` confidence cutoff).
            streamer: called with each step's emitted tokens and how many were drafts.
            runner, drafter_runner: how the target's and the drafter's passes run (``RunnerConfig``:
            cache kind, compiled; the drafter's defaults to the target's; None: eager, the device's
            cache). compile: True/False overrides both configurations' ``compile``; needs ``use_cache``.
            drafter_tokenizer: the drafter's own tokenizer; when its vocabulary is not ``tokenizer``'s
            (which must then be given), the drafter drafts across tokenizers
            (``drafters.cross_tokenizer``: text translation when greedy, the shared tokens when
            sampling; decoder-only). drafter_inputs: the prompt as the drafter reads it (its own
            chat template's rendering; None: the prompt's text in the drafter's tokens).

    Returns:
        (new token ids, acceptance rate = accepted drafts / drafted tokens).
    """
    context = DraftContext(tokenizer=tokenizer, drafter=drafter, drafter_tokenizer=drafter_tokenizer,
                           drafter_prompt=None if drafter_inputs is None else lambda prompt: list(drafter_inputs))
    return generate(inputs, target, ModelSpec(), locals(), context)


speculative_generate_encoder_decoder = speculative_generate  # the reference's name for encoder-decoder models
