"""The stages of ``python -m eagle.train`` after the data: the draft vocabulary, the features (online
or disk, ``eagle.features``), the head's start and its training (``eagle.loop``)."""
import hashlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch
from torch.nn import Module

from eagle.data import draft_vocabulary
from eagle.features import FeatureSpec, OnlineBatches, ShardBatches, length_groups, ordered_groups, write_shards
from eagle.head import Eagle3Head, HeadConfig
from eagle.loop import Recipe, Run, initial_head, train
from eagle.parallel import World


@dataclass(frozen=True)
class Place:
    """Where and how a run trains: its device and world of processes, the features' way (``online`` or
    ``disk``), the work folder (shards, checkpoints), the data's key, and an early stop (steps of this run)."""

    device: str
    world: World
    features: str
    work: Path
    data_key: str
    stop_after: Optional[int] = None


def features_and_head(target: Module, rows: List[dict], always: Sequence[int], recipe: Recipe, place: Place,
                      say=print) -> Tuple[Eagle3Head, dict, dict]:
    """Train a head on ``rows`` (``ids``, ``prompt_length``); returns ``(head, held-out figures, data facts)``.
    The last ``recipe.held_out`` of the rows are held out; ``always``: ids the draft vocabulary keeps (end tokens)."""
    began = time.monotonic()
    vocab_size = target.get_output_embeddings().weight.shape[0]
    vocabulary = draft_vocabulary(rows, recipe.draft_vocab, always, vocab_size)
    config = HeadConfig.for_target(target, draft_vocab_size=len(vocabulary))
    draft_index = torch.full((vocab_size,), -1, dtype=torch.long)
    draft_index[vocabulary] = torch.arange(len(vocabulary))
    cut = len(rows) - max(1, int(len(rows) * recipe.held_out))
    learn, held = rows[:cut], rows[cut:]
    groups = length_groups([len(r["ids"]) for r in learn], recipe.batch_sequences), ordered_groups(len(held), recipe.batch_sequences)
    spec = FeatureSpec(tuple(config.aux_layers), recipe.top)
    folder = place.work / f"features-top{recipe.top}-{_key(place.data_key, recipe, config)}"
    batches = _batches(target, (learn, held), groups, draft_index, spec, (place, folder))
    torch.manual_seed(recipe.seed)
    head = initial_head(target, config, vocabulary).to(place.device)
    outside = (time.monotonic() - began) / 60
    checkpoint = place.work / f"checkpoint-{_name(recipe)}-{place.data_key}.pt"
    figures = train(head, batches[0], batches[1], recipe, checkpoint, Run(say, place.stop_after, place.world))
    answers = torch.cat([r["ids"][r["prompt_length"] :].long() for r in rows])
    coverage = float(draft_index[answers].ge(0).float().mean()) if len(answers) else 0.0
    return head, figures, {"questions": len(rows), "answer_tokens": len(answers), "draft_vocab_coverage": round(coverage, 4),
                           "minutes_outside_training": outside}


def _batches(target: Module, parts: tuple, groups: tuple, draft_index: torch.Tensor, spec: FeatureSpec, where: tuple) -> list:
    """The training and held-out ``Batches`` of ``parts`` (rows) in ``groups``: online, or from the shards
    in ``where = (place, folder)``, written first where missing (each process its share of them)."""
    place, folder = where
    share = place.world.share
    if place.features == "online":
        return [OnlineBatches(target, part, g, draft_index, spec, share) for part, g in zip(parts, groups)]
    from tqdm import tqdm

    rank, size = share
    mine = sum(len(part[i]["ids"]) for part, g in zip(parts, groups) for group in g[rank::size] for i in group)
    with tqdm(total=mine, desc="features", unit="tok", disable=not place.world.main) as bar:
        for part, g, prefix in zip(parts, groups, ("train", "held")):
            write_shards(target, part, g, folder, prefix, spec, share, progress=bar.update)
    place.world.barrier()
    return [ShardBatches(folder, prefix, g, draft_index, share, place.device) for g, prefix in zip(groups, ("train", "held"))]


def _name(recipe: Recipe) -> str:
    """The checkpoint's name: what the trained weights depend on (not the time budget)."""
    return "-".join(f"{k}={v}" for k, v in asdict(recipe).items() if k != "minutes")


def _key(data_key: str, recipe: Recipe, config: HeadConfig) -> str:
    """What the shards depend on: the data, the batches and the held-out split, the layers."""
    parts = [data_key, recipe.batch_sequences, recipe.held_out, list(config.aux_layers)]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]
