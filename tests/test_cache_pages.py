"""A KV cache and its kept key blocks on mappings of their own asked onto 2 MB pages (kernels/huge_pages.py's
``empty``, from runners/lean.py and kernels/kept_keys.py): the tensor 2 MB-aligned, writable, on huge pages where
Linux grants them, its mapping gone with it, ``torch.empty`` where off or small; and a runner's logits through
decoding, rollbacks, a tree's branch and a fresh prompt the same bits on its own mappings as on torch's memory
(only the pages differ)."""
import gc

import pytest
import torch

from conftest import llama
from kernels import huge_pages, skinny
from kernels.huge_pages import HUGE
from runners import LeanRunner
from test_huge_pages import granted_here, huge_kb_over
from test_kept_keys import scenario


def mapped(address: int) -> bool:
    """Whether a mapping of this process holds ``address`` (/proc/self/maps)."""
    for line in open("/proc/self/maps"):
        low, high = (int(x, 16) for x in line.split()[0].split("-"))
        if low <= address < high:
            return True
    return False


def test_a_cache_tensor_lies_on_its_own_aligned_mapping_and_goes_with_it(monkeypatch):
    monkeypatch.setattr(huge_pages, "CACHE", True)  # off by default (kernels/huge_pages.py says why)
    t = huge_pages.empty((3, 1, 2, 4096, 64))  # 6 MB
    assert t.shape == (3, 1, 2, 4096, 64) and t.dtype == torch.float32 and t.is_contiguous()
    assert t.data_ptr() % HUGE == 0 and t._base is not None  # a view of its mapping, not torch's allocation
    t.fill_(1.5)
    views = t.unbind(0)  # models.llama.new_cache's layers: views of one tensor (kernels.kept_keys reads its version)
    assert all(v._base is views[0]._base for v in views) and float(views[2].sum()) == 1.5 * views[2].numel()
    address = t.data_ptr()
    assert mapped(address)
    del t, views
    gc.collect()
    assert not mapped(address)  # unmapped with its last view: no cache outlives its runner


@pytest.mark.skipif(not granted_here(), reason="no transparent huge pages here (Linux 6.1+, THP not off)")
def test_a_cache_tensor_written_is_on_huge_pages(monkeypatch):
    monkeypatch.setattr(huge_pages, "CACHE", True)
    t = huge_pages.empty(((8 << 20) // 4,))
    t.fill_(0.25)
    assert huge_kb_over(t.data_ptr(), t.data_ptr() + t.numel() * 4) >= 2 * HUGE // 1024  # the kernel may lack a few pages


def test_off_or_under_a_page_it_is_torch_empty(monkeypatch):
    monkeypatch.setattr(huge_pages, "CACHE", True)
    assert huge_pages.empty((16, 64))._base is None
    monkeypatch.setattr(huge_pages, "CACHE", False)
    assert huge_pages.empty((3, 1, 2, 4096, 64))._base is None


@pytest.mark.needs_cc
@pytest.mark.skipif(not skinny.available()[0], reason="the skinny kernel is not built here")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_runner_on_its_own_mappings_gives_the_bits_of_one_on_torch_memory(dtype, monkeypatch):
    """The tiny model's cache is under 2 MB: a page of 4 KB stands in for it, so its every tensor takes the mapping path."""
    model = llama().to(dtype)
    with torch.no_grad():
        LeanRunner(model)(torch.arange(20)[None], 1)
    results, made = {}, []
    real = huge_pages.empty
    monkeypatch.setattr(huge_pages, "empty", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    for on in (False, True):
        monkeypatch.setattr(huge_pages, "CACHE", on)
        monkeypatch.setattr(huge_pages, "HUGE", 4096 if on else HUGE)
        made.clear()
        with torch.no_grad():
            results[on] = scenario(model, [])
        assert made and all((t._base is not None) == on for t in made)  # the caches (and blocks) on mappings, or not
    assert all(torch.equal(a, b) for a, b in zip(results[False], results[True]))
