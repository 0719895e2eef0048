"""``Scorer(compile=True)``: the transport terms of the family through ``torch.compile``.

The members whose term is a fixed sequence of tensor ops compile as one graph each, without graph
breaks (checked by ``torch._dynamo.explain`` in the tests): one-iteration (or any fixed ``n_iter``)
TWMD, TRWMD, BERTScore, SBERT and CKA. The converged solvers (``n_iter=None``, ``wmd``,
``moverscore``) test convergence on the host between iterations, and the sentence movers build
sentence units first: they are not offered.

Each term is compiled once per (member, temperature, iterations) and direction, with dynamic shapes
(batch size and token counts change from call to call without recompiling). Compiled and eager
scores agree to float32 rounding. Whether it is faster depends on the device and, on a CPU, on the
allocator: see the README, "Devices, precision and compilation" (on the 2-core CPU of this project the
compiled TWMD term beat the eager one with glibc's default allocator, which gives every large
temporary fresh pages, and lost to it with freed memory kept; a compile costs seconds; GPUs are not
measured).
"""
from __future__ import annotations

import functools

import torch

from .family import TransportTerm, member_term

COMPILABLE = ("twmd", "trwmd", "bertscore", "sbert", "cka")


def check_compile(compile: bool, method: str, n_iter: int | None) -> bool:
    """Validate the ``compile`` option of a scorer of ``method`` (``ValueError`` naming it)."""
    if not isinstance(compile, bool):
        raise TypeError(f"compile must be True or False, got {compile!r}")
    if compile and (method not in COMPILABLE or (method == "twmd" and n_iter is None)):
        raise ValueError(f"compile=True supports the methods {COMPILABLE} (twmd with a fixed n_iter), "
                         f"got method={method!r}, n_iter={n_iter!r}")
    return compile


@functools.lru_cache(maxsize=None)
def compiled_member_term(method: str, temperature: float | None, n_iter: int | None
                         ) -> TransportTerm | dict[str, TransportTerm]:
    """:func:`torchmover.functional.family.member_term` with every term wrapped in ``torch.compile(dynamic=True)``
    (built once per arguments)."""
    check_compile(True, method, n_iter)
    term = member_term(method, temperature, n_iter)
    if isinstance(term, dict):
        return {direction: torch.compile(t, dynamic=True) for direction, t in term.items()}
    return torch.compile(term, dynamic=True)
