"""Reading and writing the files this tool keeps (n-gram storages, suffix memories): bounded reads
of regular files only, and atomic replacement on write. Used by ``ngram_assisted.persistence`` and
``drafters.suffix_memory``; imports nothing of this project."""
import os
import stat
import tempfile
from pathlib import Path


def read_regular_file(path: str | Path, limit: int, what: str = "file") -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes; ValueError (one line)
    otherwise. A FIFO, a device or a folder is refused without reading it (no hang)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    except ValueError as error:  # a NUL byte in the name
        raise ValueError(f"cannot read {path}: {error}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"cannot read {path}: not a regular file")
        if info.st_size > limit:
            raise ValueError(f"cannot read {path}: {what} of {info.st_size} bytes, more than the {limit} bytes accepted")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # grew while being read
                raise ValueError(f"cannot read {path}: {what} larger than the {limit} bytes accepted")
        return b"".join(chunks)
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    finally:
        os.close(fd)


def write_atomically(path: str | Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it over ``path``: an
    interrupted write leaves the old file (or none), never a partial one. A symbolic link is
    followed (its target is replaced); the file keeps its permissions."""
    real = os.path.realpath(path)
    folder = os.path.dirname(real) or "."
    try:
        mode = stat.S_IMODE(os.stat(real).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(real) + ".", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
