"""The pages of freed weights given back where they lie in a file mapping (a model loaded from float32
safetensors maps the file: freeing a weight unmaps nothing)."""
import ctypes
import mmap
from typing import List, Optional, Sequence, Tuple

import torch
from torch import UntypedStorage


def _file_mappings() -> List[Tuple[int, int]]:
    """The address ranges of this process's private file mappings (``/proc/self/maps``; [] elsewhere)."""
    try:
        lines = open("/proc/self/maps").read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1].endswith("p") and fields[4] != "0" and fields[5].startswith("/"):
            start, end = (int(a, 16) for a in fields[0].split("-"))
            found.append((start, end))
    return found


def _drop_pages(spans: Sequence[Tuple[int, int, UntypedStorage]], files: Sequence[Tuple[int, int]]) -> None:
    """Give back the pages of freed weights (``spans``: each weight's bytes ``[start, end)`` and its
    storage) that lie in a file mapping. A model loaded from float32 safetensors holds its weights as
    views of a mapping of the file, which stays mapped while any tensor reads it: freeing a weight
    unmaps nothing, and the pages its blocking read stay resident. Only pages wholly inside a weight
    whose storage no tensor views any more (``unviewed``: not the Parameter's weakref, since another
    model loaded with ``assign=True``, or a state dict, views the same pages), and only in a private
    file mapping (never the allocator's memory): read again, they would come from the file, and
    pages this process wrote would lose what it wrote."""
    libc = _libc()
    if libc is None:
        return
    page = mmap.PAGESIZE
    for start, end, storage in spans:
        if not unviewed(storage) or not any(lo <= start and end <= hi for lo, hi in files):
            continue
        first, last = -(-start // page) * page, end // page * page
        if last > first:
            libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), MADV_DONTNEED)


MADV_DONTNEED = 4  # Linux's


def unviewed(storage: UntypedStorage) -> bool:
    """Whether no tensor views ``storage`` (the caller's handle holds it once); False where this torch
    cannot count its holders (then no page is given back)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return count is not None and count(storage._cdata) == 1


def _libc() -> Optional[ctypes.CDLL]:
    try:
        return ctypes.CDLL(None, use_errno=True) if hasattr(ctypes.CDLL(None), "madvise") else None
    except OSError:
        return None
