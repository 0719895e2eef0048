"""The members of the TWMD family: each one's transport term ``C`` and its traits, declared once.

Everything that depends on what a member is — the methods a :class:`~torchmover.Scorer` accepts, its
default temperature, which signature fields it has, whether it compiles, which sensitivity factors
apply, the name a TRL reward is logged under — reads the :class:`Member` here, so a new member is one
:func:`register` call.

Each token member defines ``C(X1, X2)`` (:data:`~torchmover.functional.family.TransportTerm`); the
family's normalisation ``Sim = C(X1, X2) / sqrt(C(X1, X1) C(X2, X2))`` is applied once for all of
them (:func:`~torchmover.functional.family.pair_similarity`):

============== ==========================================================================================
``twmd``       ``C = Σ_ij π_ij S_ij``, π the entropic plan of ``T``-tempered Sinkhorn (one iteration by
               default), the direction's marginal exact
``trwmd``      the closed-form relaxation: ``π_ij = a_i softmax_j(S_ij / T)`` (recall)
``wmd``        exact WMD: both marginals exact (converged solver at ``WMD_TEMPERATURE``)
``moverscore`` MoverScore v2: ``1 − min_π Σ π_ij ‖x_i − y_j‖``
``bertscore``  greedy matching ``Σ_i a_i max_j S_ij`` (recall), ``Σ_j b_j max_i S_ij`` (precision)
``sbert``      cosine of the mass-weighted mean vectors
``cka``        linear CKA of the two word sets, ``Σ_ij a_i b_j S_ij²``
``sms`` ...    the sentence movers (:mod:`~torchmover.functional.sentences`): whole documents
============== ==========================================================================================
"""
from __future__ import annotations

import dataclasses
from typing import Callable, cast

import torch

from .family import DIRECTIONS, WMD_TEMPERATURE, TransportTerm, has_direction, signed_f1, _log_masses, _sim
from .transport import (TransportPlan, converged_sinkhorn, cost_matrix, log_pair_mask, plan_value, real_sides,
                        sinkhorn, sinkhorn_value, tempered_residual)

TEMPERATURE_KINDS = ("tuned", "fixed", "optional", None)

# term(temperature, n_iter) -> C, or {direction: C}
TermFactory = Callable[[float | None, int | None], "TransportTerm | dict[str, TransportTerm]"]
# solve(x1, x2, rows, cols, a, b) -> the transport plan of a term C (the arguments of TransportTerm)
Transport = Callable[..., TransportPlan]


@dataclasses.dataclass(frozen=True)
class Member:
    """A member of the family and its traits.

    Attributes:
        name: the ``method`` that selects it.
        term: ``term(temperature, n_iter)`` -> its transport term ``C``, or a dict of terms by
            direction; None for a member that moves whole documents (``documents``).
        directed: it has a ``recall`` and a ``precision`` term (and their F1).
        normalized: scores are ``C(X1, X2) / sqrt(C(X1, X1) C(X2, X2))``; False where ``C(X, X) = 1``
            by construction (the self-terms are then not computed) or the score is not a ratio.
        temperature: ``"tuned"`` (``T`` is a parameter, ``default_temperature`` unless the model has a
            measured one), ``"fixed"`` (the exact solver's ``WMD_TEMPERATURE``, not a parameter),
            ``"optional"`` (None = exact, a float = tempered) or None (no temperature).
        default_temperature: the paper's ``T`` for a ``"tuned"`` member.
        iterations: ``n_iter`` (Sinkhorn iterations, None = converged) is a parameter when tempered.
        compilable: its term is a fixed sequence of tensor ops (with a fixed ``n_iter``), so
            ``torch.compile`` makes one graph of it.
        matching: its plan ignores one side's masses, so zero-mass matching targets change its scores
            (``special_tokens="target"``).
        documents: it moves the words and sentences of whole documents (no token policy).
    """

    name: str
    term: TermFactory | None
    directed: bool = False
    normalized: bool = True
    temperature: str | None = None
    default_temperature: float | None = None
    iterations: bool = False
    compilable: bool = False
    matching: bool = False
    documents: bool = False

    def __post_init__(self):
        if self.temperature not in TEMPERATURE_KINDS:
            raise ValueError(f"temperature must be one of {TEMPERATURE_KINDS}, got {self.temperature!r}")
        if (self.temperature == "tuned") != (self.default_temperature is not None):
            raise ValueError("a default_temperature is given exactly for a 'tuned' temperature")
        if (self.term is None) != self.documents:
            raise ValueError("a member has a term unless it moves whole documents")

    def compiles(self, n_iter: int | None) -> bool:
        """Whether its term compiles with ``n_iter`` iterations (a converged solver tests convergence
        on the host between iterations)."""
        return self.compilable and not (self.iterations and n_iter is None)


MEMBERS: dict[str, Member] = {}


def register(member: Member) -> Member:
    """Add ``member`` to the family (replacing one of the same name)."""
    if not isinstance(member, Member):
        raise TypeError(f"register takes a Member, got {type(member).__name__}")
    MEMBERS[member.name] = member
    return member


def get_member(method: str) -> Member:
    """The member ``method`` (``ValueError`` naming the choices if there is none)."""
    if method not in MEMBERS:
        raise ValueError(f"method must be one of {tuple(MEMBERS)}, got {method!r}")
    return MEMBERS[method]


def member_term(method: str, temperature: float | None = None,
                n_iter: int | None = 1) -> TransportTerm | dict[str, TransportTerm]:
    """The transport term(s) of a family member (a dict by direction where it has several).

    ``temperature``: twmd / trwmd (required), wmd / moverscore (default ``WMD_TEMPERATURE``);
    ``n_iter``: twmd (``None`` = converged). Members are validated by the public functions.
    """
    member = get_member(method)
    if member.term is None:
        raise ValueError(f"method {method!r} moves whole documents: use functional.sentence_movers")
    return member.term(temperature, n_iter)


def twmd_transport(temperature: float, n_iter: int | None, exact: str = "rows") -> Transport:
    """The plan of TWMD's term ``C = ⟨π, S⟩``, ``S`` the cosine similarities: ``n_iter`` unrolled
    iterations with the ``exact`` marginal, or (``None``) converged with both."""
    def solve(x, y, rows, cols, a, b):
        sim = _sim(x, y)
        if n_iter is None:
            return converged_sinkhorn(sim, rows, cols, *_log_masses(a, b), temperature)
        return sinkhorn(sim, rows, cols, *_log_masses(a, b), temperature, n_iter, exact=exact)
    return solve


def moverscore_transport(temperature: float) -> Transport:
    """The plan of MoverScore's term: the converged plan of the gain ``−‖x_i − y_j‖``."""
    def solve(x, y, rows, cols, a, b):
        return converged_sinkhorn(-cost_matrix(x, y, "euclidean"), rows, cols, *_log_masses(a, b), temperature)
    return solve


def _moverscore_term(temperature: float) -> TransportTerm:
    """``C = 1 − min_π Σ π_ij ‖x_i − y_j‖`` (MoverScore v2: Euclidean cost on unit vectors), and 0 where
    a text has no direction (:func:`~torchmover.functional.family.has_direction`): its units at 0
    would cost nothing to move onto each other, and score 1."""
    solve = moverscore_transport(temperature)

    def term(x, y, rows, cols, a, b):
        score = 1.0 + solve(x, y, rows, cols, a, b).value
        return torch.where(has_direction(x, rows) & has_direction(y, cols), score, 0.0)
    return term


def _twmd_term(temperature: float, n_iter: int | None, exact: str) -> TransportTerm:
    """``C = Σ π S`` of the TWMD plan (the converged plan's through the envelope theorem)."""
    if n_iter is None:
        solve = twmd_transport(temperature, None)
        return lambda *cloud_pair: solve(*cloud_pair).value

    def term(x, y, rows, cols, a, b):  # the hot path: Σ π S without the plan
        return sinkhorn_value(_sim(x, y), rows, cols, *_log_masses(a, b), temperature, n_iter, exact=exact)
    return term


def _relaxed_term(temperature: float, exact: str) -> TransportTerm:
    """``π_ij = a_i softmax_j(S_ij / T)`` (rows) or ``b_j softmax_i(S_ij / T)`` (columns), the softmax
    taken on :func:`~torchmover.functional.transport.tempered_residual` so that it stays exact for any ``T > 0``."""
    dim = -1 if exact == "rows" else -2

    def term(x, y, rows, cols, a, b):
        sim = _sim(x, y)
        empty = ~real_sides(rows, cols)[0 if exact == "rows" else 1].unsqueeze(dim)  # slices along dim
        z, _ = tempered_residual(sim + log_pair_mask(rows, cols, sim.dtype), empty, temperature, dim)
        # z is 0 at each slice's maximum and -inf off the mask, where sim is exactly 0: the floored
        # softmax sums the real entries only, and the floor's e^-80 off the mask adds nothing
        return plan_value(z, sim, a if exact == "rows" else b, dim)
    return term


def _greedy_term(direction: str) -> TransportTerm:
    """BERTScore's greedy matching ``R = Σ_i a_i max_j S_ij``, ``P = Σ_j b_j max_i S_ij``, or (``f1``)
    both from one similarity matrix and their signed F1 (:func:`~torchmover.functional.family.signed_f1`)."""
    def term(x, y, rows, cols, a, b):
        sim = _sim(x, y) + log_pair_mask(rows, cols, x.dtype)  # -inf off the mask
        recall = (torch.where(rows, sim.amax(-1), 0.0) * a).sum(-1) if direction != "precision" else None
        precision = (torch.where(cols, sim.amax(-2), 0.0) * b).sum(-1) if direction != "recall" else None
        if direction == "f1":
            return signed_f1(recall, precision)
        return recall if direction == "recall" else precision
    return term


def _mean_term(x, y, rows, cols, a, b):
    """``C = Σ_ij a_i b_j S_ij = ⟨Σ a_i x_i, Σ b_j y_j⟩``."""
    return (a.unsqueeze(-1) * b.unsqueeze(-2) * _sim(x, y)).sum((-1, -2))


def _cka_term(x, y, rows, cols, a, b):
    """``C = Σ_ij a_i b_j S_ij²`` (linear CKA between the two word sets)."""
    return (a.unsqueeze(-1) * b.unsqueeze(-2) * _sim(x, y).square()).sum((-1, -2))


for _member in (
    # a "tuned" member's temperature is required (member_term): the callers pass a float
    Member("twmd", lambda t, n: {"recall": _twmd_term(cast(float, t), n, "rows"),
                                 "precision": _twmd_term(cast(float, t), n, "columns")},
           directed=True, temperature="tuned", default_temperature=0.10, iterations=True, compilable=True),
    Member("trwmd", lambda t, n: {"recall": _relaxed_term(cast(float, t), "rows"),
                                  "precision": _relaxed_term(cast(float, t), "columns")},
           directed=True, temperature="tuned", default_temperature=0.15, compilable=True, matching=True),
    Member("wmd", lambda t, n: _twmd_term(t or WMD_TEMPERATURE, None, "rows"),  # both marginals exact
           temperature="fixed"),
    Member("moverscore", lambda t, n: _moverscore_term(t or WMD_TEMPERATURE),
           normalized=False, temperature="fixed"),  # C(X, X) = 1 − 0: no self-terms to compute
    Member("bertscore", lambda t, n: {direction: _greedy_term(direction) for direction in DIRECTIONS},
           directed=True, normalized=False, compilable=True, matching=True),  # on unit vectors S_ii = 1 is
    # every row's and column's maximum: C(X, X) = 1, and the two matchings per pair it would cost are saved
    Member("sbert", lambda t, n: _mean_term, compilable=True),
    Member("cka", lambda t, n: _cka_term, compilable=True),
    *(Member(name, None, normalized=False, temperature="optional", iterations=True, documents=True)
      for name in ("sms", "s+wms", "wms")),
):
    register(_member)
del _member
