"""llama.cpp's kernels as a runner: ``LlamaCppRunner`` decodes a GGUF target with llama.cpp (through
llama-cpp-python's batch API), so every loop and drafter runs on the file as llama.cpp runs it.

A pass feeds the uncached positions as one batch and asks for the logits of its last ``n_last``;
a rollback drops positions from llama.cpp's KV cache (``llama_memory_seq_rm``); a draft tree is one
batch whose nodes carry the sequence ids of the leaves below them (sequence 0 is the accepted text,
leaf ``j`` sequence ``j + 1``), so that each node attends to the prefix, its ancestors and itself.
llama.cpp gives no hidden states: a runner refuses ``hidden_layers`` (EAGLE heads need a torch runner).
"""
from pathlib import Path
from typing import List, Optional, Tuple

import numpy
import torch
from torch import Tensor

from runners.limits import output_vocab_size
from runners.llama_model import MAX_LEAVES, GGUFModel, gguf_model, library
from runners.trees import TreePasses

NO_HIDDEN = "llama.cpp gives no hidden states: a learned head (EAGLE) needs a torch runner, not --runner llama-cpp"


class LlamaCppRunner(TreePasses):
    """A GGUF model on llama.cpp, for one sequence: a ``runners.Runner``.

    ``runner(ids, n_last)`` returns the logits ``[n_last, V]`` (float32, CPU) of the last ``n_last``
    positions of ``ids`` ``[1, L]``, feeding llama.cpp only ``ids[:, cached:]``; ``rollback(length)``
    forgets positions ``length`` and after. ``model``: what the loops read of the target (its config,
    vocabulary and window): the torch model de-quantized from the same file when given (the programs
    have it), else the file's own ``GGUFModel``. Runners of one file share its one llama.cpp context
    (``n_ctx`` = the trained context, threads = torch's): the runner that used it last owns it, and
    one that finds another there starts again from an empty cache (re-feeding its prefix)."""

    cache_kind = "static"  # llama.cpp's KV cache is preallocated; a rollback only marks cells free
    use_cache = True  # llama.cpp always keeps its KV cache

    def __init__(self, gguf: str | Path, model: Optional[object] = None):
        self.gguf: GGUFModel = gguf_model(gguf)
        self.model = model if model is not None else self.gguf
        if model is not None and output_vocab_size(model) != self.gguf.n_vocab:
            raise ValueError(f"{type(model).__name__} has {output_vocab_size(model)} output rows, "
                             f"{Path(gguf).name} {self.gguf.n_vocab} tokens: not the same model")
        if self.gguf.encoder:
            raise ValueError(f"llama.cpp's runner decodes decoder-only models; {self.gguf.description} has an encoder")
        self.device = torch.device("cpu")
        self.context = self.gguf.context()
        self.cached = 0  # positions held by sequence 0 (after a tree pass: cur + its nodes, as slots)
        self.forward_passes = 0
        self.hidden: Optional[Tensor] = None  # never set: llama.cpp gives no hidden states
        self.hidden_start = 0
        self._leaves = 0  # sequence ids 1..leaves in use by the last tree pass (0: none)
        self._leaf_of: List[int] = []  # node -> a leaf sequence through it
        self._tree_cur = 0
        self.refeeds = 0  # rollbacks llama.cpp could not make in place: the prefix was fed again

    @property
    def hidden_layers(self) -> Tuple[int, ...]:
        """Always () : llama.cpp gives no hidden states."""
        return ()

    @hidden_layers.setter
    def hidden_layers(self, layers) -> None:
        if tuple(layers):
            raise ValueError(NO_HIDDEN)

    def __call__(self, ids: Tensor, n_last: int = 1) -> Tensor:
        self._claim()
        self._drop_tree()
        length, start = ids.shape[1], self.cached
        if length - start < n_last:
            raise RuntimeError(f"asked for {n_last} logits but only {length - start} positions are new")
        self._room(length, length - start)
        count, context = length - start, self.context
        context.tokens[:count] = ids[0, start:length].cpu().numpy()
        context.positions[:count] = numpy.arange(start, length)
        context.outputs[:count] = 0
        context.outputs[count - n_last : count] = 1
        logits = self._decode(count, n_last)
        self.cached = length
        self.forward_passes += 1
        return logits

    def rollback(self, length: int) -> None:
        """Forget the cached positions ``length`` and after (no-op when they are not cached)."""
        if self.context.owner is not self:  # another runner emptied the cache: the next pass starts over
            self.cached = min(self.cached, length)
            return
        self._drop_tree()
        if self.cached > length:
            lib = library()
            if not lib.llama_memory_seq_rm(self.context.memory, 0, length, -1):
                # a memory that cannot drop a partial range (a recurrent or hybrid model's state) keeps
                # the rejected tokens: drop the whole sequence (which never fails), and the next pass
                # feeds the accepted prefix again, so nothing is ever decoded on rejected drafts
                lib.llama_memory_seq_rm(self.context.memory, 0, -1, -1)
                self.refeeds += 1
                length = 0
            self.cached = length

    # ---- draft trees (``TreePasses``' rule): one batch, a sequence id per leaf ----------------------
    def _tree_refusal(self) -> Optional[str]:
        return self.gguf.tree_unsupported()

    def _tree_prepare(self, parents: List[int]) -> None:
        """Refuse a tree of more leaves than sequences; own the context; drop the last tree's leaves."""
        leaves = _leaves(parents)
        if len(leaves) > MAX_LEAVES:
            raise ValueError(f"a draft tree of {len(leaves)} leaves; llama.cpp's runner verifies at most {MAX_LEAVES}")
        self._claim()
        self._drop_tree()

    def _tree_run(self, ids: Tensor, start: int, cur: int, nodes: List[int], parents: List[int], depth: List[int]) -> Tensor:
        """One batch: node ``i`` at position ``cur + depth(i)`` in the sequences of the leaves below it; the
        accepted prefix is in every sequence (``llama_memory_seq_cp``, no copy of keys and values in a
        unified cache)."""
        n, leaves = len(nodes), _leaves(parents)
        count = cur - start + n
        self._room(cur + n, count)
        sequences: List[List[int]] = [[] for _ in range(n)]
        for j, leaf in enumerate(leaves):
            node = leaf
            while node >= 0:
                sequences[node].append(j + 1)
                node = parents[node]
        lib, context = library(), self.context
        for s in range(1, len(leaves) + 1):
            lib.llama_memory_seq_cp(context.memory, 0, s, -1, -1)
        prefix = cur - start
        context.tokens[:prefix] = ids[0, start:cur].cpu().numpy()
        context.tokens[prefix:count] = nodes
        context.positions[:prefix] = numpy.arange(start, cur)
        context.positions[prefix:count] = [cur + d for d in depth]
        context.outputs[:count] = 1
        context.outputs[: prefix - 1] = 0
        everyone = list(range(len(leaves) + 1))
        for k in range(count):
            self._set_sequences(k, everyone if k < prefix else sequences[k - prefix])
        self._leaves, self._tree_cur = len(leaves), cur  # dropped by the next call, whatever happens here
        try:
            logits = self._decode(count, n + 1)
        finally:
            context.seq_counts[:count] = 1
            for k in range(count):
                context.batch.seq_id[k][0] = 0
        self._leaf_of = [s[0] for s in sequences]
        self.forward_passes += 1
        return logits

    def _keep_tree_branch(self, cur: int, path: List[int]) -> bool:
        """The branch's nodes already sit at positions ``cur, cur + 1, ...``: they join sequence 0, the
        leaves' go. False where the context is another runner's now (the next pass starts over)."""
        if self.context.owner is not self or not self._leaves:
            self._leaves, self.cached = 0, min(self.cached, cur + len(path))
            return False
        if path:
            library().llama_memory_seq_cp(self.context.memory, self._leaf_of[path[-1]], 0, cur, cur + len(path))
        self._drop_tree()
        self.cached = cur + len(path)
        return True

    # ---- bookkeeping ------------------------------------------------------------------------------
    def _claim(self) -> None:
        """Own the shared context; a runner that did not own it starts from an empty cache."""
        if self.context.claim(self):
            self.cached, self._leaves = 0, 0

    def _drop_tree(self) -> None:
        """Remove the last tree pass's leaf sequences (the nodes not kept); sequence 0 then holds ``< cur``."""
        if self._leaves:
            lib = library()
            for s in range(1, self._leaves + 1):
                lib.llama_memory_seq_rm(self.context.memory, s, -1, -1)
            self._leaves = 0
            self.cached = min(self.cached, self._tree_cur)

    def _decode(self, count: int, rows: int) -> Tensor:
        """``LlamaContext.decode``; when llama.cpp fails, ``cached`` is what sequence 0 still holds."""
        try:
            return self.context.decode(count, rows)
        except RuntimeError:
            self.cached = int(library().llama_memory_seq_pos_max(self.context.memory, 0)) + 1
            raise

    def _room(self, length: int, count: int) -> None:
        """RuntimeError (one line) when ``length`` positions do not fit llama.cpp's context."""
        if length > self.context.capacity or count > self.context.capacity:
            raise RuntimeError(f"{length} positions do not fit llama.cpp's context of {self.context.capacity}")

    def _set_sequences(self, k: int, sequences: List[int]) -> None:
        """Batch token ``k`` belongs to ``sequences`` (its first one decides what it attends to)."""
        row = self.context.batch.seq_id[k]
        for t, s in enumerate(sequences):
            row[t] = s
        self.context.seq_counts[k] = len(sequences)


def _leaves(parents: List[int]) -> List[int]:
    """The tree's leaves: the nodes that are no node's parent."""
    inner = set(p for p in parents if p >= 0)
    return [i for i in range(len(parents)) if i not in inner]
