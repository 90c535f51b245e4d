"""Argument checks and limits shared by every generation function."""
from typing import List, Sequence

from utils.parsing import check_positive_int

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
