"""The target's side of a head's training data: for every sequence, its hidden states entering the
head's layers (bfloat16) and its distribution at every position as the top ``K`` tokens and their
probabilities (the soft labels), served one training batch at a time. Two ways, neither holding all
features in memory:

- **online** (``OnlineBatches``): the target computes a batch's features when the batch is trained,
  in one padded pass on its own device (no gradient, nothing on disk);
- **disk** (``write_shards``, then ``ShardBatches``): computed once, one shard file per batch (written
  whole: a temporary file, then a rename; a stopped run resumes at the first missing shard), and read
  back one batch at a time, memory-mapped.

A batch is a group of sequence indices; a process of a data-parallel run takes its share of each
group (every ``size``-th sequence from its ``rank``), so the processes together train the same
global batch one process would.
"""
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import Module

from runners.hidden import check_layers, select_hidden

Share = Tuple[int, int]  # (rank, size) of a data-parallel run; (0, 1) alone


@dataclass(frozen=True)
class FeatureSpec:
    """What is computed: the head's layers (``hidden_states`` indices) and how many top tokens."""

    layers: Tuple[int, ...]
    top: int = 32


def _device(model: Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def sequence_features(target: Module, ids, layers: Tuple[int, ...], top: int) -> dict:
    """One sequence's features ``[T, 3Ht]`` (bfloat16), top-``top`` ids ``[T, top]`` (int32) and
    probabilities (float16), from one unpadded pass on the target's device."""
    out = target(input_ids=torch.as_tensor(ids, dtype=torch.long, device=_device(target))[None], output_hidden_states=True)
    probs = torch.softmax(out.logits[0].float(), dim=-1)
    p, i = probs.topk(top, dim=-1)
    return {"features": select_hidden(out.hidden_states, layers).to(torch.bfloat16),
            "top_ids": i.to(torch.int32), "top_probs": p.to(torch.float16)}


@torch.no_grad()
def batch_features(target: Module, rows: Sequence[dict], spec: FeatureSpec) -> List[dict]:
    """The items (``sequence_features`` and ``ids``, ``prompt_length``) of ``rows`` from one pass over
    the right-padded batch: causal attention keeps a row's own positions from seeing its padding."""
    device = _device(target)
    width = max(len(r["ids"]) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    for j, row in enumerate(rows):
        ids[j, : len(row["ids"])] = torch.as_tensor(row["ids"], dtype=torch.long, device=device)
        mask[j, : len(row["ids"])] = 1
    out = target(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    items = []
    for j, row in enumerate(rows):
        n = len(row["ids"])
        p, i = torch.softmax(out.logits[j, :n].float(), dim=-1).topk(spec.top, dim=-1)  # one row's [n, V] at a time
        items.append({"features": torch.cat([out.hidden_states[k][j, :n] for k in spec.layers], -1).to(torch.bfloat16),
                      "top_ids": i.to(torch.int32), "top_probs": p.to(torch.float16), "ids": ids[j, :n].to(torch.int32),
                      "prompt_length": row["prompt_length"]})
    return items


# ---- batches ---------------------------------------------------------------------------------------
def length_groups(lengths: Sequence[int], size: int) -> List[List[int]]:
    """Training batches: indices sorted by length (stable), cut into groups of ``size``."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[i : i + size] for i in range(0, len(order), size)]


def ordered_groups(count: int, size: int) -> List[List[int]]:
    """Evaluation batches: indices in order, in groups of ``size``."""
    return [list(range(i, min(count, i + size))) for i in range(0, count, size)]


def batch_tensors(items: Sequence[dict], draft_index: Tensor, device: torch.device | str = "cpu"):
    """Pad a batch: features ``[B, T, F]`` (float32), ids ``[B, T]``, soft labels over draft ids
    ``[B, T, K]`` (index -1 where the token is outside the draft vocabulary) and their probabilities,
    and the answer mask ``[B, T]`` (rows whose distribution is a label: from the last prompt position
    to the one before the end), on ``device``."""
    t = max(len(i["ids"]) for i in items)
    b = len(items)
    width, k = items[0]["features"].shape[1], items[0]["top_ids"].shape[1]
    features = torch.zeros((b, t, width), device=device)
    ids = torch.zeros((b, t), dtype=torch.long, device=device)
    labels = torch.full((b, t, k), -1, dtype=torch.long, device=device)
    probs = torch.zeros((b, t, k), device=device)
    mask = torch.zeros((b, t), dtype=torch.bool, device=device)
    draft_index = draft_index.to(device)
    for j, item in enumerate(items):
        n = len(item["ids"])
        features[j, :n] = item["features"].to(device).float()
        ids[j, :n] = item["ids"].to(device).long()
        labels[j, :n] = draft_index[item["top_ids"].to(device).long()]
        probs[j, :n] = item["top_probs"].to(device).float()
        mask[j, item["prompt_length"] - 1 : n - 1] = True
    probs = probs * (labels >= 0)
    probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-9)
    return features, ids, labels, probs, mask


class Batches(ABC):
    """Batches of the training-time test's inputs: ``len()`` groups, ``self[b]`` the tensors of this
    process's share of group ``b`` (None when its share is empty), on ``device``."""

    def __init__(self, groups: List[List[int]], draft_index: Tensor, share: Share = (0, 1), device="cpu"):
        self.groups, self.draft_index, self.share, self.device = groups, draft_index, share, device

    def __len__(self) -> int:
        return len(self.groups)

    def positions(self, b: int) -> range:
        """Which places of group ``b`` this process takes."""
        rank, size = self.share
        return range(rank, len(self.groups[b]), size)

    @abstractmethod
    def items(self, b: int) -> List[dict]:
        """The items of this process's share of group ``b``."""

    def __getitem__(self, b: int):
        items = self.items(b)
        return batch_tensors(items, self.draft_index, self.device) if items else None


class ItemBatches(Batches):
    """Batches of items held in memory (small data, tests)."""

    def __init__(self, items: Sequence[dict], groups, draft_index, share: Share = (0, 1), device="cpu"):
        super().__init__(groups, draft_index, share, device)
        self.all = items

    def items(self, b: int) -> List[dict]:
        return [self.all[self.groups[b][p]] for p in self.positions(b)]


class OnlineBatches(Batches):
    """Batches whose features the target computes when asked (no disk, one batch in memory)."""

    def __init__(self, target: Module, rows: Sequence[dict], groups, draft_index, spec: FeatureSpec, share: Share = (0, 1)):
        super().__init__(groups, draft_index, share, _device(target))
        self.target, self.rows, self.spec = target, rows, spec
        check_layers(target, spec.layers)

    def items(self, b: int) -> List[dict]:
        rows = [self.rows[self.groups[b][p]] for p in self.positions(b)]
        return batch_features(self.target, rows, self.spec) if rows else []


class ShardBatches(Batches):
    """Batches read from the shards ``write_shards`` wrote (``<folder>/<prefix>-<b>.pt``), one at a time."""

    def __init__(self, folder: Path, prefix: str, groups, draft_index, share: Share = (0, 1), device="cpu"):
        super().__init__(groups, draft_index, share, device)
        self.folder, self.prefix = Path(folder), prefix

    def items(self, b: int) -> List[dict]:
        positions = self.positions(b)
        if not positions:
            return []
        shard = torch.load(shard_path(self.folder, self.prefix, b), weights_only=True, mmap=True)
        return [shard[p] for p in positions]


def shard_path(folder: Path, prefix: str, b: int) -> Path:
    return Path(folder) / f"{prefix}-{b:05d}.pt"


def write_shards(target: Module, rows: Sequence[dict], groups: List[List[int]], folder: Path, prefix: str,
                 spec: FeatureSpec, share: Share = (0, 1), progress: Optional[Callable[[int], None]] = None) -> None:
    """Write the missing shards of ``groups`` (this process's: every ``size``-th from ``rank``): shard
    ``b`` holds the items of group ``b`` in order, each sequence from its own unpadded pass in the
    target's dtype, on its device. ``progress(tokens)`` is told of every group, done or skipped."""
    layers = check_layers(target, spec.layers)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rank, size = share
    for b in range(rank, len(groups), size):
        path = shard_path(folder, prefix, b)
        if not path.is_file():
            items = []
            for i in groups[b]:
                item = {k: v.cpu() for k, v in sequence_features(target, rows[i]["ids"], layers, spec.top).items()}
                item.update(ids=torch.as_tensor(rows[i]["ids"], dtype=torch.int32), prompt_length=rows[i]["prompt_length"])
                items.append(item)
            temporary = path.with_suffix(f".tmp{os.getpid()}")
            torch.save(items, temporary)
            os.replace(temporary, path)
        if progress is not None:
            progress(sum(len(rows[i]["ids"]) for i in groups[b]))
