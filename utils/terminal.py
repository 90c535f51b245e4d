"""Reading one line of input, from a terminal or a pipe, without the limits of either.

A terminal in canonical mode keeps at most 4095 characters of a line and drops the rest, so a
long pasted prompt would reach the model cut. On a terminal, ``read_line`` switches canonical
mode and echo off while it reads and edits the line itself (Backspace, Ctrl-U, Ctrl-W, Ctrl-D on
an empty line for end of input, Ctrl-C as usual); with bracketed paste, the newlines of a paste
stay in the prompt instead of sending its lines one by one. Bytes that are not UTF-8 become
U+FFFD and are counted. A line longer than ``MAX_LINE`` characters is cut there and said so.
"""
import codecs
import os
import signal
import sys
import threading
from dataclasses import dataclass

from utils.parsing import MAX_LINE, sanitize_text


PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"


@dataclass
class Line:
    text: str
    replaced: int = 0  # bytes that were not UTF-8
    cut: int = 0  # characters dropped beyond MAX_LINE


def _on_terminal(stdin) -> bool:
    try:
        return stdin.isatty()
    except (ValueError, OSError):
        return False


def ctrl_c_interrupts(stdin=None) -> None:
    """On a terminal, make Ctrl-C raise ``KeyboardInterrupt`` even where this process was started with
    SIGINT ignored (a script's background job, a test runner started with ``&``: such a child inherits
    the ignored signal, and Python then installs no handler). A user at the terminal who presses
    Ctrl-C means it. Off a terminal, or off the main thread, nothing changes."""
    if not _on_terminal(stdin or sys.stdin) or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def read_line(prompt: str = "> ", stdin=None, stdout=None, limit: int = MAX_LINE) -> Line | None:
    """One line without its end; None at the end of input."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    interactive = _on_terminal(stdin)
    if interactive:
        try:
            import termios  # noqa: F401
        except ImportError:
            interactive = False
    if interactive:
        return _read_terminal(prompt, stdin.fileno(), stdout, limit)
    return _read_pipe(stdin, limit)


def _read_pipe(stdin, limit: int) -> Line | None:
    buffer = getattr(stdin, "buffer", None)
    if buffer is None:  # a text stream (tests): nothing to decode
        text = stdin.readline(limit + 1)
        data = None
    else:
        data = buffer.readline(4 * limit + 1)  # UTF-8: at most 4 bytes a character
        if not data:
            return None
        text = data.decode("utf-8", "surrogateescape")
    if not text and data is None:
        return None
    cut = 0
    complete = text.endswith("\n")
    if not complete:  # longer than the limit, or the last line without its newline
        rest = _drain_line(buffer or stdin)
        cut = rest
    text = text.rstrip("\n").removesuffix("\r")
    if len(text) > limit:
        cut += len(text) - limit
        text = text[:limit]
    text, replaced = sanitize_text(text)
    return Line(text, replaced, cut)


def _drain_line(stream) -> int:
    """Read and drop the rest of the current line; returns how much was dropped."""
    dropped = 0
    while True:
        chunk = stream.readline(1 << 16)
        if not chunk:
            return dropped
        ends = chunk.endswith(b"\n" if isinstance(chunk, bytes) else "\n")
        dropped += len(chunk) - ends
        if ends:
            return dropped


def _read_terminal(prompt: str, fd: int, stdout, limit: int) -> Line | None:
    import termios

    old = termios.tcgetattr(fd)
    new = termios.tcgetattr(fd)
    new[3] &= ~(termios.ICANON | termios.ECHO)  # ISIG stays: Ctrl-C interrupts as before
    new[6][termios.VMIN], new[6][termios.VTIME] = 1, 0
    termios.tcsetattr(fd, termios.TCSANOW, new)  # TCSANOW: keep what was typed ahead
    write = _writer(stdout)
    try:
        write(prompt + "\x1b[?2004h")  # the prompt only once the terminal is ready for a long paste
        return _edit(fd, write, limit)
    finally:
        write("\x1b[?2004l")
        termios.tcsetattr(fd, termios.TCSANOW, old)


def _writer(stdout):
    def write(text: str) -> None:
        stdout.write(_printable(text))  # what was not UTF-8 shows as U+FFFD, as it reaches the model
        stdout.flush()

    return write


def _edit(fd: int, write, limit: int) -> Line | None:
    decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
    chars: list = []
    cut = 0
    pending = ""  # an escape sequence being read
    in_paste = last_cr = False
    while True:
        data = os.read(fd, 1 << 16)
        if not data:
            return None if not chars else _finish(chars, cut, write)
        echo = []
        for c in decoder.decode(data):
            if pending or c == "\x1b":
                pending += c
                if pending == PASTE_START:
                    in_paste, pending = True, ""
                elif pending == PASTE_END:
                    in_paste, pending = False, ""
                elif len(pending) > 1 and (pending[1] not in "[O" or (len(pending) > 2 and "@" <= c <= "~")):
                    pending = ""  # another key (arrows, function keys): ignored
                elif len(pending) > 16:
                    pending = ""
                continue
            after_cr, last_cr = last_cr, c == "\r"
            if c in "\r\n":
                if in_paste:
                    if c == "\n" and after_cr:
                        continue  # \r\n in a paste is one newline
                    c = "\n"
                else:
                    write("".join(echo) + "\r\n")
                    return _finish(chars, cut, lambda text: None)
            elif c in "\x7f\x08":  # Backspace
                if chars:
                    chars.pop()
                    echo.append("\b \b")
                continue
            elif c == "\x15":  # Ctrl-U: the whole line
                echo.append("\b \b" * min(len(chars), 200) if chars else "")
                chars.clear()
                continue
            elif c == "\x17":  # Ctrl-W: the last word
                while chars and chars[-1].isspace():
                    chars.pop()
                    echo.append("\b \b")
                while chars and not chars[-1].isspace():
                    chars.pop()
                    echo.append("\b \b")
                continue
            elif c == "\x04":  # Ctrl-D
                if not chars:
                    write("".join(echo) + "\r\n")
                    return None
                continue
            elif c < " " and c != "\t" or c == "\x7f":
                continue  # other control keys
            if len(chars) >= limit:
                cut += 1
                continue
            chars.append(c)
            echo.append("\r\n" if c == "\n" else c)
        if echo:
            write("".join(echo))


def _printable(text: str) -> str:
    return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)


def _finish(chars: list, cut: int, write) -> Line:
    text, replaced = sanitize_text("".join(chars))
    return Line(text, replaced, cut)
