"""Bytes held in torch's CPU allocator, counted from its own allocation events (torch's profiler with
``profile_memory``): every CPU tensor's storage and oneDNN's packed weights (ideep allocates through
torch's CPU allocator) as each is made and freed, in order. Not the resident set: no page cache, no
allocator slack, no noise. A file safetensors maps (transformers' own load) counts as one block, whole,
from its mapping until its last tensor goes (torch reports the mapping; ``utils.tensor_load`` loads
without one).

Only allocations made inside the block are counted, and their frees (by address): a tensor made
before the block and freed inside it never shows. Only this thread's: a Python thread's allocations
(transformers' loading pool casting a file's tensors) are not seen. Make what is to be counted (the
model) inside it; ``Held.part`` names a stretch of it (the start after the model is made)."""
import bisect
import contextlib
import gc
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Tuple

import torch

_PART = "counted::"  # the profiler ranges ``Held.part`` opens


@dataclass
class Held:
    """What ``counted`` saw, in bytes from the start of the block (0): ``peak`` the most held at once,
    ``end`` what was still held at its end, ``trace`` (time in ns, bytes held) after each allocation or
    free, in order, and ``parts`` the most held within each stretch ``part`` named."""

    peak: int = 0
    end: int = 0
    trace: List[Tuple[int, int]] = field(default_factory=list)
    parts: Dict[str, int] = field(default_factory=dict)

    def part(self, name: str):
        """A stretch of the block whose peak ``parts[name]`` gives (read after the block)."""
        return part(name)


def part(name: str):
    """A stretch of a ``counted`` block, named: its ``Held.parts[name]`` is the most held within it (the most
    over every stretch of that name), made where the ``Held`` is out of reach (a wrapped function)."""
    return torch.profiler.record_function(_PART + name)


@contextlib.contextmanager
def counted() -> Iterator[Held]:
    """Count the CPU bytes held by the allocations made within the block; read the ``Held`` after it."""
    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    held = Held()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recorder:
        yield held
    _count(held, recorder.profiler.kineto_results.experimental_event_tree())


def _count(held: Held, tree) -> None:
    """Fill ``held`` from the profiler's event tree: each CPU allocation and free in time order (a free
    counted only where its block's making was), then each named stretch's peak."""
    allocations, stretches = _events(tree)
    made, now = set(), 0
    for start, ptr, size in sorted(allocations, key=lambda row: row[0]):  # stable: ties keep their order
        if size > 0:
            made.add(ptr)
        elif ptr in made:  # a free of a block made before the block is not counted (its making was not)
            made.discard(ptr)
        else:
            continue
        now += size
        held.trace.append((start, now))
    held.peak, held.end = max((b for _, b in held.trace), default=0), now
    times = [t for t, _ in held.trace]
    for name, start, end in stretches:
        first, last = bisect.bisect_left(times, start), bisect.bisect_right(times, end)
        before = [held.trace[first - 1][1]] if first else []  # what the stretch starts with
        peak = max(before + [b for _, b in held.trace[first:last]], default=0)
        held.parts[name] = max(peak, held.parts.get(name, 0))  # a stretch named twice (each model's): the most of both


def _events(tree) -> Tuple[List[Tuple[int, int, int]], List[Tuple[str, int, int]]]:
    """One walk of the event tree (parents before children, in order): ``(start ns, address, bytes)`` of
    each CPU allocation (bytes < 0: a free) and ``(name, start ns, end ns)`` of each ``part``. Reads each
    event's kind by its tag and its fields once: a start-up's ~300k events took seconds through ``typed``."""
    from torch._C._profiler import _EventType

    allocation, allocations, stretches = _EventType.Allocation, [], []
    stack = list(reversed(tree))
    while stack:
        event = stack.pop()
        if event.tag == allocation:
            extra = event.extra_fields
            if extra.device.type == "cpu":
                allocations.append((event.start_time_ns, extra.ptr, extra.alloc_size))
        elif event.name.startswith(_PART):
            stretches.append((event.name[len(_PART):], event.start_time_ns, event.end_time_ns))
        stack.extend(reversed(event.children))
    return allocations, stretches


def tensor_bytes(*tensors: torch.Tensor) -> int:
    """Bytes of the distinct storages behind ``tensors`` (each storage once, by address)."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())
