"""The C step's weights moved onto 2 MB pages (kernels/huge_pages.py, from kernels/one_copy.release): spans joined
into runs where they lie end to end, only whole 2 MB pages inside a run asked for (never a page partly another
allocation's), the bytes unchanged, and where Linux grants transparent huge pages, a released model's blocked
copies on them."""
import platform
from pathlib import Path

import pytest
import torch

from kernels import huge_pages
from kernels.huge_pages import GAP, HUGE, collapse, runs

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def granted_here() -> bool:
    """Whether this machine can grant them: Linux with transparent huge pages not off (MADV_COLLAPSE: 6.1+)."""
    if platform.system() != "Linux" or not THP.exists() or "[never]" in THP.read_text():
        return False
    major, minor = (int(p) for p in platform.release().split(".")[:2])
    return (major, minor) >= (6, 1)


def test_spans_join_into_runs_where_they_lie_end_to_end():
    assert runs([(1000, 100), (0, 1000), (2 * GAP, 10), (2 * GAP + 20, 5), (3 * GAP + 100, 1)]) == \
        [(0, 1100), (2 * GAP, 2 * GAP + 25), (3 * GAP + 100, 3 * GAP + 101)]  # under GAP apart: one run
    assert runs([(0, 10), (5, 100), (0, 3)]) == [(0, 105)]  # overlapping and nested spans
    assert runs([]) == []


def test_only_whole_pages_inside_a_run_are_asked_for(monkeypatch):
    """madvise sees 2 MB-aligned ranges within the runs only (a page partly another allocation's is left)."""
    asked = []

    class Libc:
        def madvise(self, start, size, advice):
            asked.append((start, size, advice))
            return 0

    monkeypatch.setattr(huge_pages, "_libc", lambda: Libc())
    assert collapse([(HUGE + 5, 3 * HUGE), (10 * HUGE, HUGE - 1)], on=True) == 2 * HUGE
    assert collapse([(HUGE + 5, 3 * HUGE)], on=False) == 0 and len(asked) == 2  # off: nothing asked
    assert asked == [(2 * HUGE, 2 * HUGE, huge_pages.MADV_HUGEPAGE), (2 * HUGE, 2 * HUGE, huge_pages.MADV_COLLAPSE)]


def huge_kb_over(start: int, end: int) -> int:
    """AnonHugePages (KB) of this process's mappings that overlap ``[start, end)`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low < end and start < high
        elif inside and line.startswith("AnonHugePages:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not granted_here(), reason="no transparent huge pages here (Linux 6.1+, THP not off)")
def test_a_tensor_keeps_its_bytes_on_huge_pages():
    """16 MB collapsed: granted (at least 6 of its whole pages: the kernel may lack a few free ones), the granted
    bytes on huge pages in the tensor's own mappings afterwards (not the process's whole count: memory reused from
    freed huge pages may hold some already), the values the same."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4 << 20, generator=g)
    held = x.clone()
    granted = collapse([(x.data_ptr(), x.numel() * 4)], on=True)
    assert 6 * HUGE <= granted <= x.numel() * 4
    assert huge_kb_over(x.data_ptr(), x.data_ptr() + x.numel() * 4) >= granted // 1024
    assert torch.equal(x, held)
