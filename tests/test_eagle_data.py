"""``python -m eagle.train`` on a tiny target (CPU): the data kept with the head as a versioned artifact
(whole chunks, the same data however its writing was stopped or shared between two processes, every
checksum verified, bad folders refused in one line with nothing changed, training from it writes
nothing and gives the same head twice), features online or from disk shards read one batch at a time
(the same batches), and data-parallel training in two gloo processes under torchrun (the head one
process trains, resumed after a stop)."""
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import llama
from eagle import data as eagle_data
from eagle.artifact import MANIFEST, read_manifest
from eagle.features import FeatureSpec, OnlineBatches, ShardBatches, length_groups, write_shards
from eagle.train import main
from test_cross_tokenizer import CHATML, byte_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--chunk-questions", "8", "--answer-tokens", "12", "--epochs", "2", "--batch-sequences", "4", "--top", "8",
        "--draft-vocab", "64", "--lr", "0.003", "--threads", "1", "--data-dtype", "float32", "--device", "cpu"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """A tiny llama over a byte-level tokenizer with a chat template, saved as a model folder. Every
    position leans on one direction that the end token's row reads, so that sampled questions end."""
    folder = tmp_path_factory.mktemp("target") / "tiny"
    tokenizer = byte_tokenizer(300)
    tokenizer.chat_template = CHATML
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model = llama(vocab=len(tokenizer), layers=4, seed=5, init=0.1).float()
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.lm_head.weight[end, 0] = 16.0
    model.config.eos_token_id = model.generation_config.eos_token_id = end
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def write_data(tiny: str, folder: Path, questions: int) -> int:
    return main(["--target", tiny, "--data", str(folder), "--data-only", "--questions", str(questions), *TINY])


def chunk_digests(folder: Path) -> list:
    return [c["sha256"] for c in read_manifest(folder)["chunks"]]


def snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())}


@pytest.fixture(scope="module")
def data16(tiny, tmp_path_factory) -> Path:
    """16 questions and their answers in two chunks, written in one run."""
    folder = tmp_path_factory.mktemp("data") / "tiny-data"
    assert write_data(tiny, folder, 16) == 0
    return folder


# ---- the artifact --------------------------------------------------------------------------------------
def test_data_grows_in_whole_chunks_and_a_stopped_run_resumes_to_the_same_data(tiny, data16, tmp_path, monkeypatch):
    manifest = read_manifest(data16)
    assert [c["questions"] for c in manifest["chunks"]] == [8, 8] and manifest["goal"] == 16
    assert manifest["target"]["sha256"] and manifest["command"].startswith("python -m eagle.train")
    assert sorted(p.name for p in data16.iterdir()) == [".lock", "chunk-00000.jsonl.gz", "chunk-00001.jsonl.gz", MANIFEST]
    grown = tmp_path / "grown"  # 8 questions, then 16 later: the same chunks as one run
    assert write_data(tiny, grown, 8) == 0 and len(chunk_digests(grown)) == 1
    assert write_data(tiny, grown, 16) == 0 and chunk_digests(grown) == chunk_digests(data16)
    stopped, generate, calls = tmp_path / "stopped", eagle_data._generate, []

    def stop_in_the_second_chunk(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # chunk 0's questions (its answers: eagle.writer); then a stop in chunk 1's
            raise KeyboardInterrupt
        return generate(*args, **kwargs)

    monkeypatch.setattr(eagle_data, "_generate", stop_in_the_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        write_data(tiny, stopped, 16)
    monkeypatch.setattr(eagle_data, "_generate", generate)
    assert sorted(p.name for p in stopped.iterdir()) == [".lock", "chunk-00000.jsonl.gz", MANIFEST]
    (stopped / ".chunk-00001.jsonl.gz.x1y2.partial").write_bytes(b"half")  # what a writer killed mid-write leaves
    assert write_data(tiny, stopped, 16) == 0 and chunk_digests(stopped) == chunk_digests(data16)
    assert sorted(p.name for p in stopped.iterdir()) == sorted(p.name for p in data16.iterdir())


def test_a_writer_that_dies_after_renaming_chunk_0_leaves_a_data_folder_that_resumes(tiny, data16, tmp_path, monkeypatch):
    """The manifest is written before the first chunk: a crash between chunk 0's rename and the manifest
    that lists it leaves a folder read as data (0 chunks; the orphan written again), not refused as foreign."""
    import eagle.artifact as artifact

    folder, real = tmp_path / "died", artifact.write_atomically

    def die_after_the_first_chunk(path, data):
        real(path, data)
        if Path(path).name == artifact.chunk_name(0):
            raise KeyboardInterrupt

    monkeypatch.setattr(artifact, "write_atomically", die_after_the_first_chunk)
    with pytest.raises(KeyboardInterrupt):
        write_data(tiny, folder, 16)
    monkeypatch.setattr(artifact, "write_atomically", real)
    assert (folder / "chunk-00000.jsonl.gz").is_file() and read_manifest(folder)["chunks"] == []
    assert write_data(tiny, folder, 16) == 0 and chunk_digests(folder) == chunk_digests(data16)


def test_the_manifest_records_what_the_overlap_ban_ran_against_and_names_a_missing_set(tmp_path):
    """Every chunk records the evaluation files its questions were checked against (name, sha256,
    turns) and those that were missing; a missing file is named, never skipped without a word."""
    present = tmp_path / "present.jsonl"
    present.write_text(json.dumps({"turns": ["one two three four five six seven eight nine"]}) + "\n")
    texts, record = eagle_data.evaluation_sets([present, tmp_path / "absent.jsonl"])
    assert texts == ["one two three four five six seven eight nine"]
    assert record["missing"] == [str(tmp_path / "absent.jsonl")]
    assert record["checked"]["present.jsonl"]["turns"] == 1 and len(record["checked"]["present.jsonl"]["sha256"]) == 64
    assert eagle_data.Overlap(texts, 8, record)("so one two three four five six seven eight") is True


def test_a_written_chunk_says_which_evaluation_sets_its_questions_were_checked_against(data16):
    for chunk in read_manifest(data16)["chunks"]:
        ban = chunk["overlap_ban"]
        assert "bench_prompts.jsonl" in ban["checked"] and isinstance(ban["missing"], list)
        specbench = ROOT.parent / "shared" / "specbench" / "question.jsonl"
        assert ("question.jsonl" in ban["checked"]) == specbench.is_file()
        assert (str(specbench) in ban["missing"]) == (not specbench.is_file())


def _write_and_exit(tiny: str, folder: str, questions: int) -> None:
    sys.exit(write_data(tiny, Path(folder), questions))


def test_two_writers_at_once_write_every_chunk_once_and_the_same_data(tiny, data16, tmp_path):
    folder = tmp_path / "shared"
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_write_and_exit, args=(tiny, str(folder), 24)) for _ in range(2)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
        assert w.exitcode == 0
    assert chunk_digests(folder)[:2] == chunk_digests(data16) and len(chunk_digests(folder)) == 3
    assert sorted(p.name for p in folder.iterdir()) == [".lock", *(f"chunk-0000{i}.jsonl.gz" for i in range(3)), MANIFEST]


def _one_line_refusal(argv, capsys, *mentions) -> str:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and all(m in lines[0] for m in mentions), lines
    return lines[0]


def damaged(data: Path, folder: Path, damage: str) -> list:
    """A copy of ``data`` at ``folder`` damaged as named; returns the flags that meet the damage."""
    shutil.copytree(data, folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    chunk = folder / "chunk-00001.jsonl.gz"
    if damage == "flip a byte":
        changed = bytearray(chunk.read_bytes())
        changed[len(changed) // 2] ^= 1
        chunk.write_bytes(bytes(changed))
    elif damage == "remove a chunk":
        chunk.unlink()
    elif damage == "another target":
        manifest["target"]["sha256"] = "0" * 64
    elif damage == "another version":
        manifest["version"] = 99
    elif damage == "a folder of something else":
        shutil.rmtree(folder)
        folder.mkdir()
        (folder / "notes.txt").write_text("mine")
        return []
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return ["--questions", "24", "--answer-tokens", "5"] if damage == "another answer length" else []


@pytest.mark.parametrize("damage, mentions", [
    ("flip a byte", ("chunk-00001.jsonl.gz", "sha256")),
    ("remove a chunk", ("chunk-00001.jsonl.gz", "cannot read")),
    ("another target", ("written by a target",)),
    ("another version", ("version",)),
    ("another answer length", ("answer_tokens 12 (asked: 5)",)),  # growing it would write other answers than its own
    ("a folder of something else", ("not an EAGLE data folder",)),
])
def test_a_bad_data_folder_is_refused_in_one_line_and_nothing_changes(tiny, data16, tmp_path, capsys, damage, mentions):
    folder, out, work = tmp_path / "data", tmp_path / "head", tmp_path / "work"
    flags = damaged(data16, folder, damage)
    before = snapshot(folder)
    _one_line_refusal(["--target", tiny, "--data", str(folder), "--out", str(out), "--work", str(work), *TINY, *flags],
                      capsys, *mentions)
    assert snapshot(folder) == before and not out.exists() and not work.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_asking_for_cuda_without_it_is_one_line(tiny, tmp_path, capsys):
    _one_line_refusal(["--target", tiny, "--out", str(tmp_path / "head"), *TINY, "--device", "cuda"], capsys, "CUDA")
    assert not any(tmp_path.iterdir())


def head_digest(folder: Path) -> str:
    return json.loads((folder / "config.json").read_text())["specdec"]["sha256"]


def checkpoint_state(work: Path) -> dict:
    (path,) = work.glob("checkpoint-*.pt")
    return torch.load(path, weights_only=False)


def test_training_from_committed_data_writes_nothing_and_gives_the_same_head_twice(tiny, data16, tmp_path):
    before = snapshot(data16)
    heads = {}
    for run, features in (("first", "disk"), ("again", "disk"), ("online", "online")):
        argv = ["--target", tiny, "--data", str(data16), "--out", str(tmp_path / run), "--work", str(tmp_path / f"work-{run}"),
                "--features", features, *TINY]
        assert main(argv) == 0
        heads[run] = checkpoint_state(tmp_path / f"work-{run}")
    assert snapshot(data16) == before
    assert head_digest(tmp_path / "first") == head_digest(tmp_path / "again")
    record = json.loads((tmp_path / "first" / "config.json").read_text())["specdec"]
    assert record["data"]["manifest_sha256"] and record["data"]["questions"] == 16 and record["recipe"]["answer_tokens"] == 12
    for name, weight in heads["first"]["head"].items():  # online features: one padded pass per batch, not one per sequence
        assert torch.allclose(weight, heads["online"]["head"][name], atol=2e-3), name
    assert heads["first"]["step"] == heads["online"]["step"] == 2 * 4


# ---- features: online or from disk, the same batches, read one at a time -------------------------------
def test_online_batches_equal_the_disk_shards_and_a_shard_is_read_only_when_its_batch_is(tmp_path):
    target = llama(layers=4, init=0.1, seed=5)
    gen = torch.Generator().manual_seed(3)
    rows = [{"ids": torch.randint(0, 96, (int(n),), generator=gen, dtype=torch.int32), "prompt_length": 3}
            for n in torch.randint(5, 20, (10,), generator=gen)]
    groups = length_groups([len(r["ids"]) for r in rows], 4)
    index = torch.arange(96)
    spec = FeatureSpec((1, 2, 3), top=8)
    write_shards(target, rows, groups, tmp_path, "train", spec)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train-00000.pt", "train-00001.pt", "train-00002.pt"]
    online, disk = OnlineBatches(target, rows, groups, index, spec), ShardBatches(tmp_path, "train", groups, index)
    for b in range(len(groups)):
        a, d = online[b], disk[b]
        assert torch.allclose(a[0], d[0], rtol=1e-2, atol=1e-3)  # features kept in bfloat16: one rounding apart at most
        for x, y in zip(a[1:], d[1:]):
            assert torch.allclose(x.double(), y.double(), atol=1e-3)
    (tmp_path / "train-00000.pt").unlink()
    (tmp_path / "train-00001.pt").unlink()
    assert torch.equal(ShardBatches(tmp_path, "train", groups, index)[2][1], d[1])  # nothing read but the batch's shard
    whole = online[0][1]
    for rank in (0, 1):  # a process's share: every second sequence of each batch
        ids = OnlineBatches(target, rows, groups, index, spec, (rank, 2))[0][1]
        assert torch.equal(ids, whole[rank::2, : ids.shape[1]])


# ---- several processes ----------------------------------------------------------------------------------
def torchrun(argv) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "eagle.train", *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_two_gloo_processes_train_the_head_one_process_trains_and_resume_after_a_stop(tiny, data16, tmp_path):
    common = ["--target", tiny, "--data", str(data16), "--features", "disk", *TINY]
    assert main([*common, "--out", str(tmp_path / "one"), "--work", str(tmp_path / "work-one")]) == 0
    two = [*common, "--out", str(tmp_path / "two"), "--work", str(tmp_path / "work-two")]
    stopped = torchrun([*two, "--max-steps", "3"])
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert checkpoint_state(tmp_path / "work-two")["step"] == 3
    resumed = torchrun(two)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from step 3 of 8" in resumed.stdout and resumed.stdout.count("saved ") == 1
    one, two_state = checkpoint_state(tmp_path / "work-one"), checkpoint_state(tmp_path / "work-two")
    assert one["step"] == two_state["step"] == 8
    for name, weight in one["head"].items():
        assert torch.allclose(weight, two_state["head"][name], atol=1e-5), name
