"""Argument checks and limits shared by every generation function."""
from typing import List, Sequence

from torch.nn import Module

_WINDOW_ATTRIBUTES = ("max_position_embeddings", "n_positions", "max_context_length", "max_sequence_length")


def context_window(model: Module) -> int | None:
    """Largest number of positions the model accepts, or None when its config sets no limit (e.g. T5)."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    for name in _WINDOW_ATTRIBUTES:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def output_vocab_size(model: Module) -> int:
    """Number of rows of the model's output layer (its logits' last dimension)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(getattr(head, "out_features", None), int):  # read before .weight, which a quantized layer rebuilds
        return head.out_features
    if head is not None and getattr(head, "weight", None) is not None:
        return head.weight.shape[0]
    return model.config.get_text_config(decoder=True).vocab_size


def common_vocab_size(drafter: Module, target: Module, tokenizer=None) -> int:
    """Vocabulary size that drafter and target share.

    Equal output sizes are used as they are. Sizes that differ only by padding rows of the
    output layer (both at least the tokenizer's length) are cut to the smaller one; any
    other difference is refused, because the two models would not be speaking of the same tokens.
    """
    drafter_size, target_size = output_vocab_size(drafter), output_vocab_size(target)
    if drafter_size == target_size:
        return target_size
    if tokenizer is not None and min(drafter_size, target_size) >= len(tokenizer):
        return min(drafter_size, target_size)
    hint = "" if tokenizer is not None else " (pass tokenizer= to use the common part when they differ only by padding)"
    raise ValueError(
        f"drafter and target vocabularies differ: {drafter_size} vs {target_size} output rows{hint}"
    )


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def check_prompt(inputs: Sequence[int]) -> List[int]:
    """The prompt as a list of ints; refuses an empty or non-integer prompt."""
    try:
        tokens = [int(t) for t in inputs]
    except (TypeError, ValueError):
        raise ValueError("inputs must be a flat list of token ids") from None
    if not tokens:
        raise ValueError("the prompt is empty: give at least one token id")
    if min(tokens) < 0:
        raise ValueError("token ids must be >= 0")
    return tokens


def stop_token_set(eos_tokens_id: int | List[int] | None) -> frozenset:
    if eos_tokens_id is None:
        return frozenset()
    if isinstance(eos_tokens_id, int):
        return frozenset([eos_tokens_id])
    return frozenset(int(t) for t in eos_tokens_id)


def generation_end(prompt_len: int, max_gen_len: int, *windows: int | None) -> int:
    """Sequence length at which generation stops: the prompt plus ``max_gen_len``, within every window."""
    end = prompt_len + check_positive_int("max_gen_len", max_gen_len)
    for window in windows:
        if window is None:
            continue
        if prompt_len >= window:
            raise ValueError(
                f"the prompt has {prompt_len} tokens and the model's context window is {window}: "
                "no room left to generate; shorten the prompt"
            )
        end = min(end, window)
    return end


def max_fn(x):
    """``norm(max(0, x))`` over the last dimension (the reference's helper for the residual
    distribution ``norm(max(0, p - q))`` of a rejected draft). A row with no positive entry has no
    such distribution and comes out as NaN, as in the reference."""
    import torch

    x_max = torch.where(x > 0, x, torch.zeros_like(x))
    return x_max / torch.sum(x_max, dim=-1, keepdim=True)


def reference_keywords(function):
    """Also accept ``end_tokens_id=`` for ``eos_tokens_id=``: the reference's README calls its
    generation functions with that spelling, which its own code refuses."""
    import functools

    @functools.wraps(function)
    def call(*args, **kwargs):
        if "end_tokens_id" in kwargs:
            if "eos_tokens_id" in kwargs:
                raise TypeError(f"{function.__name__}() got both eos_tokens_id and end_tokens_id (the same argument)")
            kwargs["eos_tokens_id"] = kwargs.pop("end_tokens_id")
        return function(*args, **kwargs)

    return call
