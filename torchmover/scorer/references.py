"""Many references per hypothesis in bounded memory: a call's (hypothesis, references) pairs cut into
*pieces* of at most :data:`REFERENCE_CHUNK` references, scored piece by piece, and each hypothesis's
score combined from its pieces' as ``multi_ref`` combines references.

A hypothesis's references are otherwise scored as one group: encoded in one batch and moved in one
transport batch, so that one hypothesis with 100,000 references holds all of them at once. Cut into
pieces, a call holds at most :data:`CALL_REFERENCES` references (:func:`piece_calls`), whatever its
shape. The combination is exact: ``max`` over the pieces' maxima is the maximum, and the mean of the
pieces' means, weighted by their sizes ``n_k``, is the mean, ``Σ_k n_k m_k / Σ_k n_k`` (to float
rounding). With ``return_all`` and ``max``, the three scores come from the piece of best F1 (the
first such piece), as :meth:`Scorer.score_all_pairs <torchmover.Scorer.score_all_pairs>` takes them
from the reference of best F1. A rescaled score is an increasing affine map of the raw one, so it
combines the same way.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, cast

import torch
from torch import Tensor

from .units import PRF

__all__ = ["CALL_REFERENCES", "REFERENCE_CHUNK", "Pieces", "combine_pieces", "needs_pieces", "piece_calls",
           "score_in_pieces", "split_references"]

REFERENCE_CHUNK = 64  # the most references of one hypothesis scored together
CALL_REFERENCES = 1024  # the most references of one call (Scorer.forward, a reward) scored together


class Pieces(NamedTuple):
    """A call cut into pieces: piece ``k`` is ``(hyps[k], groups[k])``, of the call's hypothesis
    ``owner[k]``."""

    hyps: list[str]
    groups: list[list[str]]
    owner: list[int]


def needs_pieces(groups: list[list[str]], whole_call: bool = True) -> bool:
    """Whether a call must be cut: a hypothesis has more than :data:`REFERENCE_CHUNK` references, or
    (``whole_call``) the call more than :data:`CALL_REFERENCES`."""
    return (any(len(g) > REFERENCE_CHUNK for g in groups)
            or (whole_call and sum(map(len, groups)) > CALL_REFERENCES))


def split_references(hyps: list[str], groups: list[list[str]]) -> Pieces:
    """Each hypothesis's references cut into consecutive pieces of at most :data:`REFERENCE_CHUNK`,
    in order."""
    size, pieces = REFERENCE_CHUNK, Pieces([], [], [])
    for i, (hyp, group) in enumerate(zip(hyps, groups)):
        for start in range(0, len(group), size):
            pieces.hyps.append(hyp)
            pieces.groups.append(group[start:start + size])
            pieces.owner.append(i)
    return pieces


def piece_calls(pieces: Pieces) -> list[slice]:
    """Consecutive runs of ``pieces`` of at most :data:`CALL_REFERENCES` references each (at least one
    piece)."""
    per_call, calls, start, total = CALL_REFERENCES, [], 0, 0
    for k, group in enumerate(pieces.groups):
        if k > start and total + len(group) > per_call:
            calls.append(slice(start, k))
            start, total = k, 0
        total += len(group)
    if start < len(pieces.groups):
        calls.append(slice(start, len(pieces.groups)))
    return calls


def combine_pieces(scores: Tensor | PRF, pieces: Pieces, n: int, multi_ref: str) -> Tensor | PRF:
    """Each hypothesis's score ``[n]`` (or ``PRF`` of them) from its pieces' ``scores`` by ``multi_ref``
    (see the module docs)."""
    owner = torch.as_tensor(pieces.owner, device=(scores[0] if isinstance(scores, PRF) else scores).device)
    if multi_ref == "max":
        key = scores.f1 if isinstance(scores, PRF) else scores
        best = torch.full((n,), float("-inf"), dtype=key.dtype, device=key.device).scatter_reduce(
            0, owner, key, reduce="amax", include_self=False)
        position = torch.arange(len(key), device=key.device)
        candidates = torch.where(key == best[owner], position, len(key))
        chosen = torch.full((n,), len(key), dtype=torch.long, device=key.device).scatter_reduce(
            0, owner, candidates, reduce="amin")
        return PRF(*(s[chosen] for s in scores)) if isinstance(scores, PRF) else scores[chosen]
    sizes = torch.as_tensor([len(g) for g in pieces.groups], device=owner.device)

    def mean(s: Tensor) -> Tensor:
        total = torch.zeros(n, dtype=torch.float64, device=s.device).index_add_(0, owner, s.double() * sizes)
        count = torch.zeros(n, dtype=torch.float64, device=s.device).index_add_(0, owner, sizes.double())
        return (total / count).to(s.dtype)
    return PRF(*map(mean, scores)) if isinstance(scores, PRF) else mean(scores)


def score_in_pieces(pieces: Pieces, n: int, multi_ref: str,
                    score: Callable[[list[str], list[list[str]]], Tensor | PRF]) -> Tensor | PRF:
    """The scores ``[n]`` (or ``PRF``) of a call cut into ``pieces``: ``score(hyps, groups)`` of each run
    of :func:`piece_calls`, concatenated, then combined by :func:`combine_pieces`."""
    parts = [score(pieces.hyps[run], pieces.groups[run]) for run in piece_calls(pieces)]
    # every part is a PRF, or none is (one score function)
    scores = PRF(*(torch.cat(s) for s in zip(*parts))) if isinstance(parts[0], PRF) else \
        torch.cat(cast(list[Tensor], parts))
    return combine_pieces(scores, pieces, n, multi_ref)
