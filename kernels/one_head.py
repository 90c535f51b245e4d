"""The output layer held once (issue 71): where the C step releases a model (``kernels.one_copy``), the
output layer's weight is released too, its blocked copy (the one the step reads, ``kernels.blocked``) its
one copy; where that weight is the embedding table (tied), the embedding reads its rows from the same
blocks (``ReleasedEmbedding``: a gather of values, exact). The blocks are made in the weight's own memory
where nothing else views it (``_in_place``: a block of 16 rows lies where those rows lay), so the
release holds no second copy even for a moment; elsewhere they are a copy and the weight is freed.

Reading the output layer in place (no blocked copy) costs 7.0 against 4.95 ms a pass (c00b599): the
blocked copy is the one that stays. A restore of the output layer (``PrepackedLinear.restore``: a cast,
a load, a plan on the own layers) gives the embedding the same weight back, tied as before."""
import copy
import sys
from typing import List, Optional

import torch
from torch import Tensor, nn
from torch.nn import Module

import kernels.blocked as blocked
from kernels.blocked import BLOCK, DTYPES, _memory, pack, unblocked, unpack, unpack_in_place, unreleased  # noqa: F401 (unblocked, unreleased: importable here too)
from kernels.prepacking import PrepackedLinear



class ReleasedEmbedding(nn.Embedding):
    """An ``nn.Embedding`` whose table is a released output layer's blocks (``[ceil(V/16), H, 16]``, float32
    or bfloat16): made so by swapping the class of the model's own embedding (``release_head``), so that
    whoever holds the module (an EAGLE head, a hook) keeps it. ``weight`` unblocks a temporary ``[V, H]``
    at each read; ``forward`` gathers the rows asked, bit for bit the table's."""

    blocks: Tensor
    head: List[PrepackedLinear]  # the output layer it shares the blocks with (a list: no submodule)

    @property
    def weight(self) -> Tensor:
        return unpack(self.blocks, self.num_embeddings)

    def forward(self, ids: Tensor) -> Tensor:
        """``ids`` (any shape, int64) -> ``[*ids.shape, H]``, the table's rows (row n: block n // 16, lane n % 16)."""
        flat = ids.reshape(-1)
        blocks = self.blocks
        if flat.shape[0] == 1:  # decoding's one id: indexed by Python ints, no index tensors made (a copy, as below)
            block, lane = divmod(int(flat[0]), BLOCK)
            pairs = blocks.dtype == torch.bfloat16
            row = _memory(blocks, True)[block, :, lane, :] if pairs else blocks[block, :, lane]
            return row.clone().reshape(*ids.shape, self.embedding_dim)
        if blocks.dtype == torch.bfloat16:  # ``[b, H/2, 16, 2]`` in memory: pairs of features side by side
            rows = _memory(blocks, True)[flat // BLOCK, :, flat % BLOCK, :].reshape(flat.shape[0], -1)
        else:
            rows = blocks[flat // BLOCK, :, flat % BLOCK]
        return rows.reshape(*ids.shape, self.embedding_dim)

    def _restore(self) -> None:
        self.head[0]._restore_owner()  # the model's layers, this table among them (``PrepackedLinear.restore``)

    def _apply(self, fn, recurse=True):
        self._restore()
        return nn.Embedding._apply(self, fn, recurse)  # now a plain embedding again

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self._restore()
        return nn.Embedding._load_from_state_dict(self, state_dict, prefix, *args, **kwargs)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "weight"] = self.weight
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def __deepcopy__(self, memo: dict) -> nn.Embedding:
        """A plain embedding with its own weight, the one the copied output layer gets (``unblocked``)."""
        made = nn.Embedding.__new__(nn.Embedding)
        made.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items() if k not in ("blocks", "head")})
        made._parameters["weight"] = unblocked(self.blocks, self.num_embeddings, memo)
        return made


def release_head(model: Module) -> bool:
    """Release ``model``'s output layer (a ``PrepackedLinear``, float32 or bfloat16, on CPU): its blocked
    copy its one copy, and a tied embedding's (a plain ``nn.Embedding``) too; whether it is released now.
    Not where another module or a caller holds its weight, nor a tied table that renormalizes."""
    head = model.get_output_embeddings()
    if type(head) is not PrepackedLinear:
        return False
    if head.blocks is not None:
        return True
    weight = head.linear[0].weight
    if weight is None or weight.dtype not in DTYPES or weight.device.type != "cpu" or weight.dim() != 2 or \
            weight.dtype == torch.bfloat16 and weight.shape[1] % 2:
        return False
    embedding = model.get_input_embeddings()
    tied = type(embedding) is nn.Embedding and embedding.weight is weight and embedding.max_norm is None
    from kernels.file_pages import _drop_pages, _file_mappings

    holders = _holders(model, weight)
    if holders != 2 + tied:  # another module (or a tied table we do not take) reads it
        return False
    blocks, spans = _in_place(weight, holders), []
    if blocks is None:  # a copy: the weight's pages given back where it was read from a file (``kernels.file_pages._drop_pages``)
        blocks = pack(weight)
        spans = [(weight.data_ptr(), weight.data_ptr() + weight.numel() * weight.element_size(), weight.untyped_storage())]
    del weight
    head.release(blocks, model)
    if tied:
        embedding._parameters["weight"] = None
        embedding.__class__ = ReleasedEmbedding
        embedding.blocks, embedding.head = blocks, [head]
        head.tied = [embedding]
    _drop_pages(spans, _file_mappings() if spans else [])
    return True


def _holders(model: Module, weight: Tensor) -> int:
    """How many parameter slots of ``model``'s modules (a ``PrepackedLinear``'s own layer included) hold ``weight``."""
    found = 0
    for module in model.modules():
        for owner in (module, *(module.linear if type(module) is PrepackedLinear else ())):
            found += sum(p is weight for p in owner._parameters.values())
    return found


def _in_place(weight: Tensor, holders: int) -> Optional[Tensor]:
    """``weight``'s blocks written over its own memory, a view of it (``[N/16, K, 16]``), or None where that
    could change what another reads or cannot be: N not a multiple of 16 (the last block is padded),
    a weight not alone in its storage, viewed by another tensor, held by a caller (Python references
    beyond the model's ``holders`` slots), or in memory this process cannot write (a read-only mapping)."""
    n, k = weight.shape
    storage = weight.untyped_storage()
    alone = weight.is_contiguous() and weight.storage_offset() == 0 and storage.nbytes() == weight.numel() * weight.element_size()
    count = getattr(torch._C, "_storage_Use_Count", None)
    viewed = count is None or count(storage._cdata) != 2  # the weight's one tensor and this handle
    # the model's slots, this function's argument, its caller's name and getrefcount's own
    if n % BLOCK or not alone or viewed or sys.getrefcount(weight) != holders + 3 or not _writable(storage):
        return None
    del storage
    flat = weight.detach().view(-1)
    for start in range(0, n, blocked.IN_PLACE_ROWS):  # each chunk's blocks lie where its rows did: read them first
        rows = weight.detach()[start: start + blocked.IN_PLACE_ROWS].clone()
        pack(rows, flat[start * k: (start + rows.shape[0]) * k].view(rows.shape[0] // BLOCK, k, BLOCK))
        del rows  # freed before the next chunk's is made: one chunk held at a time
    return flat.view(n // BLOCK, k, BLOCK)


def _writable(storage: torch.UntypedStorage) -> bool:
    """Whether ``storage``'s bytes lie in one writable mapping of this process (``/proc/self/maps``)."""
    start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    try:
        lines = open("/proc/self/maps").read().splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        lo, hi = (int(a, 16) for a in fields[0].split("-"))
        if lo <= start < hi:
            return "w" in fields[1] and end <= hi
    return False


__all__ = ["ReleasedEmbedding", "release_head", "unblocked", "unreleased"]
