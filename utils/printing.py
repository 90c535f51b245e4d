"""The debug view (off by default): accepted drafts green, rejected drafts red, the target's own token blue."""
from typing import Sequence

from rich.console import Console
from rich.text import Text

console = Console(highlight=False, soft_wrap=True)


def token_ids_to_string(token_ids: Sequence[int], tokenizer=None) -> str:
    """Token ids as readable pieces separated by spaces (the ids themselves without a tokenizer)."""
    ids = [int(t) for t in token_ids]
    if tokenizer is None:
        return " ".join(str(t) for t in ids)
    return " ".join(str(piece) for piece in tokenizer.convert_ids_to_tokens(ids))


def _piece(text: Text, token_ids: Sequence[int], tokenizer, style: str) -> None:
    if len(token_ids):
        if len(text):
            text.append(" ")
        text.append(token_ids_to_string(token_ids, tokenizer), style=style)


def initial_step(token: int, tokenizer=None) -> None:
    console.print(Text("Initial step", style="white on grey23"), "1 token:")
    console.print(Text(token_ids_to_string([token], tokenizer), style="blue"))


def speculative_step(
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


def beam_search_step(beams: Sequence[tuple[float, Sequence[int]]], step: int, tokenizer=None) -> None:
    console.print(Text("Beam search step", style="white on grey23"), f"token {step}:")
    for i, (score, tokens) in enumerate(beams):
        line = Text(f"{i + 1}. {score:.3f}\t")
        _piece(line, tokens[:-1], tokenizer, "")
        _piece(line, tokens[-1:], tokenizer, "blue")
        console.print(line)
