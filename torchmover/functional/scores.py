"""One function per member of the TWMD family, all with one signature (``torchmover.functional``).

``f(hyp, ref, hyp_mask=None, ref_mask=None, *, ...) -> Tensor[B]`` with ``hyp: [B, L2, D]``,
``ref: [B, L1, D]`` padded token embeddings and boolean masks (True = real token). Token vectors are
L2-normalised inside (cosine geometry); centering is a separate step (:func:`center`). Scores are
computed in at least float32; a pair with an empty text (all-False mask) scores exactly 0, and no NaN
ever comes out of padding.

Example:
    >>> import torch, torchmover.functional as F
    >>> x = torch.nn.functional.normalize(torch.randn(2, 5, 8, dtype=torch.float64), dim=-1)
    >>> F.tempered_wmd(x, x).round(decimals=12).tolist()  # Sim(X, X) = 1, up to rounding
    [1.0, 1.0]
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..runtime.devices import autocast_off
from .family import WMD_TEMPERATURE, FamilyScore, _check_inputs, signed_f1, family_similarity, token_cloud
from .members import Transport, member_term, moverscore_transport, twmd_transport
from .transport import check_temperature

__all__ = ["tempered_wmd", "tempered_rwmd", "wmd", "moverscore", "bertscore", "sbert", "cka"]


def tempered_wmd(
    hyp: Tensor, ref: Tensor, hyp_mask: Tensor | None = None, ref_mask: Tensor | None = None, *,
    temperature: float = 0.1, n_iter: int | None = 1, direction: str = "recall",
    hyp_weights: Tensor | None = None, ref_weights: Tensor | None = None, normalize: bool = True,
    return_plan: bool = False, validate: bool = True,
) -> Tensor | FamilyScore:
    """Tempered Word Mover's Similarity (TWMD): ``n_iter`` log-domain Sinkhorn iterations.

    Starts from the Gibbs plan ``log π = S / T``. One **recall** iteration normalises columns
    (hypothesis tokens) to their masses ``b``, then rows (reference tokens) to theirs ``a``, so every
    reference token ships exactly its mass; **precision** does the two steps in the opposite order.
    ``C = Σ_ij π_ij S_ij``; with ``normalize`` the score is ``C(X1,X2) / sqrt(C(X1,X1) C(X2,X2))``
    with the same direction, so ``Sim(X, X) = 1``; ``f1`` is the signed F1 (``2RP / (R + P)`` where
    ``RP > 0``, else 0: :mod:`~torchmover.functional.family`) of the un-normalised recall and precision
    terms, normalised the same way. (The paper's text writes ``exp(−S/T)``; its
    released code and this function use ``exp(+S/T)``: similar tokens attract mass.)

    ``n_iter=None`` solves the entropic problem at ``T`` to convergence
    (:func:`torchmover.functional.transport.converged_sinkhorn`); its gradient is then the envelope gradient
    ``∂C/∂S = π*`` (the plan held constant). For finite ``n_iter`` the iterations are unrolled and
    the gradient is exact.

    With finite ``n_iter`` nothing reads device data (no host-device sync on CUDA), except the check
    that given weights are finite and non-negative: ``validate=False`` skips it (e.g. in a training loop).
    """
    return _transport_score(
        temperature, n_iter, hyp, ref, hyp_mask, ref_mask, direction=direction,
        hyp_weights=hyp_weights, ref_weights=ref_weights, normalize=normalize, return_plan=return_plan,
        validate=validate,
    )


def wmd(
    hyp: Tensor, ref: Tensor, hyp_mask: Tensor | None = None, ref_mask: Tensor | None = None, *,
    hyp_weights: Tensor | None = None, ref_weights: Tensor | None = None, normalize: bool = True,
    temperature: float = WMD_TEMPERATURE, return_plan: bool = False,
) -> Tensor | FamilyScore:
    """Exact Word Mover's similarity (MoverScore's Eq. 2): ``C = max_π Σ π_ij S_ij`` over plans with
    both marginals ``π1 = a``, ``πᵀ1 = b``.

    Solved as entropic OT at a small ``temperature`` (default ``1e-3``) to convergence
    (:func:`~torchmover.functional.transport.converged_sinkhorn`): an ε-scaling warm start, then
    log-domain iterations, pair by pair, until the plan's rows hold exactly and its columns within
    ``1e-3`` (L1; ``transport.CONVERGENCE_TOLERANCE``); ``return_plan=True`` gives the plan with each
    pair's iterations, marginal error and ``converged`` flag. A pair's score does not depend on the
    other pairs of the batch (to 1e-6, tested).

    Agreement with the LP value ``C*`` (``normalize=False``): a converged pair's plan is the exact
    entropic optimum at ``T`` for its own marginals ``(a, b')`` (rows exact), whose marginal error
    ``δ = ‖b' − b‖₁`` is at most ``1e-3``. Rerouting the misplaced mass ``δ/2`` changes the LP value by
    at most ``δ/2 · (max S − min S) ≤ δ``, and an entropic plan's value lies below its own LP value by
    at most ``T (H(π_T) − H(π*)) ≤ T ln min(L1, L2)`` (a plan's entropy lies between its marginals'
    larger entropy and their sum), so::

        C* − δ − T ln min(L1, L2)  ≤  C  ≤  C* + δ,        δ ≤ 1e-3 (the reported marginal error).

    The entropic term is exponentially small in ``gap / T`` where the LP optimum is unique and not
    degenerate. Measured: ``|C − C*|`` at most 4.5e-4 on 1600 random pairs
    (``tests/test_functional.py::test_wmd_matches_lp_solver``), and ``δ`` itself (9.5e-4) on collinear
    tokens, ``S = ±1``, a degenerate LP (``tests/test_functional_contracts.py``). The
    normalised score is the ratio of three such values (the self-terms' LP value is 1).

    The gradient is the envelope gradient ``∂C/∂S = π*``, exact for the LP value where its optimum
    is unique. The weights get no gradient: the plan is solved without a graph (``torch.no_grad``)
    and the value depends on the masses only through it, so ``hyp_weights.grad`` stays None.
    """
    return _transport_score(
        temperature, None, hyp, ref, hyp_mask, ref_mask, direction="recall",
        hyp_weights=hyp_weights, ref_weights=ref_weights, normalize=normalize, return_plan=return_plan,
    )


def moverscore(
    hyp: Tensor, ref: Tensor, hyp_mask: Tensor | None = None, ref_mask: Tensor | None = None, *,
    hyp_weights: Tensor | None = None, ref_weights: Tensor | None = None,
    temperature: float = WMD_TEMPERATURE, return_plan: bool = False,
) -> Tensor | FamilyScore:
    """MoverScore v2's score: ``1 − min_π Σ π_ij ‖x_i − y_j‖`` over plans with both marginals, the
    Euclidean distance between unit token vectors as the cost (Zhao et al., 2019, Eq. 2).

    Not normalised (``Sim(X, X) = 1`` because the identity plan costs 0; a text of no direction, whose
    every vector is 0, scores 0: :func:`~torchmover.functional.family.has_direction`). Solved like
    :func:`wmd` (entropic at ``temperature``, converged), with :func:`wmd`'s bound on the LP value (the
    cost ``‖x − y‖`` of unit vectors lies in ``[0, 2]``, as ``S`` in ``[−1, 1]``); the gradient is the
    envelope gradient, and the weights get none (as in :func:`wmd`). MoverScore's
    other choices (IDF weights, dropped pieces and punctuation, [CLS]/[SEP] kept) are token-level
    options of :class:`~torchmover.Scorer`; the ``moverscore`` preset sets them all.
    """
    check_temperature(temperature)
    kw: dict[str, Any] = dict(hyp_weights=hyp_weights, ref_weights=ref_weights)
    score = family_similarity(member_term("moverscore", temperature), hyp, ref, hyp_mask, ref_mask,
                              normalize=False, **kw)
    return _with_plan(score, moverscore_transport(temperature), hyp, ref, hyp_mask, ref_mask, **kw) \
        if return_plan else score


def _transport_score(temperature, n_iter, hyp, ref, hyp_mask, ref_mask, *, direction, return_plan, normalize,
                     **kw):
    check_temperature(temperature)
    if n_iter is not None and (isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 1):
        raise ValueError(f"n_iter must be a positive int or None (converged), got {n_iter!r}")
    score = family_similarity(member_term("twmd", temperature, n_iter), hyp, ref, hyp_mask, ref_mask,
                              direction=direction, normalize=normalize, **kw)
    if not return_plan:
        return score
    solve = twmd_transport(temperature, n_iter, "columns" if direction == "precision" else "rows")
    return _with_plan(score, solve, hyp, ref, hyp_mask, ref_mask, **kw)


def _with_plan(score: Tensor, solve: Transport, hyp: Tensor, ref: Tensor, hyp_mask: Tensor | None,
               ref_mask: Tensor | None, *, hyp_weights: Tensor | None = None, ref_weights: Tensor | None = None,
               validate: bool = True) -> FamilyScore:
    """``score`` with the transport plan of its cross term ``C(ref, hyp)`` (``f1``: the recall term's), solved
    again on the same token clouds (a diagnostic: the scores need no plan)."""
    hyp_mask, ref_mask = _check_inputs(hyp, ref, hyp_mask, ref_mask)
    dtype = torch.promote_types(torch.promote_types(hyp.dtype, ref.dtype), torch.float32)
    with autocast_off(hyp.device):
        h = token_cloud(hyp, hyp_mask, hyp_weights, dtype=dtype, name="hyp_weights", validate=validate)
        r = token_cloud(ref, ref_mask, ref_weights, dtype=dtype, name="ref_weights", validate=validate)
        return FamilyScore(score, solve(r.vectors, h.vectors, r.mask, h.mask, r.mass, h.mass))


def tempered_rwmd(
    hyp: Tensor, ref: Tensor, hyp_mask: Tensor | None = None, ref_mask: Tensor | None = None, *,
    temperature: float = 0.15, direction: str = "recall",
    hyp_weights: Tensor | None = None, ref_weights: Tensor | None = None, normalize: bool = True,
    validate: bool = True,
) -> Tensor:
    """Tempered relaxed WMD (TRWMD), closed form: only one marginal is kept.

    Recall plan ``π_ij = a_i softmax_j(S_ij / T)``, precision plan ``π_ij = b_j softmax_i(S_ij / T)``;
    ``C = Σ π_ij S_ij``, normalised as in :func:`tempered_wmd`. As ``T → 0`` it tends to BERTScore
    recall (precision).

    Nothing reads device data, except the check that given weights are finite and non-negative:
    ``validate=False`` skips it (as in :func:`tempered_wmd`; also in :func:`bertscore`, :func:`sbert`
    and :func:`cka`).
    """
    check_temperature(temperature)
    return family_similarity(
        member_term("trwmd", temperature), hyp, ref, hyp_mask, ref_mask, direction=direction,
        hyp_weights=hyp_weights, ref_weights=ref_weights, normalize=normalize, validate=validate,
    )


def bertscore(
    hyp: Tensor, ref: Tensor, hyp_mask: Tensor | None = None, ref_mask: Tensor | None = None, *,
    hyp_weights: Tensor | None = None, ref_weights: Tensor | None = None, normalize: bool = False,
    validate: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """BERTScore greedy matching ``(P, R, F)``: ``R = Σ_i a_i max_j S_ij``, ``P = Σ_j b_j max_i S_ij``,
    ``F = 2PR / (P + R)`` where ``PR > 0``, else 0 (the signed F1 of
    :mod:`~torchmover.functional.family`: always between P and R). Weights play the role of
    BERTScore's IDF weights.

    Not normalised by default, as BERTScore and the :class:`~torchmover.Scorer`'s ``bertscore``
    member: each of ``P`` and ``R`` is a plan's average of cosines, so ``|P|, |R|, |F| ≤ 1``.
    ``normalize=True`` divides by the self-terms ``C(X, X) = Σ_i a_i max_j x_i·x_j``, which are 1 (to
    rounding) only where every real token vector is non-zero: a zero token vector (e.g. one that
    centering made 0) matches nothing, so its text's ``C(X, X) < 1`` and the score can exceed 1
    (reference ``{0, e₁}``, hypothesis ``{e₁}``: ``P = 1/sqrt(1/2) = 1.41``).
    ``validate=False`` skips the weights' check and its device read (:func:`tempered_rwmd`).
    """
    kw: dict[str, Any] = dict(hyp_weights=hyp_weights, ref_weights=ref_weights, normalize=normalize, validate=validate)
    terms = member_term("bertscore")
    p = family_similarity(terms, hyp, ref, hyp_mask, ref_mask, direction="precision", **kw)
    r = family_similarity(terms, hyp, ref, hyp_mask, ref_mask, direction="recall", **kw)
    return p, r, signed_f1(p, r)


def sbert(
    hyp: Tensor, ref: Tensor, hyp_mask: Tensor | None = None, ref_mask: Tensor | None = None, *,
    hyp_weights: Tensor | None = None, ref_weights: Tensor | None = None, normalize: bool = True,
    validate: bool = True,
) -> Tensor:
    """Cosine of the (weighted) mean-pooled unit token vectors: ``C = Σ_ij a_i b_j S_ij``.
    ``validate=False`` skips the weights' check and its device read (:func:`tempered_rwmd`)."""
    return family_similarity(
        member_term("sbert"), hyp, ref, hyp_mask, ref_mask,
        hyp_weights=hyp_weights, ref_weights=ref_weights, normalize=normalize, validate=validate,
    )


def cka(
    hyp: Tensor, ref: Tensor, hyp_mask: Tensor | None = None, ref_mask: Tensor | None = None, *,
    hyp_weights: Tensor | None = None, ref_weights: Tensor | None = None, normalize: bool = True,
    validate: bool = True,
) -> Tensor:
    """Wordset-CKA: ``C = Σ_ij a_i b_j S_ij²``, normalised (linear CKA of the two token sets).
    ``validate=False`` skips the weights' check and its device read (:func:`tempered_rwmd`)."""
    return family_similarity(
        member_term("cka"), hyp, ref, hyp_mask, ref_mask,
        hyp_weights=hyp_weights, ref_weights=ref_weights, normalize=normalize, validate=validate,
    )
