"""The screen: the debug view (off by default; accepted drafts green, rejected drafts red, the
target's own token blue), and the reference's printing helpers. The generation loops print
nothing themselves: the debug view is an observer of theirs (see ``sampling.config.Observer``)."""
from typing import List, Sequence

from rich.console import Console
from rich.text import Text


class Screen:
    """The console the debug view and a stream of generated text share, so that the two compose:
    a block (a debug step) starts on a line of its own even where streamed text stopped mid-line."""

    def __init__(self):
        self.console = Console(highlight=False, soft_wrap=True)
        self.mid_line = False

    def inline(self, text: Text) -> None:
        """Text that continues the current line (a stream)."""
        self.console.print(text, end="")
        self.console.file.flush()
        if text.plain:
            self.mid_line = not text.plain.endswith("\n")

    def end_line(self) -> None:
        """Finish a line a stream left open."""
        if self.mid_line:
            self.console.print()
            self.mid_line = False

    def block(self, *renderables) -> None:
        """Lines of their own."""
        self.end_line()
        self.console.print(*renderables)


screen = Screen()
console = screen.console


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
    screen.block(Text("Initial step", style="white on grey23"), "1 token:")
    screen.block(Text(token_ids_to_string(token, tokenizer), style="blue"))


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
    screen.block(Text("Speculative step", style="white on grey23"), f"{n} draft{'s' if n != 1 else ''} + 1 token:")
    text = Text()
    _piece(text, context, tokenizer, "")
    _piece(text, accepted, tokenizer, "green")
    _piece(text, rejected, tokenizer, "red")
    _piece(text, [] if token is None else [token], tokenizer, "blue")
    screen.block(text)


def end_token_found(location: int) -> None:
    screen.block(Text(f"End token found at position {location}", style="red"))


_TAIL = 8  # tokens of context decoded before a piece, so that it reads as it does in the text


class DebugView:
    """Each speculative step as readable text: the text so far, then the accepted drafts (green),
    the rejected ones (red) and the target's own token (blue), each token a separate piece; the
    header says how many drafts were proposed and how many accepted. Without a tokenizer, ids."""

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer

    def pieces(self, before: Sequence[int], token_ids: Sequence[int]) -> List[str]:
        """``token_ids`` as the text each adds after ``before`` (with a tokenizer), else as ids."""
        if self.tokenizer is None:
            return [str(t) for t in token_ids]
        tail, out = list(before[-_TAIL:]), []
        for token in token_ids:
            shown = self.tokenizer.decode(tail, skip_special_tokens=False)
            tail.append(token)
            piece = self.tokenizer.decode(tail, skip_special_tokens=False)[len(shown) :]
            out.append(piece.replace("\n", "\\n"))
        return out

    def _text(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False) if self.tokenizer is not None else " ".join(map(str, token_ids))

    def on_step(self, step) -> None:
        """Show one step (a ``sampling.config.Step``)."""
        if step.speculative:
            proposed, n = step.proposed, step.accepted
            header = (f"{len(proposed)} draft{'s' if len(proposed) != 1 else ''} proposed, {n} accepted + 1 token:"
                      if proposed else "no drafts + 1 token:")
            before = step.tokens[step.prompt_length : step.start]
            text = Text(self._text(before))
            for style, ids, after in (("green", proposed[:n], before), ("red", proposed[n:], before + proposed[:n]),
                                      ("blue", [step.own], before + proposed[:n])):
                for piece in self.pieces(after, ids):
                    text.append(" ")
                    text.append(piece, style=style)
            screen.block(Text("Speculative step", style="white on grey23"), header)
            screen.block(text)
        if step.stopped:
            end_token_found(len(step.tokens) - 1 - step.prompt_length)

    def on_beams(self, beams, position: int) -> None:
        beam_search_step(beams, position, self.tokenizer)


def beam_search_step(possibilities: Sequence[tuple], current_position: int, tokenizer=None) -> None:
    """The kept beams after a step: each ``(score, tokens, ...)``, its tokens up to
    ``current_position`` (exclusive) shown with the newest one in blue."""
    screen.block(Text("Beam search step", style="white on grey23"), f"token {current_position}:")
    for i, (score, tokens, *_) in enumerate(possibilities):
        tokens = _ids(tokens)[:current_position]
        line = Text(f"{i + 1}. {float(score):.3f}\t")
        _piece(line, tokens[:-1], tokenizer, "")
        _piece(line, tokens[-1:], tokenizer, "blue")
        screen.block(line)
