"""A C step's weights on huge pages (Linux's transparent 2 MB pages), where the kernel grants them.

A pass streams every weight once, some 538 MB for SmolLM2-135M in float32: on 4 KB pages that is a TLB miss
and a page walk every 4 KB of each stream, 131,000 a pass. ``collapse`` asks the kernel to back the weights
with 2 MB pages (``madvise(MADV_COLLAPSE)``, Linux 6.1+, synchronous; ``MADV_HUGEPAGE`` first, so that the
range stays eligible), over the whole 2 MB pages inside each run of the weights' bytes: the blocked copies are
made one after another and mostly lie end to end, so a run covers many of them, and a page only partly theirs
is left as it is (collapsing it would make resident what the allocator left untouched). Moves only: the same
bytes at the same addresses, so the same bits; where the kernel refuses (an older kernel, THP off, no free
2 MB page, a file mapping) the weights stay on 4 KB pages and nothing else changes."""
import ctypes
import errno
import math
import mmap
from typing import Iterable, List, Optional, Tuple

import torch

HUGE = 2 << 20  # bytes of a transparent huge page on x86-64 and (4 KB-page) arm64
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25  # Linux's
GAP = 64 << 10  # bytes between two spans that still join them into one run (the allocator's headers, alignment)
# Off by default, so a release (``kernels.one_copy``) asks for nothing: with it on, a second start in one process
# held 1.18x its bfloat16 weights by torch's allocator count instead of 1.085x (tests/test_startup_memory.py; the
# cause not found, 2026-11-30), and no quiet run has shown a pass faster for it. ``kernels.huge_pages.ON = True``
# before a model's step is made turns it on; ``scripts/pass_read.py --huge`` times a copy collapsed explicitly
# (``on=True``) against the model's own.
ON = False
# A KV cache and its kept key blocks made on 2 MB pages (``empty``): a long context's attention reads every layer's
# keys and values each pass (37 MB at 800 slots for SmolLM2-135M), and on 4 KB pages that read, and the attention,
# ran slower on one thread (docs/runners.md, scripts/cache_pages.py). Each tensor on its own fresh mapping: memory
# glibc reused from an earlier cache was already touched on 4 KB pages, which MADV_HUGEPAGE alone never changes.
# Off by default: on two threads, quiet, it gained nothing at 800 slots and 0-3% at 2000, while each new cache faults
# in whole 2 MB pages (1-10 ms a cache, the machine's compaction stalls included), which short generate calls paid:
# prompt lookup 2-4% slower on the embedded model in float32, 16% in bfloat16 (docs/results.md, eighth session).
# True: on 2 MB pages.
CACHE = False


def runs(spans: Iterable[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """The spans ``(address, bytes)`` joined where less than GAP apart: ``[start, end)`` runs, in address order."""
    joined: List[Tuple[int, int]] = []
    for start, size in sorted(spans):
        if joined and start - joined[-1][1] < GAP:
            joined[-1] = (joined[-1][0], max(joined[-1][1], start + size))
        else:
            joined.append((start, start + size))
    return joined


def _libc() -> Optional[ctypes.CDLL]:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def collapse(spans: Iterable[Tuple[int, int]], on: Optional[bool] = None) -> int:
    """Back the whole 2 MB pages inside the runs of ``spans`` ``(address, bytes)`` with huge pages where the kernel
    grants them; returns the bytes it granted (0 where it refused every one, or off Linux). ``on``: ``ON`` unless given."""
    libc, granted = _libc(), 0
    if libc is None or not (ON if on is None else on):
        return 0
    for start, end in runs(spans):
        first, last = -(-start // HUGE) * HUGE, end // HUGE * HUGE
        if last <= first:
            continue
        libc.madvise(first, last - first, MADV_HUGEPAGE)  # eligible (THP "madvise"); refused where THP is off
        if libc.madvise(first, last - first, MADV_COLLAPSE) == 0:
            granted += last - first
        elif ctypes.get_errno() != errno.EINVAL:  # some page refused (no free 2 MB page): the others one by one
            granted += sum(HUGE for page in range(first, last, HUGE) if libc.madvise(page, HUGE, MADV_COLLAPSE) == 0)
        # EINVAL: no collapse here (Linux before 6.1, THP off) or a file mapping's run (a weight blocked in place)
    return granted


def empty(shape: Tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialized CPU tensor of ``shape`` on a mapping of its own, 2 MB-aligned and asked onto 2 MB pages
    (MADV_HUGEPAGE: each page granted as it is first written, so untouched capacity stays unresident); the mapping
    goes with the tensor (it holds the mmap). ``torch.empty`` where ``CACHE`` is off, under 2 MB, or refused."""
    size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    libc = _libc()
    if not CACHE or size < HUGE or libc is None or not hasattr(mmap, "MAP_ANONYMOUS"):
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), dtype=torch.uint8)  # untouched
    skip = -raw.data_ptr() % HUGE
    libc.madvise(raw.data_ptr() + skip, size // HUGE * HUGE, MADV_HUGEPAGE)  # refused (THP off): 4 KB pages, the same bytes
    return raw[skip : skip + size].view(dtype).view(shape)
