"""Train an EAGLE-3 head for a target, on this machine, from the target's own answers:

    python -m eagle.train --target embedded --out heads/smollm2-135m-eagle3 [--device auto]

Read top to bottom: the data (questions and greedy answers, written by the target on ``--device``)
is grown a chunk at a time into a versioned folder kept with the head (``--data``, by default
``<out>-data``; ``eagle.artifact``), so a stopped run resumes, on this machine or another; then the
draft vocabulary, the features (``--features online``: computed per batch by the target, the default
on CUDA; ``disk``: written once into shards in ``--work``, the default on CPU), the training loop
(``eagle.loop``, checkpointed every 2 minutes in ``--work``), and the head in the speculators format.
Under ``torchrun`` or ``accelerate launch`` the processes train data-parallel (``eagle.parallel``).
"""
import argparse
import copy
import hashlib
import json
import os
import shlex
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Sequence

import torch

from eagle.artifact import (MANIFEST, DataError, DataRecipe, Owner, check_fits, grow, held, read_manifest, read_rows, recipe_of,
                            target_sha256, used_chunks, verify)
from eagle.format import save_head
from eagle.loop import Recipe
from eagle.parallel import World, join, leave
from eagle.stages import Place, features_and_head
from utils.models import cache_dir

QUICK = dict(questions=400, answer_tokens=160, epochs=5, minutes=12.0)
ROOT = Path(__file__).resolve().parents[1]
EVALUATION_SETS = [ROOT.parent / "shared" / "specbench" / "question.jsonl", ROOT / "bench_prompts.jsonl",
                   *sorted((ROOT / "prompts").glob("*.jsonl"))]  # read for the overlap ban only, never trained on


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eagle.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="embedded", help="'embedded', a model folder or a .gguf file")
    p.add_argument("--out", help="folder for the head (speculators format); needed unless --data-only")
    p.add_argument("--data", help="the data folder (manifest.json and chunks), grown when short; default <out>-data")
    p.add_argument("--work", help="folder for feature shards and checkpoints (default: the cache folder)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where the target writes and training runs; auto: cuda when available")
    p.add_argument("--features", default="auto", choices=("auto", "online", "disk"),
                   help="online: computed per batch by the target; disk: written once into shards; auto: online on CUDA, disk on CPU")
    p.add_argument("--quick", action="store_true", help=f"the quick recipe: {QUICK}")
    for name, value in asdict(Recipe()).items():
        p.add_argument("--" + name.replace("_", "-"), type=type(value), default=None, help=f"default {value}")
    p.add_argument("--chunk-questions", type=int, default=None, help=f"questions per data chunk (default {DataRecipe.chunk_questions})")
    p.add_argument("--data-batch", type=int, default=None, help="answers written at once (default 16 on CPU, 128 on CUDA)")
    p.add_argument("--writer", default="ours", choices=("ours", "transformers"),
                   help="who writes the greedy answers: ours (eagle.writer: a static cache whose rows are refilled; its decoding "
                   "pass compiled with CUDA graphs on CUDA) or transformers' generate")
    p.add_argument("--data-only", action="store_true", help="grow the data folder to --questions, then stop")
    p.add_argument("--train-only", action="store_true", help="write no data: train on what the data folder holds")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many training steps of this run (checkpointed)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of each process (default: the cores shared among the processes)")
    p.add_argument("--data-dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                   help="the dtype the target writes questions and answers in; auto: a data folder's own, else bfloat16 on CUDA, "
                   "and on CPU bfloat16 where its batched matmul measures clearly faster (AVX-512 BF16, AMX), else float32")
    args = p.parse_args(argv)
    if not args.out and not (args.data_only and args.data):
        p.error("--out is needed (or --data-only with --data)")
    if args.data_only and args.train_only:
        p.error("--data-only and --train-only exclude each other")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    world, device = join(device)
    try:
        return run(args, argv, device, world)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        leave(world)


def run(args: argparse.Namespace, argv, device: str, world: World) -> int:
    """The command after its flags: the data, then the features, training and the head."""
    from utils.models import end_tokens, load_model

    say = print if world.main else (lambda text: None)
    values = {**asdict(Recipe()), **(QUICK if args.quick else {})}
    values.update({k: v for k, v in vars(args).items() if k in values and v is not None})
    recipe = Recipe(**values)
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world.size))
    torch.manual_seed(recipe.seed)
    folder = Path(args.data) if args.data else Path(str(args.out).rstrip("/") + "-data")
    manifest = read_manifest(folder)
    if manifest is not None:
        verify(folder, manifest)  # every chunk's sha256, before anything is loaded or written
    elif args.train_only:
        raise DataError(f"{folder} holds no data to train on (--train-only)")
    on_cuda = device.startswith("cuda")
    dtype = (recipe_of(manifest).dtype if manifest else args.data_dtype.replace("auto", "bfloat16")) if on_cuda else "float32"
    name = None if args.target == "embedded" else args.target
    target, tokenizer, label = load_model(name, device=device, dtype=dtype, say=say)
    vocab_size = target.get_output_embeddings().weight.shape[0]
    sha = target_sha256(name)
    if manifest is not None:
        check_fits(folder, manifest, sha)
    data_recipe = _data_recipe(args, recipe, manifest, target, say)
    goal = args.questions or (int(manifest.get("goal", 0)) if manifest else 0) or recipe.questions
    command = "python -m eagle.train " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    clock = time.monotonic()
    if world.main and not args.train_only and held(manifest) < goal:
        owner = Owner(label, sha, vocab_size, command)
        batch = args.data_batch or (128 if on_cuda else 16)
        _grow(folder, goal, owner, data_recipe, (target, tokenizer), (batch, args.writer), say)
    world.barrier()
    manifest = read_manifest(folder)
    rows = read_rows(folder, manifest, vocab_size, goal)  # every chunk checked again: another process may have grown it
    data_minutes = (time.monotonic() - clock) / 60
    say(f"data: {len(rows)} questions, {sum(len(r['ids']) - r['prompt_length'] for r in rows)} answer tokens, from {folder}")
    if args.data_only:
        return 0
    recipe = replace(recipe, questions=len(rows), answer_tokens=data_recipe.answer_tokens)
    chunks = used_chunks(manifest, len(rows))
    data_key = hashlib.sha256(json.dumps([[c["sha256"] for c in chunks], len(rows)]).encode()).hexdigest()[:12]
    work = Path(args.work) if args.work else cache_dir() / "eagle" / f"{Path(name or 'SmolLM2-135M-Instruct').name}-{sha[:12]}"
    work.mkdir(parents=True, exist_ok=True)
    say(f"recipe: {recipe}\nwork folder: {work}")
    features = args.features if args.features != "auto" else "online" if on_cuda else "disk"
    place = Place(device, world, features, work, data_key, args.max_steps)
    head, figures, facts = features_and_head(target, rows, end_tokens(target, tokenizer), recipe, place, say)
    if world.main:
        manifest_sha = hashlib.sha256((folder / MANIFEST).read_bytes()).hexdigest()
        facts.update(folder=str(folder), manifest_sha256=manifest_sha, target_sha256=sha, recipe=asdict(data_recipe),
                     dropped_for_overlap=sum(int(c.get("dropped_for_overlap", 0)) for c in chunks), chunks=len(chunks),
                     source=f"questions written by {label} itself from its chat template's user turn, begun with one of "
                            "eagle.data.OPENERS; its own greedy answers", features=features,
                     minutes_this_run_outside_training=round(data_minutes + facts.pop("minutes_outside_training"), 1))
        extra = {"command": command, "recipe": asdict(recipe), "held_out": figures, "data": facts}
        digest = save_head(head, args.out, target_name=label, extra=extra)
        say(f"saved {args.out} (sha256 {digest}): held-out {figures['tokens_per_pass']} tokens per pass, "
            f"accuracy by step {figures['accuracy']}")
    return 0


def _data_recipe(args: argparse.Namespace, recipe: Recipe, manifest, target, say) -> DataRecipe:
    """The folder's own recipe (a flag given that differs from it: DataError), else a new one."""
    if manifest is not None:
        own = recipe_of(manifest)
        asked = {"answer_tokens": args.answer_tokens, "chunk_questions": args.chunk_questions,
                 "dtype": None if args.data_dtype == "auto" else args.data_dtype}
        differ = [f"{k} {getattr(own, k)!r} (asked: {v!r})" for k, v in asked.items() if v is not None and v != getattr(own, k)]
        if differ:
            raise DataError(f"the data folder was written with {', '.join(differ)}: leave the flag out, or give another --data")
        return own
    dtype = args.data_dtype
    if dtype == "auto" and next(target.parameters()).device.type == "cuda":
        dtype = "bfloat16"
    elif dtype == "auto":
        from measure.dtype import choose_cpu_dtype

        dtype, reason = choose_cpu_dtype(target.config.hidden_size, target.config.intermediate_size, rows=16)
        say(f"data dtype: {reason}")
    return DataRecipe(answer_tokens=recipe.answer_tokens, seed=recipe.seed,
                      chunk_questions=args.chunk_questions or DataRecipe.chunk_questions, dtype=dtype)


def _grow(folder: Path, goal: int, owner: Owner, recipe: DataRecipe, model, how: tuple, say) -> None:
    """Grow the data folder to ``goal`` questions, written by ``model`` (target, tokenizer) in ``recipe.dtype``,
    ``how = (answers' batch, writer)``; our writer's decoding pass is compiled on CUDA only."""
    from eagle.data import ChunkWriter, Overlap, evaluation_sets, write_chunk
    from utils.models import end_tokens

    target, tokenizer = model
    dtype = getattr(torch, recipe.dtype)
    writer = target if next(target.parameters()).dtype == dtype else copy.deepcopy(target).to(dtype)
    batch, answers_by = how
    if answers_by == "ours":
        from eagle.writer import supported

        why = supported(target)
        if why is not None:
            say(f"data: our answer writer cannot run {why}: transformers' generate writes the answers")
            answers_by = "transformers"
    on_cuda = next(target.parameters()).device.type == "cuda"
    texts, record = evaluation_sets(EVALUATION_SETS)
    for missing in record["missing"]:
        say(f"data: {missing} is missing: the questions are not checked against it (the manifest says so)")
    how = ChunkWriter(recipe, Overlap(texts, recipe.overlap_words, record), tuple(end_tokens(target, tokenizer)),
                      batch, answers_by, compile=on_cuda)
    grow(folder, goal, owner, recipe, lambda index, seen: write_chunk(writer, tokenizer, index, seen, how), say)


if __name__ == "__main__":
    sys.exit(main())
