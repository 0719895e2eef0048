"""The TWMD family: ``Sim(X1, X2) = C(X1, X2) / sqrt(C(X1, X1) · C(X2, X2))``.

``X1`` is the reference (``[B, L1, D]``, rows), ``X2`` the hypothesis (``[B, L2, D]``, columns),
``S = X1_unit X2_unitᵀ`` (``[B, L1, L2]``) their cosine similarities and ``a`` (``[B, L1]``), ``b``
(``[B, L2]``) the token masses (uniform over real tokens unless weights are given). Each member only
defines its transport term ``C`` (:mod:`torchmover.functional.members`); the rest is done once for all of them:
:func:`token_cloud` unit-normalises each text's token vectors and folds zero weights into its mask
(or keeps them as zero-mass matching targets, bert_score's rule),
:func:`pair_similarity` normalises so that ``Sim(X, X) = 1`` (each text's self-term computed once,
however many pairs it is in) and scores a pair with an empty text (all-False mask) exactly 0.

Bounds, proved (no score is clamped). Every token member's term is a plan's average of values in
``[-1, 1]``: ``C(X1, X2) = Σ_ij π_ij f(S_ij)`` with ``π ≥ 0`` of total mass 1 (one marginal is exact:
the direction's, a converged plan's last one, bertscore's greedy ``π_ij = a_i [j = argmax_k S_ik]``,
``a ⊗ b`` for sbert and cka) and ``f(S) = S`` (``S²`` for cka, ``1 − ‖x − y‖ ≥ −1`` for moverscore), so::

    |C(X1, X2)| ≤ 1     (every member, and f1: the signed F1 below lies between its two terms).

The members that are not normalised (bertscore, moverscore) are ``C`` itself: ``|Sim| ≤ 1``. For sbert
and cka Cauchy–Schwarz gives ``|Sim| ≤ 1``: ``C(X1, X2) = ⟨m1, m2⟩`` with ``m = Σ_i a_i x_i`` (cka: the
Frobenius product of ``M = Σ_i a_i x_i x_iᵀ``) and ``C(X, X) = ‖m‖²``. For the transport members (twmd,
trwmd, wmd) the plan of a pair is not built from the plans of its two self-pairs and no such inequality
holds: their exact bound is::

    |Sim(X1, X2)| ≤ 1 / sqrt(C(X1, X1) C(X2, X2)),

which is above 1 wherever a self-term is below 1 (a tempered plan spreads a token's mass over its
neighbours). Measured in float64 by gradient ascent on 3-dimensional clouds: one-iteration TWMD up to
1.0034 at ``T = 0.1`` with uniform masses, and with weighted masses up to 1.015 (``T = 0.1``) and 1.15
(``T = 1``), also for one text whose masses differ between its two sides (IDF tables fitted per side;
1.0008 for a WMT sentence with the default model and ``idf=True``). ``Sim(X, X) = 1`` holds where the
text has the same masses on both sides (the cross term is then the self-term) and ``C(X, X) > 0``; a
text whose vectors are all 0 (e.g. one token centered on its own mean), or sbert's text whose mean
vector is 0, has ``C(X, X) = 0``: the ratio is then undefined, and so is it, up to rounding, wherever
``sqrt(C(X1, X1) C(X2, X2)) ≤ 64 ε`` (ε the dtype's machine epsilon; the cross term's rounding error is
of order ε, and by Cauchy–Schwarz the exact cross term is then below ``64 ε`` for sbert and cka): the
score is 0 there, as it is in the members without normalisers (:func:`has_direction`). Scores bounded
by 1 can exceed it by float rounding only (≤ 1e-6 in float32, asserted in ``tests/test_properties.py``:
an identical pair whose self-term was computed in another batch, a unit vector's cosine with itself).
Token vectors are normalised in their dtype (at least float32), whose squares must stay normal numbers
of it: in float32 entries of magnitude about 1e-18 to 1e18 (float64: 1e-150 to 1e150) score as the same
vectors near 1. Beyond, a vector's squared norm overflows to inf or underflows, through subnormals
that lose precision, to 0, and the vector counts as 0 (as a zero vector above); pass float64 vectors
at such scales (``tests/test_functional_contracts.py``).
:func:`family_similarity` is :func:`token_cloud` and :func:`pair_similarity` in one for aligned
``[B, L, D]`` batches.

Directions: ``recall`` — every reference token ships exactly its mass (the plan's rows are exact);
``precision`` — every hypothesis token receives exactly its mass (columns exact); ``f1`` — the signed F1
of the two un-normalised terms, normalised the same way. For scores ``P`` and ``R`` of any sign::

    F1(P, R) = 2PR / (P + R)   where PR > 0   (then P + R has their sign and is never 0),
    F1(P, R) = 0               where PR ≤ 0,

(:func:`signed_f1`): the harmonic mean where both are positive (BERTScore's F, bert_score's values to
1e-5), it always lies between ``P`` and ``R``, is continuous (the harmonic mean tends to 0 on the axes)
and has a finite gradient (``|∂F1/∂P| = 2R² / (P + R)² ≤ 2`` where the signs agree, 0 elsewhere).
With centered vectors ``P`` and ``R`` can have opposite signs, where ``2PR / (P + R)`` leaves
``[P, R]`` and explodes near ``P = −R``. A text's self-terms are equal in the two directions (the
precision plan of ``(X, X)`` is the recall plan transposed), so normalising ``F1(C_R, C_P)`` by the
self-terms' F1 equals ``F1`` of the normalised recall and precision (``F1`` is positively homogeneous):
twmd's, trwmd's and bertscore's ``f1`` lie between their ``precision`` and ``recall``. The scorer's
``return_all``, the rewards and the sensitivity analysis read the same ``f1``.
"""
from __future__ import annotations

import functools

from typing import Callable, NamedTuple, Sequence

import torch
from torch import Tensor

from ..runtime.devices import autocast_off
from .transport import TransportPlan

DIRECTIONS = ("recall", "precision", "f1")
WMD_TEMPERATURE = 1e-3

# C(x1, x2, rows, cols, a, b) -> [B]: unit vectors x1 [B, L1, D], x2 [B, L2, D] (zero off their masks), masks
# rows [B, L1], cols [B, L2] (each with at least one True: the pair mask is their outer product), masses
# a [B, L1], b [B, L2] (zero off the masks, each summing to 1).
TransportTerm = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


class FamilyScore(NamedTuple):
    """A score with the transport plan of its cross term ``C(X1, X2)`` (for diagnostics)."""

    score: Tensor
    plan: TransportPlan


def _check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


def check_vectors(name: str, x) -> None:
    """Raise ``ValueError`` naming ``x`` (``name``) unless it is a ``[B, L, D]`` tensor of token vectors."""
    if not isinstance(x, Tensor) or x.dim() != 3:
        raise ValueError(f"{name} must be a [B, L, D] tensor, got {getattr(x, 'shape', type(x))}")


def check_mask(name: str, mask, x: Tensor) -> None:
    """Raise ``TypeError`` / ``ValueError`` naming ``mask`` (``name``) unless it is a tensor of the
    shape ``[B, L]`` of ``x`` exactly (a mask is never broadcast). Reads no device data."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a bool Tensor of shape {tuple(x.shape[:2])}, got {type(mask).__name__}")
    if mask.shape != x.shape[:2]:
        raise ValueError(f"{name} must have shape {tuple(x.shape[:2])}, got {tuple(mask.shape)}")


def _check_inputs(hyp: Tensor, ref: Tensor, hyp_mask: Tensor | None, ref_mask: Tensor | None):
    for name, x in (("hyp", hyp), ("ref", ref)):
        check_vectors(name, x)
    if hyp.shape[0] != ref.shape[0] or hyp.shape[-1] != ref.shape[-1]:
        raise ValueError(f"hyp {tuple(hyp.shape)} and ref {tuple(ref.shape)} must share B and D")
    masks = []
    for name, x, mask in (("hyp_mask", hyp, hyp_mask), ("ref_mask", ref, ref_mask)):
        if mask is None:
            mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        check_mask(name, mask, x)
        masks.append(mask.to(device=x.device, dtype=torch.bool))
    return masks


def _masses(mask: Tensor, weights: Tensor | None, name: str, dtype: torch.dtype,
            validate: bool, nonempty: bool = False) -> tuple[Tensor, Tensor]:
    """Token masses (in ``dtype``) summing to 1 over real tokens, ``w_i / Σ_j w_j``, and the mask with
    zero-weight tokens removed. ``validate`` checks that the weights of real tokens are finite and
    non-negative (one read of device data).
    ``nonempty``: every row has a token of positive weight (no total of 0 to guard against).

    Masses do not depend on the weights' scale, so given weights are first divided by a power of two
    ``p`` near their text's largest one (:func:`_binade`): any finite weights, 1e-45 or 3e38 alike,
    then sum to a total in ``[1, 2L)`` (at least the dtype's ``eps`` where the largest is subnormal)
    that neither overflows nor underflows, and only a text whose weights are all 0 has a total of 0
    (its masses are 0). Dividing by a power of two is exact, so the masses are, to the bit,
    ``w_i / Σ_j w_j`` wherever neither that sum nor a ``w_i / p`` leaves the normal range. ``p`` is held
    constant in autograd: the masses are the same function of the weights for every ``p``."""
    if weights is None:  # uniform: 1 on every real token, already 0 off the mask
        weights = mask.to(dtype)
    elif weights.shape != mask.shape:
        raise ValueError(f"{name} must have shape {tuple(mask.shape)}, got {tuple(weights.shape)}")
    else:
        if validate and bool((mask & ~((weights >= 0) & (weights < torch.inf))).any()):  # NaN fails both
            raise ValueError(f"{name} must be finite and non-negative (masses), got a NaN, inf or negative weight")
        mask = mask & (weights > 0)
        weights = torch.where(mask, weights, 0.0)
        if weights.shape[-1]:  # texts of no token have no largest weight (and nothing to scale)
            weights = weights / _binade(weights.detach().amax(-1, keepdim=True))
    total = weights.sum(-1, keepdim=True)
    return weights / (total if nonempty else total.clamp_min(torch.finfo(weights.dtype).tiny)), mask


# The bits of a float's exponent field (those of inf), and the integer type of the same width.
_EXPONENT_BITS = {torch.float64: (torch.int64, 0x7FF0000000000000), torch.float32: (torch.int32, 0x7F800000),
                  torch.bfloat16: (torch.int16, 0x7F80), torch.float16: (torch.int16, 0x7C00)}


def _binade(m: Tensor) -> Tensor:
    """The largest power of two ``≤ m`` for non-negative finite floating-point ``m``, and the
    smallest normal number ``tiny`` where ``m`` is below it (0 or subnormal): always a power of two
    ``p ≥ tiny`` with ``m / p < 2``. Read from the exponent bits (``torch.frexp`` has no MPS kernel)."""
    int_type, exponent = _EXPONENT_BITS[m.dtype]
    return (m.view(int_type) & exponent).view(m.dtype).clamp_min(torch.finfo(m.dtype).tiny)


def _unit_vectors(x: Tensor, mask: Tensor, finite_padding: bool = False) -> Tensor:
    """L2-normalised token vectors ``x / ‖x‖``, exactly zero at padding and where ``x = 0`` (a token
    vector that centering made 0, e.g. the one token of a text centered on its own mean): never NaN,
    whatever padding holds, and a finite gradient (0 at a zero vector) everywhere.

    The norm is replaced by ``inf`` at padding and at zero vectors (a select, so ``x / inf`` is 0 and
    no gradient reaches the replaced norms; dividing by a clamped norm instead would give a zero
    vector the gradient ``1 / tiny = inf``). ``finite_padding``: the caller knows that padding holds
    finite values (an encoder's output, a centered or gathered batch), so zeroing it first (a select
    over all of ``x``, a scalar loop on the CPU) is not needed; by default it is zeroed first, so NaN
    there does no harm. Real tokens are divided by their norms either way, to the bit."""
    if not finite_padding:
        x = torch.where(mask.unsqueeze(-1), x, 0.0)
    return x / _divisors(x, mask)


def unit_vectors_(x: Tensor, mask: Tensor) -> Tensor:
    """:func:`_unit_vectors` of a finite ``x`` ``[..., D]`` in place (no autograd): each unit of ``mask``
    divided by its norm, every other unit (and a zero vector) made exactly 0; the same values to the
    bit. For a store of token vectors that many batches read (:meth:`TokenArena.transform_
    <torchmover._internal.arena.TokenArena.transform_>`): normalised once, not at every read."""
    return x.div_(_divisors(x, mask))


def _divisors(x: Tensor, mask: Tensor) -> Tensor:
    """``‖x‖`` per unit ``[..., 1]``, ``inf`` at units off ``mask`` and at zero vectors (``x / inf = 0``)."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return torch.where(mask.unsqueeze(-1) & (norm > 0), norm, torch.inf)


def has_direction(x: Tensor, mask: Tensor) -> Tensor:
    """``[N]``: whether each text of ``x`` ``[N, L, D]`` has a unit on ``mask`` whose vector is not 0. A
    text without one (e.g. one token centered on its own mean, or :func:`~torchmover.text.weights.ngrams`'
    zero unit) has no direction to compare: every member scores its pairs 0, like an empty text's —
    the normalised ones because ``C(X, X) = 0`` (module docs), bertscore because every ``S_ij`` is 0,
    and moverscore and the sentence movers, whose zero vectors would cost nothing to move onto each
    other, by this test."""
    return ((x != 0).any(-1) & mask).any(-1)


def _placeholder_for_empty(x: Tensor, mask: Tensor, w: Tensor, empty: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Replace the texts where ``empty`` ``[B]`` by one placeholder unit token (e₀, mass 1) so that all
    arithmetic stays finite; their pairs' scores are set to 0 afterwards. ``x`` must be a fresh
    tensor of the caller's (e.g. from :func:`_unit_vectors`): its first token row is written in place.
    The placeholder's mass is ``1 + w[:, 0]``: 1 for a text without a token of positive mass (all its
    masses are 0); any finite value does where a caller flags a non-empty text (its pair scores 0)."""
    if x.shape[1] == 0:
        x, mask, w = x.new_zeros(x.shape[0], 1, x.shape[2]), mask.new_zeros(mask.shape[0], 1), w.new_zeros(w.shape[0], 1)
    first = torch.nn.functional.pad(empty.unsqueeze(-1), (0, mask.shape[1] - 1))  # [B, L]: token 0 of an empty text
    flag = empty.to(x.dtype)  # [B]
    x[:, 0].mul_((1 - flag).unsqueeze(-1))  # an empty text's first vector: 0 (it may be a zero-mass target) ...
    x[:, 0, 0].add_(flag)  # ... then e₀
    return x, mask | first, w + first.to(w.dtype)


class TokenCloud(NamedTuple):
    """Texts ready to be moved: ``vectors`` ``[N, L, D]`` unit token vectors (exactly 0 at padding),
    ``mask`` ``[N, L]`` the tokens that take part (those of positive mass, plus the zero-mass matching
    targets of :func:`token_cloud`'s ``zero_mass_targets``), ``mass`` ``[N, L]`` their masses (summing
    to 1), and ``empty`` ``[N]``: texts without a token of positive mass, which hold one placeholder
    token ``e₀`` of mass 1 instead, so that all arithmetic stays finite (every pair with an empty text
    scores 0); ``empty`` is None where the caller knew on the host that no text is empty."""

    vectors: Tensor
    mask: Tensor
    mass: Tensor
    empty: Tensor | None

    def select(self, index: Tensor | slice) -> "TokenCloud":
        """The texts ``index``: views for a slice, else one ``index_select`` per field (as
        :meth:`Units.select <torchmover.scorer.units.Units.select>`)."""
        if isinstance(index, slice):
            return TokenCloud._make(None if t is None else t[index] for t in self)
        return TokenCloud._make(None if t is None else t.index_select(0, index) for t in self)

    def narrow(self, width: int) -> "TokenCloud":
        """Every text cut to its first ``width`` tokens (views): the same clouds wherever every token
        of theirs lies within them."""
        return TokenCloud._make(None if t is None else t if t.dim() == 1 else t[:, :width] for t in self)


def token_cloud(x: Tensor, mask: Tensor, weights: Tensor | None = None, *, dtype: torch.dtype | None = None,
                name: str = "weights", zero_mass_targets: bool = False, validate: bool = True,
                nonempty: bool = False, finite_padding: bool = False, unit_vectors: bool = False) -> TokenCloud:
    """The :class:`TokenCloud` of token vectors ``x`` ``[N, L, D]`` with ``mask`` ``[N, L]`` and optional
    non-negative ``weights`` ``[N, L]`` (uniform over real tokens if None), in ``dtype`` (default: ``x``'s
    promoted to at least float32). ``validate=True`` raises for NaN, infinite or negative weights (of
    real tokens), which reads them on the host (one device sync): callers whose weights are masses by
    construction (the :class:`~torchmover.Scorer`'s IDF weights) pass ``False``.

    A token of weight 0 is dropped, unless ``zero_mass_targets``: then it stays in the mask with mass 0,
    a token the other text's tokens can be matched to but which ships nothing itself (bert_score's
    [CLS]/[SEP], and its tokens of IDF 0). Only the matching members (``bertscore``: ``max_j S_ij``;
    ``trwmd``: ``softmax_j``) see such targets; a transport plan with exact marginals sends them nothing.

    ``nonempty=True`` promises that every text has a token of positive mass, as the caller may know on
    the host (the tokenizer's output, with uniform weights): the cloud then has no placeholder and
    ``empty`` is None, which saves a dozen small ops (kernel launches on a GPU) per cloud. The
    promise is not checked: an empty text would then get a wrong score (1 from ``moverscore``).

    ``finite_padding=True`` promises that ``x`` is finite at padding (as an encoder's output is),
    which saves a pass over ``x`` (see :func:`_unit_vectors`); unchecked too: a NaN or inf there
    would make NaN scores. By default padding may hold anything (NaN included).

    ``unit_vectors=True`` promises that ``x`` holds unit vectors already, exactly 0 off ``mask`` (as
    :func:`unit_vectors_` leaves them): they are not normalised again, only the tokens that a zero
    weight drops are zeroed. ``x`` is not modified (it is copied where an empty text needs its
    placeholder).
    """
    if weights is not None and not isinstance(weights, Tensor):
        raise TypeError(f"{name} must be a Tensor of shape {tuple(mask.shape)} or None, got {type(weights).__name__}")
    dtype = dtype or torch.promote_types(x.dtype, torch.float32)
    mass, massive = _masses(mask, None if weights is None else weights.to(dtype), name, dtype, validate, nonempty)
    mask = mask if zero_mass_targets else massive
    if not unit_vectors:
        vectors = _unit_vectors(x.to(dtype), mask, finite_padding)
    elif weights is None or zero_mass_targets:  # the mask is the one x is zero off
        vectors = x.to(dtype) if nonempty else x.to(dtype, copy=True)
    else:
        vectors = torch.where(mask.unsqueeze(-1), x.to(dtype), 0.0)
    if nonempty:
        return TokenCloud(vectors, mask, mass, None)
    empty = ~massive.any(-1)
    return TokenCloud(*_placeholder_for_empty(vectors, mask, mass, empty), empty)


def family_similarity(
    term: TransportTerm | dict[str, TransportTerm], hyp: Tensor, ref: Tensor,
    hyp_mask: Tensor | None = None, ref_mask: Tensor | None = None, *,
    hyp_weights: Tensor | None = None, ref_weights: Tensor | None = None,
    normalize: bool = True, direction: str = "recall", validate: bool = True,
) -> Tensor:
    """``Sim = C(ref, hyp) / sqrt(C(ref, ref) C(hyp, hyp))`` for a transport term ``C``, pair by pair.

    ``term`` is one function, or a dict with ``"recall"`` and ``"precision"`` terms from which
    ``direction`` picks (``"f1"``: their harmonic mean). Computes in at least float32. Returns
    ``[B]``; a pair with an empty text scores exactly 0. ``validate`` (default True) raises for
    NaN, infinite or negative weights; it reads them on the host (a device sync), so pass ``False`` in a training loop
    whose weights are known to be non-negative. Nothing else reads device data.
    """
    hyp_mask, ref_mask = _check_inputs(hyp, ref, hyp_mask, ref_mask)
    dtype = torch.promote_types(torch.promote_types(hyp.dtype, ref.dtype), torch.float32)
    with autocast_off(hyp.device):
        return pair_similarity(term, token_cloud(hyp, hyp_mask, hyp_weights, dtype=dtype, name="hyp_weights",
                                                 validate=validate),
                               token_cloud(ref, ref_mask, ref_weights, dtype=dtype, name="ref_weights",
                                           validate=validate),
                               normalize=normalize, direction=direction)


def pair_similarity(
    term: TransportTerm | dict[str, TransportTerm], hyp: TokenCloud, ref: TokenCloud,
    hyp_index: Tensor | None = None, ref_index: Tensor | None = None, *, normalize: bool = True,
    direction: str = "recall", ref_self: Tensor | None = None,
) -> Tensor:
    """``Sim`` of the pairs ``(hyp[hyp_index[p]], ref[ref_index[p]])`` (aligned rows if the indices
    are None) -> ``[P]``. Texts that take part in several pairs are moved onto themselves once: the
    self-terms ``C(X, X)`` are computed per text of ``hyp`` and ``ref`` and gathered, and
    ``ref_self`` ``[N_ref]`` may supply the references' (e.g. cached across calls, from
    :func:`self_similarity`). Autocast is off inside: the matmuls run in the clouds' dtype. Scores
    are not clamped: their bounds are proved (module docs).
    """
    return pair_similarities(term, hyp, ref, hyp_index, ref_index, normalize=normalize, directions=(direction,),
                             ref_self=ref_self)[direction]


def pair_similarities(
    term: TransportTerm | dict[str, TransportTerm], hyp: TokenCloud, ref: TokenCloud,
    hyp_index: Tensor | None = None, ref_index: Tensor | None = None, *, normalize: bool = True,
    directions: Sequence[str] = ("recall",), ref_self: Tensor | None = None,
) -> dict[str, Tensor]:
    """:func:`pair_similarity` in each of ``directions`` (``{direction: [P]}``) from one pair of clouds,
    each transport term computed once: the ``f1`` of a member without an F1 term of its own is the
    :func:`signed_f1` of the values of its recall and precision terms, ``C_F = F(C_R, C_P)`` for the
    cross and the self terms alike, so asking for precision, recall and F1 together moves each pair
    twice (not four times) and each text onto itself twice (not eight times), with the same scores to
    the bit. ``ref_self`` (the references' self-terms, e.g. cached): with one direction only."""
    if ref_self is not None and len(directions) != 1:
        raise ValueError(f"ref_self holds the self-terms of one direction, got directions {tuple(directions)}")
    terms, combine = _base_terms(term, directions)
    with autocast_off(hyp.vectors.device):
        h = hyp if hyp_index is None else hyp.select(hyp_index)
        r = ref if ref_index is None else ref.select(ref_index)
        cross = combine({name: _cross(fn, r, h) for name, fn in terms.items()})  # first: a diagnosed plan list starts with them
        if normalize:
            if ref_self is None:
                ref_selves = combine({name: _cross(fn, ref, ref) for name, fn in terms.items()})
            else:
                ref_selves = {directions[0]: ref_self}
            hyp_selves = combine({name: _cross(fn, hyp, hyp) for name, fn in terms.items()})
            cross = {d: _normalized(cross[d], ref_selves[d], hyp_selves[d], ref_index, hyp_index) for d in directions}
        flags = [c.empty for c in (h, r) if c.empty is not None]
        if not flags:  # no text is empty
            return cross
        empty = functools.reduce(torch.logical_or, flags)
        return {d: torch.where(empty, torch.zeros_like(c), c) for d, c in cross.items()}


def _normalized(cross: Tensor, ref_self: Tensor, hyp_self: Tensor, ref_index: Tensor | None,
                hyp_index: Tensor | None) -> Tensor:
    """``C(X1, X2) / sqrt(C(X1, X1) C(X2, X2))`` of each pair, the self-terms gathered per pair; 0 where
    the normaliser is rounding noise (module docs)."""
    if ref_index is not None:
        ref_self = ref_self.index_select(0, ref_index)
    if hyp_index is not None:
        hyp_self = hyp_self.index_select(0, hyp_index)
    norm = ref_self * hyp_self  # C(X1, X1) C(X2, X2)
    floor = (64 * torch.finfo(cross.dtype).eps) ** 2  # below: the ratio is rounding noise (module docs)
    return torch.where(norm > floor, cross * norm.clamp_min(floor).rsqrt(), 0.0)


def self_similarity(term: TransportTerm | dict[str, TransportTerm], cloud: TokenCloud,
                    direction: str = "recall") -> Tensor:
    """``C(X, X)`` ``[N]`` of each text of ``cloud`` (the normalisers of :func:`pair_similarity`)."""
    return _cross(_resolve(term, direction), cloud, cloud)


def _resolve(term: TransportTerm | dict[str, TransportTerm], direction: str) -> TransportTerm:
    """The term of ``direction`` (``f1``, unless the member has its own: the :func:`signed_f1` of the
    recall and precision terms)."""
    terms, combine = _base_terms(term, (direction,))
    return lambda *args: combine({name: fn(*args) for name, fn in terms.items()})[direction]


def _base_terms(term: TransportTerm | dict[str, TransportTerm], directions: Sequence[str]):
    """The transport terms that ``directions`` need, by name, and the function that makes each
    direction's value from theirs (``{name: C}`` -> ``{direction: C}``): a member's own term of a
    direction; for ``f1`` without one, the :func:`signed_f1` of the recall and precision terms. A
    single term (not a dict) serves every direction."""
    if not isinstance(term, dict):
        return {"term": term}, lambda values: {d: values["term"] for d in directions}
    for d in directions:
        _check_direction(d)
    names = {d: (d,) if d in term else ("recall", "precision") for d in directions}
    needed = {n: term[n] for d in directions for n in names[d]}

    def combine(values: dict[str, Tensor]) -> dict[str, Tensor]:
        return {d: values[d] if names[d] == (d,) else signed_f1(values["recall"], values["precision"])
                for d in directions}
    return needed, combine


def _cross(term: TransportTerm, x: TokenCloud, y: TokenCloud) -> Tensor:
    """``C(X, Y)`` ``[B]`` of aligned clouds (``x`` rows, ``y`` columns)."""
    return term(x.vectors, y.vectors, x.mask, y.mask, x.mass, y.mass)


def signed_f1(r: Tensor, p: Tensor) -> Tensor:
    """The F1 of the family, for scores of any sign: ``2 r p / (r + p)`` where ``r p > 0``, else 0
    (module docs). Symmetric in ``r`` and ``p``. Autograd-safe: the quotient is taken on a denominator
    replaced by 1 where it is not used, so the untaken branch has a finite gradient (0 reaches it).
    ``2 r p`` underflows where ``|r p|`` is below the dtype's smallest normal number (``|r|, |p| <
    1e-150`` in float64, ``1e-19`` in float32): F1 is then 0 or a subnormal, and its gradient can be
    infinite at the very smallest subnormals, far below any score's rounding."""
    same_sign = ((r > 0) & (p > 0)) | ((r < 0) & (p < 0))
    total = r + p  # has the sign of r and p where they share it, so it is never 0 there
    safe = torch.where(same_sign, total, torch.ones_like(total))
    return torch.where(same_sign, 2 * r * p / safe, torch.zeros_like(total))


def _sim(x: Tensor, y: Tensor) -> Tensor:
    """``[B, L1, L2]`` dot products of the token vectors ``x`` ``[B, L1, D]`` and ``y`` ``[B, L2, D]``: one
    ``bmm`` (``@`` on batched operands dispatches five more ops to reach the same kernel)."""
    return torch.bmm(x, y.transpose(-1, -2))


def _log(w: Tensor) -> Tensor:
    """log of masses; 0 (not −inf) where the mass is 0, those entries are masked anyway."""
    return torch.where(w > 0, w, torch.ones_like(w)).log()


def _log_masses(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`_log` of both sides' masses, once where they are one tensor (a self-term ``C(X, X)``)."""
    log_a = _log(a)
    return log_a, log_a if b is a else _log(b)
