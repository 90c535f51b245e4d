"""The target's side of a head's training data, computed once and kept on disk in shards: for every
sequence, its hidden states entering the head's layers (bfloat16) and its distribution at every
position as the top ``K`` tokens and their probabilities (the soft labels). A stopped run resumes at
the first missing shard; each shard is written whole (temporary file, then rename)."""
import os
from pathlib import Path
from typing import Iterator, List, Sequence, Tuple

import torch
from torch.nn import Module

from runners.hidden import check_layers, select_hidden

SHARD = 32  # sequences a shard


@torch.no_grad()
def sequence_features(target: Module, ids: List[int], layers: Tuple[int, ...], top: int) -> dict:
    """One sequence's features ``[T, 3Ht]`` (bfloat16), top-``top`` ids ``[T, top]`` and probabilities."""
    out = target(input_ids=torch.tensor([ids]), output_hidden_states=True)
    probs = torch.softmax(out.logits[0].float(), dim=-1)
    p, i = probs.topk(top, dim=-1)
    return {"features": select_hidden(out.hidden_states, layers).to(torch.bfloat16),
            "top_ids": i.to(torch.int32), "top_probs": p.to(torch.float16)}


def write_features(target: Module, rows: Sequence[dict], folder: Path, layers: Sequence[int], top: int = 32,
                   progress=None) -> int:
    """Write the shards of ``rows`` (``ids``, ``prompt_length``) missing from ``folder``; returns the shard count."""
    layers = check_layers(target, layers)
    folder.mkdir(parents=True, exist_ok=True)
    shards = (len(rows) + SHARD - 1) // SHARD
    for s in range(shards):
        path = folder / f"shard-{s:05d}.pt"
        group = rows[s * SHARD : (s + 1) * SHARD]
        if path.is_file():
            if progress is not None:
                progress.update(sum(len(r["ids"]) for r in group))
            continue
        items = []
        for row in group:
            item = sequence_features(target, row["ids"], layers, top)
            item.update(ids=torch.tensor(row["ids"], dtype=torch.int32), prompt_length=row["prompt_length"])
            items.append(item)
            if progress is not None:
                progress.update(len(row["ids"]))
        temporary = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(items, temporary)
        os.replace(temporary, path)
    return shards


def read_shards(folder: Path) -> Iterator[dict]:
    """Every sequence of the shards in ``folder``, in order."""
    for path in sorted(folder.glob("shard-*.pt")):
        yield from torch.load(path, weights_only=True)
