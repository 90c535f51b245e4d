"""The debug view (off by default): accepted drafts green, rejected drafts red, the target's own token blue."""
from typing import Sequence

from rich.console import Console
from rich.text import Text

console = Console(highlight=False, soft_wrap=True)


def _ids(token_ids) -> list:
    """A flat list of ints from an int, a list or a tensor of any shape."""
    if hasattr(token_ids, "reshape") and hasattr(token_ids, "tolist"):
        return [int(t) for t in token_ids.reshape(-1).tolist()]
    if isinstance(token_ids, int):
        return [token_ids]
    return [int(t) for t in token_ids]


def token_ids_to_string(token_ids: Sequence[int], tokenizer=None) -> str:
    """Token ids (a list, or a tensor of any shape) as readable pieces separated by spaces (the ids
    themselves without a tokenizer)."""
    ids = _ids(token_ids)
    if tokenizer is None:
        return " ".join(str(t) for t in ids)
    return " ".join(str(piece) for piece in tokenizer.convert_ids_to_tokens(ids))


def _piece(text: Text, token_ids: Sequence[int], tokenizer, style: str) -> None:
    if len(token_ids):
        if len(text):
            text.append(" ")
        text.append(token_ids_to_string(token_ids, tokenizer), style=style)


def initial_step(token, tokenizer=None) -> None:
    """The first token, from the target alone (an int or a one-element tensor)."""
    console.print(Text("Initial step", style="white on grey23"), "1 token:")
    console.print(Text(token_ids_to_string(token, tokenizer), style="blue"))


def speculative_step(
    tokenizer,
    current_inputs,
    inputs,
    n: int,
    prompt_end: int,
    current_position: int,
    corrected_gamma: int,
) -> None:
    """One verification step, from the reference's buffers: ``current_inputs`` ``[1, L]`` holds the
    drafts at ``current_position``..``+corrected_gamma``, ``inputs`` ``[1, L]`` the text from
    ``prompt_end`` on, the ``n`` accepted drafts and the target's token after them."""
    end = current_position + corrected_gamma
    show_step(
        tokenizer,
        _ids(inputs[0, prompt_end:current_position]),
        _ids(inputs[0, current_position : current_position + n]),
        _ids(current_inputs[0, current_position + n : end]),
        _ids(inputs[0, current_position + n])[0],
    )


def show_step(
    tokenizer,
    context: Sequence[int],
    accepted: Sequence[int],
    rejected: Sequence[int],
    token: int | None,
) -> None:
    """One verification step: the text so far, then accepted, rejected and the target's token."""
    n = len(accepted)
    console.print(Text("Speculative step", style="white on grey23"), f"{n} draft{'s' if n != 1 else ''} + 1 token:")
    text = Text()
    _piece(text, context, tokenizer, "")
    _piece(text, accepted, tokenizer, "green")
    _piece(text, rejected, tokenizer, "red")
    _piece(text, [] if token is None else [token], tokenizer, "blue")
    console.print(text)


def end_token_found(location: int) -> None:
    console.print(Text(f"End token found at position {location}", style="red"))


def beam_search_step(possibilities: Sequence[tuple], current_position: int, tokenizer=None) -> None:
    """The kept beams after a step: each ``(score, tokens, ...)``, its tokens up to
    ``current_position`` (exclusive) shown with the newest one in blue."""
    console.print(Text("Beam search step", style="white on grey23"), f"token {current_position}:")
    for i, (score, tokens, *_) in enumerate(possibilities):
        tokens = _ids(tokens)[:current_position]
        line = Text(f"{i + 1}. {float(score):.3f}\t")
        _piece(line, tokens[:-1], tokenizer, "")
        _piece(line, tokens[-1:], tokenizer, "blue")
        console.print(line)
