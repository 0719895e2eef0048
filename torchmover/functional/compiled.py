"""``Scorer(compile=True)``: the transport terms of the family through ``torch.compile``.

The members whose term is a fixed sequence of tensor ops compile as one graph each, without graph
breaks (checked by ``torch._dynamo.explain`` in the tests): one-iteration (or any fixed ``n_iter``)
TWMD, TRWMD, BERTScore, SBERT and CKA. The converged solvers (``n_iter=None``, ``wmd``,
``moverscore``) test convergence on the host between iterations, and the sentence movers build
sentence units first: they are not offered.

Each term is compiled once per (member, temperature, iterations) and direction, with dynamic shapes
(batch size and token counts change from call to call without recompiling). Compiled and eager
scores agree to float32 rounding. It is off by default: a compile costs seconds, and the transport is
a small share of a call (the encoder dominates; see the documentation's performance page for the
measured figures on CPU and GPU).
"""
from __future__ import annotations

import functools

import torch

from .family import TransportTerm
from .members import MEMBERS, get_member, member_term


def compilable_methods() -> tuple[str, ...]:
    """The members whose term compiles (:attr:`Member.compilable <torchmover.functional.members.Member>`)."""
    return tuple(name for name, member in MEMBERS.items() if member.compilable)


def check_compile(compile: bool, method: str, n_iter: int | None) -> bool:
    """Validate the ``compile`` option of a scorer of ``method`` (``ValueError`` naming it)."""
    if not isinstance(compile, bool):
        raise TypeError(f"compile must be True or False, got {compile!r}")
    if compile and not get_member(method).compiles(n_iter):
        raise ValueError(f"compile=True supports the methods {compilable_methods()} (with a fixed n_iter), "
                         f"got method={method!r}, n_iter={n_iter!r}")
    return compile


@functools.lru_cache(maxsize=None)
def compiled_member_term(method: str, temperature: float | None, n_iter: int | None
                         ) -> TransportTerm | dict[str, TransportTerm]:
    """:func:`~torchmover.functional.members.member_term` with every term wrapped in ``torch.compile(dynamic=True)``
    (built once per arguments)."""
    check_compile(True, method, n_iter)
    term = member_term(method, temperature, n_iter)
    if isinstance(term, dict):
        return {direction: torch.compile(t, dynamic=True) for direction, t in term.items()}
    return torch.compile(term, dynamic=True)
