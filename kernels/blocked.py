"""Weights blocked once for the skinny kernel: an ``nn.Linear`` weight ``[N, K]`` as ``[ceil(N/16), K, 16]``
(16 output features per block, one 64-byte line per input feature; ``kernels/skinny_gemm.c``).

One copy per weight, shared by everything that runs on it: the layer's own skinny route
(``kernels.prepacking.PrepackedLinear``) and the C step (``kernels.c_step``), which reads q/k/v as one
matrix and gate/up as another. ``fused(weights)`` lays several weights' blocks end to end in one
tensor and keeps each weight's blocks as a view of it, so fusing costs no second copy. A copy is
remade when its weight changes in place (its version) or is replaced (its address); an edit through
``w.data``, which changes no version, is seen where a copy is verified (``verify``: when a C step or
a C head step is made, at a runner's first pass on it), not per call.

The copies are keyed weakly by their weight, and a copy holds nothing of it: they go with the weight.
"""
import contextlib
import sys
import weakref
from typing import Callable, Dict, Iterator, Optional, Sequence, Tuple

import torch
from torch import Tensor

BLOCK = 16  # output features per block (skinny_gemm.c's BW)
Check = Callable[[Tensor, Tensor], bool]  # whether a blocked copy holds a weight's values now (``holds``)
DTYPES = (torch.float32, torch.bfloat16)  # the weights blocked (bfloat16: for skinny_bf16.c)

class _ByTensor:
    """A dict keyed by tensors themselves (not by value: a tensor's ``==`` is elementwise), whose
    entries go when their tensor does."""

    def __init__(self):
        self.entries: Dict[int, Tuple["weakref.ref[Tensor]", object]] = {}

    def get(self, tensor: Tensor):
        found = self.entries.get(id(tensor))
        return found[1] if found is not None and found[0]() is tensor else None

    def __setitem__(self, tensor: Tensor, value) -> None:
        key = id(tensor)
        self.entries[key] = (weakref.ref(tensor, lambda _, key=key: self.entries.pop(key, None)), value)

    def __getitem__(self, tensor: Tensor):
        return self.get(tensor)

    def pop(self, tensor: Tensor, default=None):
        return self.entries.pop(id(tensor), (None, default))[1] if self.get(tensor) is not None else default


# weight -> (its identity when blocked, the blocked copy or a view into a fused one)
_COPIES = _ByTensor()
# first weight of a fused group -> (the group's identities, the fused blocks)
_FUSED = _ByTensor()


@contextlib.contextmanager
def lasting() -> Iterator[None]:
    """A block whose tensors outlive it beside a model (blocked copies, released and restored weights, a C
    step's own tensors): made as normal tensors, without autograd, inside ``torch.inference_mode`` too
    (where a notebook's first ``generate`` makes them). An inference tensor would break what keeps them:
    its views name no ``_base`` (a fused group's members would not find their group, ``group_blocks``),
    it counts no versions (``_version`` raises: ``_identity``, ``kernels.c_step.read``), and outside the
    mode it cannot be written in place (a restore unblocks in place, ``unpack_in_place``).
    ``inference_mode(False)`` turns gradients on: ``no_grad`` turns them off again."""
    with torch.inference_mode(False), torch.no_grad():
        yield


def _identity(weight: Tensor) -> tuple:
    return weight.data_ptr(), weight._version, tuple(weight.shape)


def pack(weight: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """``weight`` ``[N, K]`` float32 -> ``[ceil(N/16), K, 16]``, the features past N zero; written into
    ``out`` (of that shape) where given. No temporary of the weight's size: the full blocks are copied
    from a strided view of it, a last partial block through one block's zeros. A bfloat16 weight (K
    even) is blocked alike, bfloat16, its pairs of input features interleaved (``_memory``)."""
    n, k = weight.shape
    blocks, full, pairs = -(-n // BLOCK), n // BLOCK, weight.dtype == torch.bfloat16
    out = torch.empty((blocks, k, BLOCK), dtype=weight.dtype) if out is None else out
    weight = weight.detach()
    _memory(out[:full], pairs).copy_(_logical(weight[: full * BLOCK].view(full, BLOCK, k).transpose(1, 2), pairs))
    if full < blocks:
        tail = torch.zeros((BLOCK, k), dtype=weight.dtype)
        tail[: n - full * BLOCK] = weight[full * BLOCK :]
        _memory(out[full : full + 1], pairs).copy_(_logical(tail.t()[None], pairs))
    return out


def _memory(blocks: Tensor, pairs: bool) -> Tensor:
    """Contiguous ``blocks`` ``[b, K, 16]`` in the order of their memory: as they are (float32), or, with
    ``pairs`` (bfloat16), ``[b, K/2, 16, 2]``: input features 2q and 2q + 1 of output feature j side by
    side, one 32-bit lane (``skinny_bf16.c``)."""
    return blocks.view(blocks.shape[0], blocks.shape[1] // 2, BLOCK, 2) if pairs else blocks


def _logical(view: Tensor, pairs: bool) -> Tensor:
    """A weight's blocks as ``[b, K, 16]`` (element ``[b, k, j]``: output ``16 b + j``, input ``k``) in
    ``_memory``'s order: ``[b, K/2, 16, 2]`` with ``pairs``, else as they are."""
    return view.unflatten(1, (view.shape[1] // 2, 2)).transpose(2, 3) if pairs else view


def unpack(blocks: Tensor, n: int) -> Tensor:
    """``pack``'s inverse: ``blocks`` ``[ceil(n/16), K, 16]`` -> a new ``[n, K]`` weight, the same values."""
    if blocks.dtype == torch.bfloat16:
        blocks = _memory(blocks, True).transpose(2, 3).reshape(blocks.shape)
    return blocks.transpose(1, 2).reshape(-1, blocks.shape[1])[:n].contiguous()  # one block: reshape gives a view


IN_PLACE_ROWS = 1024  # rows a release or restore moves in place at a time: the one temporary (6 MB at 1,536 features)


def unpack_in_place(blocks: Tensor, n: int, chunk_rows: int = 1024) -> Tensor:
    """``unpack`` written over ``blocks``' own memory: ``[ceil(n/16), K, 16]`` (contiguous) -> a ``[n, K]``
    view of the same storage, the same values bit for bit. Block b holds rows 16b..16b+15, which lie in
    the same bytes of ``[N, K]`` as the block does, so a chunk of blocks is copied to a scratch of at
    most ``chunk_rows`` rows and written back transposed: no second copy of the weight, ever. The caller
    makes sure nothing reads ``blocks`` afterwards (they hold rows now)."""
    b, k = blocks.shape[0], blocks.shape[1]
    flat, pairs, per = blocks.view(-1), blocks.dtype == torch.bfloat16, max(chunk_rows // BLOCK, 1)
    for start in range(0, b, per):
        part = blocks[start : start + per].clone()  # the one scratch, freed before the next chunk's is made
        rows = flat[start * BLOCK * k : (start + part.shape[0]) * BLOCK * k].view(part.shape[0], BLOCK, k)
        if pairs:  # ``[b, K/2, 16, 2]`` in memory -> ``[b, 16, K/2, 2]``: row j's pairs of features in order
            rows.view(part.shape[0], BLOCK, k // 2, 2).copy_(_memory(part, True).permute(0, 2, 1, 3))
        else:
            rows.copy_(part.transpose(1, 2))
        del part
    return flat[: n * k].view(n, k)


def unblocked(blocks: Tensor, n: int, memo: dict) -> torch.nn.Parameter:
    """A copy's own weight ``[n, K]`` from released ``blocks``: one per blocks in a ``copy.deepcopy``
    (``memo``), so that a copied tied pair is tied again."""
    key = ("specdec-unblocked", id(blocks))  # no id of an object: never what deepcopy keys an object by
    if key not in memo:
        memo[key] = torch.nn.Parameter(unpack(blocks, n), requires_grad=False)
    return memo[key]


def holds(blocks: Tensor, weight: Tensor) -> bool:
    """Whether ``blocks`` (``pack``'s layout) holds ``weight``'s ``[N, K]`` values now, bit for bit. Read
    in place, both once (no temporary), in torch (strided, one thread; ``kernels.skinny.holds``: in C)."""
    if blocks.dtype != weight.dtype:
        return False
    n, k = weight.shape
    full, pairs = n // BLOCK, weight.dtype == torch.bfloat16
    bits = torch.int16 if pairs else torch.int32  # bits: -0.0 and NaN compare as written
    ours, theirs = blocks.view(bits), weight.detach().view(bits)
    if not torch.equal(_memory(ours[:full], pairs), _logical(theirs[: full * BLOCK].view(full, BLOCK, k).transpose(1, 2), pairs)):
        return False
    if full == ours.shape[0]:
        return True
    cut = n - full * BLOCK
    return torch.equal(_memory(ours[full : full + 1], pairs)[..., :cut, :] if pairs else ours[full, :, :cut],
                       _logical(theirs[full * BLOCK :].t()[None], pairs) if pairs else theirs[full * BLOCK :].t())


def blocked(weight: Tensor, verify: Optional[Check] = None) -> Tensor:
    """The blocked copy of ``weight`` (made now if it has none, or if it changed since). ``verify``:
    compare the copy's values with the weight's too by this check (``holds``, or the C one,
    ``kernels.skinny.holds``), for the edits that change no version
    (through ``w.data``), at the points where that is worth a read of the weight: where a C step or a C
    head step is made (a runner's first pass), never per pass."""
    found = _COPIES.get(weight)
    if found is not None and found[0] == _identity(weight) and (verify is None or verify(found[1], weight)):
        return found[1]
    with lasting():  # kept for later calls, in or out of inference mode (only the making: no cost on a hit)
        made = pack(weight)
    _COPIES[weight] = (_identity(weight), made)
    return made


def fused(weights: Sequence[Tensor], verify: Optional[Check] = None) -> Tensor:
    """The blocks of ``weights`` (each ``[N_i, K]``, the same K) end to end, ``[sum N_i / 16, K, 16]``:
    one sweep of the skinny kernel computes all their outputs, concatenated. Each weight's own copy
    becomes a view of it, so fusing costs no second copy. Every N_i but the last must be a multiple
    of 16, else a block would mix two weights' features (``fusable``). ``verify``: ``blocked``'s."""
    if not fusable(weights):
        raise ValueError("fused weights need the same input size and all but the last a multiple of 16 outputs")
    identities = tuple(_identity(w) for w in weights)
    found = _FUSED.get(weights[0])
    sizes = [-(-w.shape[0] // BLOCK) for w in weights]
    if found is not None and found[0] == identities and (verify is None or all(verify(part, w) for part, w in zip(found[1].split(sizes), weights))):
        return found[1]
    with lasting():  # each member's view names ``whole`` as its ``_base`` (``kernels.one_copy.group_blocks``)
        whole = torch.empty((sum(sizes), weights[0].shape[1], BLOCK), dtype=weights[0].dtype)
        start = 0
        for w, blocks in zip(weights, sizes):
            _COPIES[w] = (_identity(w), pack(w, whole[start : start + blocks]))  # packed in place: no second copy
            start += blocks
    _FUSED[weights[0]] = (identities, whole)
    return whole


def fusable(weights: Sequence[Tensor]) -> bool:
    """Whether ``fused`` takes ``weights``: float32 or bfloat16 (an even input size), all one dtype, on CPU,
    one input size, all but the last a multiple of 16 outputs."""
    return all(w.dtype in DTYPES and w.dtype == weights[0].dtype and w.device.type == "cpu" and w.dim() == 2 for w in weights) and \
        len({w.shape[1] for w in weights}) == 1 and all(w.shape[0] % BLOCK == 0 for w in weights[:-1]) and \
        (weights[0].dtype != torch.bfloat16 or weights[0].shape[1] % 2 == 0)


def forget(weights: Sequence[Tensor]) -> None:
    """Free the blocked copies of ``weights`` (a plan that no longer runs the skinny kernel)."""
    for w in weights:
        _COPIES.pop(w, None)
        _FUSED.pop(w, None)


def unreleased(layer: "PrepackedLinear") -> Tensor:  # noqa: F821 (kernels.prepacking, not imported: it imports this)
    """A released ``layer``'s own weight ``[N, K]`` again (``PrepackedLinear.restore``): unblocked over its
    blocks' own memory (``unpack_in_place``: a switch away from the skinny kernel holds no second copy of
    the output layer, issue 71) where nothing else reads them: no Python reference to them but the layer's
    and its tied embedding's, no other tensor on their storage (a fused group's members share one: those
    are unblocked into new memory, ``unpack``, one group twice at most: a member's weight would keep the
    whole group's storage). The values are the blocks', bit for bit."""
    blocks = layer.blocks
    count = getattr(torch._C, "_storage_Use_Count", None)
    storage = blocks.untyped_storage()
    whole = blocks.storage_offset() == 0 and storage.nbytes() == blocks.numel() * blocks.element_size()
    # the storage's tensors: the blocks and the tensor they view (an in-place release's weight), and this handle
    others = not whole or count is None or count(storage._cdata) != 2 + (blocks._base is not None)
    del storage
    # the layer's and a tied embedding's attributes, this name and getrefcount's own
    if others or not blocks.is_contiguous() or sys.getrefcount(blocks) != 3 + (layer.tied is not None):
        return unpack(blocks, layer.out_features)
    return unpack_in_place(blocks, layer.out_features, IN_PLACE_ROWS)
