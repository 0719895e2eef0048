"""Backing large CPU tensors with transparent huge pages: :func:`advise_huge_pages`.

A fresh CPU tensor of many megabytes gets its memory from the C library's ``malloc``, which maps it
anew from the system (``mmap``): every 4 KiB page is zeroed by the kernel at its first touch, one page
fault each. Writing a 90 MiB block (the token units of 1,000 pairs) so costs about 23,000 faults,
twice the time of the copy itself on a 2-core CPU. Linux can back such memory with 2 MiB pages
instead ("transparent huge pages"), 512 times fewer faults, where the process asks for it with
``madvise(MADV_HUGEPAGE)`` (the system default of most distributions: ``madvise`` mode in
``/sys/kernel/mm/transparent_hugepage/enabled``). PyTorch asks for every allocation when started
with ``THP_MEM_ALLOC_ENABLE=1``; this asks for the tensors of this package that are written once and
read many times (the token arena's block), before they are first written.
"""
from __future__ import annotations

import ctypes
import functools
import sys

from torch import Tensor

MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux
HUGE_PAGE = 1 << 21  # 2 MiB: x86-64 and (with 4 KiB base pages) arm64


@functools.lru_cache(maxsize=None)
def _madvise():
    """The C library's ``madvise``, or ``None`` where there is none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return madvise


def advise_huge_pages(t: Tensor) -> Tensor:
    """Ask Linux to back the whole 2 MiB pages within ``t``'s memory with huge pages, and return ``t``.
    Advice only: a tensor off the CPU, smaller than a huge page, or on a system without ``madvise`` or
    with transparent huge pages off (``never``) is left as it is, and its values never change. Call it
    before ``t`` is written (pages already touched stay small until the kernel's background
    ``khugepaged`` merges them)."""
    madvise = _madvise()
    if madvise is None or t.device.type != "cpu":
        return t
    start = t.data_ptr()
    first = -(-start // HUGE_PAGE) * HUGE_PAGE
    stop = (start + t.numel() * t.element_size()) // HUGE_PAGE * HUGE_PAGE
    if stop > first:
        madvise(first, stop - first, MADV_HUGEPAGE)  # a failure (e.g. EINVAL: no THP in the kernel) changes nothing
    return t
