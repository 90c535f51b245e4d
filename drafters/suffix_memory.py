"""SuffixDecoding's global tree: a suffix trie over earlier outputs, explicit memory as the n-gram
storages are (off unless given; reset, saved and loaded by the user).

Files are JSON (no pickle): the outputs' token ids, from which the trie is rebuilt on load. A
save replaces a file atomically, and only a file this tool saved (unless told to overwrite); a
load checks everything before anything changes, and refuses a bad file with one line.
"""
import json
import os
from pathlib import Path
from typing import List, Optional, Sequence

from drafters.suffix_tree import SuffixTrie
from utils.files import read_regular_file, write_atomically

FORMAT = "speculative-decoding/suffix-memory"
MAX_DEPTH = 64  # the authors' default max_tree_depth, and the highest accepted here
MAX_TOKENS = 200_000  # kept; past it the older half of the outputs is forgotten (a trie holds up to tokens * depth nodes)
MAX_FILE_BYTES = 64 * 2**20
MAX_VOCAB = 2**24
_SIGNATURE = ('{"format":"%s"' % FORMAT).encode()


class SuffixMemory:
    """The outputs of earlier generations in one suffix trie of depth ``max_depth``, each its own
    sequence (no substring spans two). ``vocab_size`` (when known) is checked on load."""

    def __init__(self, max_depth: int = 24, vocab_size: Optional[int] = None, max_tokens: int = MAX_TOKENS):
        self.max_depth, self.vocab_size, self.max_tokens = max_depth, vocab_size, max_tokens
        self.trie = SuffixTrie(max_depth)
        self.outputs: List[List[int]] = []

    @property
    def tokens(self) -> int:
        return self.trie.tokens_added

    def add(self, output: Sequence[int]) -> None:
        """Remember one generation's output (not while a drafter reads the trie: ids would move on a rebuild)."""
        if not output:
            return
        self.outputs.append(list(output))
        if self.tokens + len(output) > self.max_tokens:  # forget the older half, rebuilding the trie (amortised)
            kept, total = [], 0
            for sequence in reversed(self.outputs):
                if total + len(sequence) > self.max_tokens // 2 and kept:
                    break
                kept.append(sequence[-self.max_tokens :])
                total += len(kept[-1])
            self._rebuild(list(reversed(kept)))
            return
        self.trie.start()
        self.trie.extend(output)

    def _rebuild(self, outputs: List[List[int]]) -> None:
        self.trie, self.outputs = SuffixTrie(self.max_depth), []
        for output in outputs:
            self.outputs.append(output)
            self.trie.start()
            self.trie.extend(output)

    def reset(self) -> None:
        self._rebuild([])

    def set_depth(self, max_depth: int) -> None:
        """Rebuild the trie at another depth, from the same outputs."""
        if max_depth != self.max_depth:
            self.max_depth = max_depth
            self._rebuild(self.outputs)

    def describe(self) -> str:
        return f"{len(self.outputs)} outputs, {self.tokens} tokens, {len(self.trie) - 1} nodes (depth {self.max_depth})"

    def save(self, path: str | Path, overwrite: bool = False) -> None:
        """Write the outputs as JSON, atomically; an existing file only if this tool saved it (or ``overwrite``)."""
        if os.path.lexists(path):
            real = os.path.realpath(path)
            if os.path.exists(real) and not os.path.isfile(real):
                raise ValueError(f"{path} exists and is not a regular file")
            if os.path.exists(real) and not overwrite and not _is_saved(real):
                raise ValueError(f"{path} exists and is not a suffix memory saved by this tool; it is left as it is")
        data = {"format": FORMAT, "version": 1, "max_depth": self.max_depth, "vocab_size": self.vocab_size, "outputs": self.outputs}
        write_atomically(path, json.dumps(data, separators=(",", ":")).encode())

    def load(self, path: str | Path) -> None:
        """Replace this memory by the file's (its depth too); ValueError (one line), nothing changed, for a bad file."""
        raw = read_regular_file(path, MAX_FILE_BYTES, "a suffix memory file")
        try:
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError("not a suffix memory file")
            if data.get("version") != 1:
                raise ValueError("unsupported version")
            depth, vocab, outputs = data["max_depth"], data["vocab_size"], data["outputs"]
            if not _is_int(depth) or not 1 <= depth <= MAX_DEPTH:
                raise ValueError(f"max_depth must be an integer from 1 to {MAX_DEPTH}")
            if vocab is not None and (not _is_int(vocab) or not 1 <= vocab <= MAX_VOCAB):
                raise ValueError("bad vocab_size")
            if self.vocab_size is not None and vocab is not None and vocab != self.vocab_size:
                raise ValueError(f"saved for a vocabulary of {vocab}, not {self.vocab_size}")
            limit = self.vocab_size or vocab or MAX_VOCAB
            if not isinstance(outputs, list) or not all(isinstance(o, list) and o for o in outputs):
                raise ValueError("outputs must be a list of non-empty lists of token ids")
            if sum(len(o) for o in outputs) > self.max_tokens:
                raise ValueError(f"more than the {self.max_tokens} tokens a memory keeps")
            if not all(_is_int(t) and 0 <= t < limit for o in outputs for t in o):
                raise ValueError(f"token ids must be integers from 0 to {limit - 1}")
        except RecursionError:
            raise ValueError(f"{path} is not a valid suffix memory file (nested too deeply)") from None
        except (ValueError, KeyError, TypeError) as error:
            reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
            raise ValueError(f"{path} is not a valid suffix memory file ({reason})") from None
        self.max_depth = depth
        self._rebuild(outputs)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_saved(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(len(_SIGNATURE)) == _SIGNATURE
    except OSError:
        return False
