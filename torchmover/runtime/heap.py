"""Giving the C heap's free memory back to the system: :func:`release_free_heap`.

On the CPU, PyTorch takes a tensor's memory from the C library's ``malloc``. glibc's allocator keeps
what is freed in its heap for later allocations, and gives back to the system only a free stretch at
the heap's top. After a sequence of differently shaped batches (an encoder run over texts of
decreasing length) the heap holds much more free memory than any one batch needs, resident though
unused: in a scoring call of 1,000 pairs on the CPU, about 120 MiB free once the longest batches had
run, whose working memory was about 45 MiB (glibc's ``mallinfo2``). ``malloc_trim(0)`` hands every
whole free page of the heap back to the system (a page comes back zeroed, at a page fault, when the
heap uses it again).

:meth:`Scorer.score <torchmover.Scorer.score>` on the CPU trims after each quarter of a chunk's tokens
encoded; the performance guide has what it saves and costs. A process that sets glibc's trim threshold
itself (``MALLOC_TRIM_THRESHOLD_``, or ``glibc.malloc.trim_threshold`` in ``GLIBC_TUNABLES``: e.g. to
keep freed memory for the next call) has chosen how much free memory to keep, and is never trimmed.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys


@functools.lru_cache(maxsize=None)
def _malloc_trim():
    """glibc's ``malloc_trim`` from the process's own C library, or ``None`` where there is none (not
    Linux, or a C library without it, e.g. musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def trim_threshold_is_set() -> bool:
    """Whether the process set glibc's trim threshold itself (read by glibc at start-up from
    ``MALLOC_TRIM_THRESHOLD_`` or the ``glibc.malloc.trim_threshold`` tunable)."""
    return "MALLOC_TRIM_THRESHOLD_" in os.environ or "glibc.malloc.trim_threshold" in os.environ.get(
        "GLIBC_TUNABLES", "")


def release_free_heap() -> bool:
    """Hand the C heap's whole free pages back to the system (``malloc_trim(0)``, glibc), for the whole
    process; nothing allocated moves. Returns whether it did: ``False``, doing nothing, where the C
    library has no ``malloc_trim`` or the process set its own trim threshold
    (:func:`trim_threshold_is_set`)."""
    trim = _malloc_trim()
    if trim is None or trim_threshold_is_set():
        return False
    trim(0)
    return True
