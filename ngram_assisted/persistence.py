"""Persistent n-gram storages (llama.cpp's static and dynamic tiers): build from a corpus, save,
load, merge, and look up the generation's own storage before a static one.

Files are JSON data (no pickle): a corrupt, foreign or hostile file is refused with a ValueError
of one line. Only regular files are read, and only up to a size cap; a declared n or vocabulary
is checked before anything is allocated; a save replaces a file atomically, and only a file this
tool saved (unless told to overwrite).
"""
import json
import os
import stat
from pathlib import Path
from typing import Dict, Iterable, Sequence, Tuple

from utils.files import read_regular_file, write_atomically  # noqa: F401 (importable from here, as before)
from ngram_assisted.ngram_storage import CountingNGramStorage, INgramStorage, NGramStorage, OneLevelNGramStorage, _Counts

FORMAT = "speculative-decoding/ngram-storage"
KINDS = {"basic": NGramStorage, "onelevel": OneLevelNGramStorage}
MAX_STORAGE_BYTES = 256 * 2**20  # a storage file; its JSON takes several times this in memory
MAX_CORPUS_BYTES = 64 * 2**20  # a corpus for build_storage
MAX_N = 32  # as the REPL's /set_ngramstorage accepts
MAX_VOCAB = 2**24
MAX_COUNT = 2**63 - 1
_SIGNATURE = ('{"format":"%s"' % FORMAT).encode()  # how every file save_storage writes begins


def is_saved_storage(path: str | Path) -> bool:
    """Whether ``path`` is a regular file that begins as every file ``save_storage`` writes."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError):
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(_SIGNATURE)) == _SIGNATURE
    except OSError:
        return False
    finally:
        os.close(fd)


def storage_kind(storage: INgramStorage) -> str:
    for name, cls in KINDS.items():
        if type(storage) is cls:
            return name
    raise ValueError(f"cannot save a {type(storage).__name__}")


def _tables(storage: INgramStorage) -> Dict[int, dict]:
    return {j: storage.table(j) for j in range(1, storage.n)} if isinstance(storage, NGramStorage) else {storage.n - 1: storage.grams}


def save_storage(storage: INgramStorage, path: str | Path, overwrite: bool = False) -> None:
    """Write ``storage`` to ``path`` as JSON: every context with its best token and its counts.

    An existing ``path`` is replaced only when it is a storage saved here, or with ``overwrite``;
    never when it is not a regular file. The write is atomic (``write_atomically``)."""
    if os.path.lexists(path):
        real = os.path.realpath(path)
        if os.path.exists(real) and not os.path.isfile(real):
            raise ValueError(f"{path} exists and is not a regular file")
        if os.path.exists(real) and not overwrite and not is_saved_storage(real):
            raise ValueError(f"{path} exists and is not an n-gram storage saved by this tool; it is left as it is")
    tables = {
        str(j): [[list(gram), entry.best, list(entry.counts), list(entry.counts.values())] for gram, entry in table.items()]
        for j, table in _tables(storage).items()
    }
    data = {"format": FORMAT, "version": 1, "kind": storage_kind(storage), "n": storage.n, "vocab_size": storage.vocab_size, "tables": tables}
    write_atomically(path, json.dumps(data, separators=(",", ":")).encode())


def _int(value, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value >= high):
        shown = repr(value)
        raise ValueError(f"bad value {shown if len(shown) <= 40 else shown[:37] + '...'}")
    return value


def load_storage(path: str | Path) -> INgramStorage:
    """Read a file written by ``save_storage``; ValueError (one line) for anything else."""
    raw = read_regular_file(path, MAX_STORAGE_BYTES, "a storage file")
    try:
        data = json.loads(raw.decode("utf-8"))
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("not an n-gram storage file")
        if data.get("version") != 1 or data.get("kind") not in KINDS:
            raise ValueError("unsupported version or kind")
        n, vocab = _int(data["n"], 2, MAX_N + 1), _int(data["vocab_size"], 1, MAX_VOCAB + 1)
        storage = KINDS[data["kind"]](n, vocab)
        tables = _tables(storage)
        for key, rows in data["tables"].items():
            j = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 3 else -1
            if j not in tables or not isinstance(rows, list):
                raise ValueError(f"unexpected context length {str(key)[:20]!r}")
            for gram, best, tokens, counts in rows:
                if len(gram) != j or len(tokens) != len(counts) or not tokens:
                    raise ValueError("malformed entry")
                entry = _Counts(_int(best, 0, vocab))
                entry.counts = {_int(t, 0, vocab): _int(c, 1, MAX_COUNT) for t, c in zip(tokens, counts)}
                if best not in entry.counts:
                    raise ValueError("best token without a count")
                tables[j][tuple(_int(t, 0, vocab) for t in gram)] = entry
        return storage
    except RecursionError:
        raise ValueError(f"{path} is not a valid n-gram storage file (nested too deeply)") from None
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise ValueError(f"{path} is not a valid n-gram storage file ({reason})") from None


def merge_storages(into: INgramStorage, other: INgramStorage) -> INgramStorage:
    """Add the counts of ``other`` to ``into`` (same kind and n); returns ``into``."""
    if type(into) is not type(other) or into.n != other.n:
        raise ValueError(f"cannot merge a {storage_kind(other)} n={other.n} storage into a {storage_kind(into)} n={into.n} one")
    mine = _tables(into)
    for j, table in _tables(other).items():
        for gram, entry in table.items():
            target = mine[j].get(gram)
            if target is None:
                target = mine[j][gram] = _Counts(entry.best)
            for token, count in entry.counts.items():
                target.add(token, count)
    return into


def build_storage(corpus: str | Path, tokenizer, n: int = 3, kind: str = "basic", vocab_size: int | None = None) -> INgramStorage:
    """Count the k-grams of a text file, tokenized line block by line block with ``tokenizer``."""
    if kind not in KINDS:
        raise ValueError(f"unknown storage kind {kind!r}: basic or onelevel")
    try:
        text = read_regular_file(corpus, MAX_CORPUS_BYTES, "a corpus").decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"cannot read the corpus {corpus}: not UTF-8 text (byte {error.start})") from None
    except ValueError as error:
        raise ValueError(f"{str(error).replace('cannot read', 'cannot read the corpus', 1)}") from None
    storage = KINDS[kind](n, vocab_size or len(tokenizer))
    for block in text.split("\n\n"):
        if block.strip():
            storage.add_sequence(tokenizer(block, add_special_tokens=False).input_ids)
    return storage


class TieredStorage(CountingNGramStorage):
    """The generation's own storage first, a static one (e.g. built from a corpus) as fallback.

    Learning and ``reset`` touch only the first; the static tier is read-only here.
    """

    def __init__(self, primary: CountingNGramStorage, fallback: CountingNGramStorage):
        super().__init__(max(primary.n, fallback.n), primary.vocab_size)
        self.primary, self.fallback = primary, fallback

    def context_lengths(self, available: int) -> range:
        return self.primary.context_lengths(available)

    def table(self, length: int):
        return self.primary.table(length)

    def predict(self, tokens: Sequence[int]) -> int | None:
        token = self.primary.predict(tokens)
        return token if token is not None else self.fallback.predict(tokens)

    def predict_matched(self, tokens: Sequence[int]) -> Tuple[int | None, int]:
        found = self.primary.predict_matched(tokens)
        return found if found[0] is not None else self.fallback.predict_matched(tokens)

    def add(self, context: Sequence[int], tokens: Iterable[int]) -> None:
        self.primary.add(context, tokens)

    def add_sequence(self, tokens: Sequence[int]) -> None:
        self.primary.add_sequence(tokens)

    def count(self, context: Sequence[int], token: int) -> int:
        return self.primary.count(context, token) or self.fallback.count(context, token)

    def continuations(self, tokens: Sequence[int]) -> dict:
        return self.primary.continuations(tokens) or self.fallback.continuations(tokens)

    def reset(self) -> None:
        self.primary.reset()


def replay(storage: INgramStorage, tokens: Sequence[int], learn: bool = True) -> Tuple[int, int, int]:
    """Walk ``tokens`` through ``storage`` as a drafter would: returns (positions, predicted, correct).

    ``learn`` counts each token after predicting it (the dynamic tier); off, the storage is static.
    """
    predicted = correct = 0
    width = storage.n - 1
    for i in range(1, len(tokens)):
        context = tokens[max(0, i - width) : i]
        guess = storage.predict(context)
        if guess is not None:
            predicted += 1
            correct += guess == tokens[i]
        if learn:
            storage.add(context, (tokens[i],))
    return len(tokens) - 1, predicted, correct
