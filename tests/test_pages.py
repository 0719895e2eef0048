"""Huge pages for the token arena's block: advice only (values, shapes and devices unchanged), taken by
Linux where its transparent huge pages are on for the asking (``madvise`` mode), and asked for by
every block the arena makes on the CPU (its first, a grown one, a compacted one)."""
import re
from pathlib import Path

import pytest
import torch

from torchmover._internal import pages
from torchmover._internal.arena import TokenArena
from torchmover._internal.pages import HUGE_PAGE, advise_huge_pages
from torchmover.scorer.units import Units

# Bytes that glibc's malloc always maps anew (above its largest mmap threshold, 32 MiB): smaller blocks
# may reuse heap memory a test run has already touched, whose pages stay small (and fault no more).
FRESH = 48 << 20
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MODE = re.search(r"\[(\w+)\]", THP_MODE.read_text()).group(1) if THP_MODE.exists() else None
needs_madvise_mode = pytest.mark.skipif(
    MODE != "madvise", reason=f"huge pages are given for the asking only in 'madvise' mode (here: {MODE})")


def huge_kib(t: torch.Tensor) -> int:
    """kB of the memory mappings overlapping ``t``'s memory (``/proc/self/smaps``; advice splits a
    mapping where it starts and ends) that are backed by transparent huge pages."""
    first, stop = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    total, overlaps = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            overlaps = int(head[1], 16) < stop and first < int(head[2], 16)
        elif overlaps and line.startswith("AnonHugePages:"):
            total += int(line.split()[1])
    return total


def written(t: torch.Tensor) -> torch.Tensor:
    t.view(-1)[::1024].fill_(1.0)  # a write on every 4 KiB page: each is mapped at its first touch
    return t


def test_advice_returns_the_tensor_itself_with_its_values():
    for t in (torch.arange(8 * HUGE_PAGE // 4, dtype=torch.float32), torch.ones(3, 5),
              torch.empty(4 * HUGE_PAGE, device="meta")):
        before = t.clone()
        assert advise_huge_pages(t) is t
        assert t.device == before.device and t.shape == before.shape and t.dtype == before.dtype
        if t.device.type == "cpu":
            assert torch.equal(t, before)


def test_advice_is_a_no_op_without_madvise(monkeypatch):
    monkeypatch.setattr(pages, "_madvise", lambda: None)
    t = torch.zeros(4 * HUGE_PAGE // 4)
    assert advise_huge_pages(t) is t and not t.any()


def test_advice_covers_the_whole_huge_pages_within_the_tensor_and_nothing_outside(monkeypatch):
    calls = []
    monkeypatch.setattr(pages, "_madvise", lambda: lambda start, length, advice: calls.append((start, length, advice)))
    t = torch.empty(5 * HUGE_PAGE // 4)  # 5 MiB from an address that is rarely 2 MiB-aligned
    advise_huge_pages(t)
    (start, length, advice), = calls
    end = t.data_ptr() + t.numel() * 4
    assert advice == pages.MADV_HUGEPAGE and start % HUGE_PAGE == 0 and length % HUGE_PAGE == 0
    assert t.data_ptr() <= start < t.data_ptr() + HUGE_PAGE and end - HUGE_PAGE < start + length <= end
    calls.clear()
    advise_huge_pages(torch.empty(HUGE_PAGE // 8))  # a quarter of a huge page: none lies within
    assert calls == []


@needs_madvise_mode
def test_advised_memory_is_backed_by_huge_pages_and_plain_memory_is_not():
    plain, advised = torch.empty(FRESH // 4), advise_huge_pages(torch.empty(FRESH // 4))
    written(plain), written(advised)
    assert huge_kib(plain) == 0
    assert huge_kib(advised) >= FRESH // 2 // 1024  # at least half of it


def _units(n: int, width: int, dim: int) -> Units:
    return Units(torch.randn(n, width, dim), torch.ones(n, width, dtype=torch.bool), torch.rand(n, width))


@pytest.mark.parametrize("zero_padding", [False, True])
def test_every_block_the_arena_makes_on_the_cpu_is_advised(monkeypatch, zero_padding):
    advised = []
    monkeypatch.setattr("torchmover._internal.arena.advise_huge_pages", lambda t: advised.append(t) or t)
    arena = TokenArena(Units, zero_padding=zero_padding)
    arena.add(list("ab"), _units(2, 3, 4), [(0, 3), (1, 2)])  # the first block: a field each
    assert [t.data_ptr() for t in advised] == [f.data_ptr() for f in arena.fields if f is not None]
    advised.clear()
    arena.append(list("cdefgh"), _units(6, 5, 4), [(0, 5)] * 6)  # grown
    assert [t.data_ptr() for t in advised] == [f.data_ptr() for f in arena.fields if f is not None]
    for key in "abcdefg":
        arena.remove(key)
    advised.clear()
    arena.compact()  # the live rows, gathered into a new block
    assert [t.data_ptr() for t in advised] == [f.data_ptr() for f in arena.fields if f is not None]
    assert arena.written == int(zero_padding) + 5


@needs_madvise_mode
def test_a_large_arena_block_is_backed_by_huge_pages():
    rows = FRESH // (384 * 4) // 128  # texts of 128 rows of 384 float32: a block of FRESH bytes
    arena = TokenArena(Units, zero_padding=True, capacity=1 + rows * 128)
    arena.append([str(i) for i in range(rows)], _units(rows, 130, 384), [(1, 129)] * rows)
    assert huge_kib(arena.fields[0]) >= FRESH // 2 // 1024
