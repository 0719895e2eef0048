"""Sentence movers: Sentence Mover's Similarity (SMS), S+WMS and WMS on contextual token vectors.

Clark, Celikyilmaz & Smith (2019), "Sentence Mover's Similarity: Automatic Evaluation for
Multi-Sentence Texts" (ACL). A document ``A`` is a bag of units — its words, its sentences, or
both — each with a mass; the distance of two documents is the earth mover's distance between their
bags under the Euclidean ground cost, and the similarity is ``exp(−distance)``:

    word units      x_w = unit token vector,                       mass 1 / |A|          (WMS)
    sentence units  x_s = mean of the word vectors of sentence s,  mass |s| / |A|        (SMS)
    union           both, with masses 1 / (2|A|) and |s| / (2|A|)                          (S+WMS)

    WMD(A, B) = min_{π ≥ 0, π1 = a, πᵀ1 = b} Σ_ij π_ij ‖x_i − y_j‖,     Sim(A, B) = exp(−WMD(A, B))

``|A|`` is the number of real tokens of ``A`` and ``|s|`` that of sentence ``s``. The paper's
word masses are ``count(w) / |A|`` per word type; with contextual vectors every token is its own
unit with mass ``1 / |A|``, which is the same thing whenever equal words have equal vectors.

The documents come as padded token vectors with the sentence index of every token
(:func:`torchmover.text.documents.encode_documents` makes them from texts); :func:`sentence_movers`
scores a padded batch of them, differentiable w.r.t. the vectors.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..runtime.devices import autocast_off
from .family import (WMD_TEMPERATURE, _check_inputs, _log_masses, _placeholder_for_empty, _unit_vectors,
                     has_direction)
from .transport import check_temperature, converged_sinkhorn, cost_matrix, sinkhorn

__all__ = ["sentence_movers", "VARIANTS"]


VARIANTS = ("sms", "s+wms", "wms")


def sentence_movers(
    hyp: Tensor, ref: Tensor, hyp_mask: Tensor | None = None, ref_mask: Tensor | None = None,
    hyp_sentence_ids: Tensor | None = None, ref_sentence_ids: Tensor | None = None, *,
    variant: str = "sms", temperature: float | None = None, n_iter: int = 1,
) -> Tensor:
    """Sentence Mover's Similarity ``exp(−WMD)`` of Clark et al. (2019), ``[B]``.

    Args:
        hyp: ``[B, L2, D]`` hypothesis token vectors (centred by the caller if wanted).
        ref: ``[B, L1, D]`` reference token vectors.
        hyp_mask, ref_mask: ``[B, L2]``, ``[B, L1]`` True for real tokens (default: all real).
        hyp_sentence_ids, ref_sentence_ids: ``[B, L2]``, ``[B, L1]`` sentence index of each token
            (:attr:`DocumentEmbeddings.sentence_ids`); a token with a negative id is not real.
            ``None``: the whole text is one sentence.
        variant: ``"sms"`` (sentence units), ``"wms"`` (word units) or ``"s+wms"`` (both).
        temperature: ``None`` for the exact distance; a float for the tempered variant.
        n_iter: Sinkhorn iterations of the tempered variant.

    Token vectors are L2-normalised and used as the word vectors ``x_w``; a sentence's vector is the
    mean ``x_s = (1/|s|) Σ_{w∈s} x_w`` (not re-normalised). Word units weigh ``1/|A|``, sentence
    units ``|s|/|A|`` (``|A|`` real tokens in the document, ``|s|`` in the sentence); in ``s+wms``
    both halved, so each side's masses sum to 1. With ``C_ij = ‖x_i − y_j‖`` between reference
    units ``i`` (masses ``a``) and hypothesis units ``j`` (masses ``b``):

        WMD = Σ_ij π_ij C_ij,        score = exp(−WMD)

    * ``temperature=None``: ``π`` is the entropic optimum at ``T = 1e-3`` solved to convergence
      (:func:`~torchmover.functional.transport.converged_sinkhorn` with the Euclidean cost), each pair
      solved on its own; the gradient is the envelope gradient ``∂WMD/∂C = π*`` (plan held constant).
      Its marginal error ``δ ≤ 1e-3`` bounds its distance from the LP's ``WMD*`` as in
      :func:`~torchmover.functional.wmd` (units have norms ``≤ 1``, so ``C`` lies in ``[0, 2]``):
      ``WMD* − δ ≤ WMD ≤ WMD* + δ + T ln min(U1, U2)`` over ``U1``, ``U2`` units, and ``exp(−·)`` is
      1-Lipschitz on distances ``≥ 0``, so the score is within as much of the LP's (measured: 5.8e-4
      for ``wms`` on collinear tokens: ``tests/test_functional_contracts.py``).
    * ``temperature=T``: ``π`` is ``n_iter`` log-domain Sinkhorn iterations from the Gibbs plan
      ``log π⁰ = −C / T`` (columns, then rows: every reference unit ships exactly its mass),
      unrolled, so the gradient is exact.

    A single-sentence text has one SMS unit: its score is ``exp(−‖mean(x) − mean(y)‖)``.
    ``Sim(X, X) = 1`` up to the solver's accuracy with ``temperature=None``. The score is not
    normalised: a tempered plan spreads each unit's mass over the other text's units, so a text of
    several units scores below 1 against itself, the more so the higher ``T`` (about 0.5–0.8 at
    ``T = 1``), and 1 in the limit ``T → 0``. A pair with an empty text (no real token on either
    side), or with a text of no direction, scores exactly 0, with zero (finite) gradient. A text is
    of no direction where every unit it moves is 0
    (:func:`~torchmover.functional.family.has_direction`): for ``sms`` every sentence vector, which
    happens also where its word vectors are not 0 but cancel within each sentence (e.g. one sentence
    ``{x, −x}``); for ``wms`` and ``s+wms`` every word vector (a sentence vector is the mean of its
    word vectors, so it is 0 where they all are). Computed in at least float32.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> x, ids = torch.randn(2, 5, 8, dtype=torch.float64), torch.tensor([[0, 0, 1, 1, 1]] * 2)
        >>> mask = torch.tensor([[True] * 5, [False] * 5])  # the second text is empty
        >>> sentence_movers(x, x, mask, mask, ids, ids, variant="s+wms").round(decimals=6).tolist()
        [1.0, 0.0]
    """
    with autocast_off(hyp.device):
        return _sentence_movers(hyp, ref, hyp_mask, ref_mask, hyp_sentence_ids, ref_sentence_ids,
                                variant, temperature, n_iter)


def _sentence_movers(hyp, ref, hyp_mask, ref_mask, hyp_sentence_ids, ref_sentence_ids, variant, temperature, n_iter):
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if temperature is not None:
        check_temperature(temperature)
        if isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 1:
            raise ValueError(f"n_iter must be a positive int, got {n_iter!r}")
    hyp_mask, ref_mask = _check_inputs(hyp, ref, hyp_mask, ref_mask)
    dtype = torch.promote_types(torch.promote_types(hyp.dtype, ref.dtype), torch.float32)
    x, mx, a = _units(ref.to(dtype), ref_mask, ref_sentence_ids, variant, "ref_sentence_ids")  # [B, U1, D]
    y, my, b = _units(hyp.to(dtype), hyp_mask, hyp_sentence_ids, variant, "hyp_sentence_ids")  # [B, U2, D]
    empty = ~(has_direction(x, mx) & has_direction(y, my))  # [B]  pairs with an empty (or directionless) text:
    keep = ~empty.unsqueeze(-1)  # one placeholder unit a side, mass 1 (not 1 + the other text's mass: a balanced
    # problem, which converges at once)
    mx, a, my, b = mx & keep, a * keep, my & keep, b * keep
    x, mx, a = _placeholder_for_empty(x, mx, a, empty)
    y, my, b = _placeholder_for_empty(y, my, b, empty)
    cost = cost_matrix(x, y, "euclidean")  # [B, U1, U2]  C_ij = ‖x_i − y_j‖
    if temperature is None:  # the plan without a graph: the envelope gradient
        distance = -converged_sinkhorn(-cost, mx, my, *_log_masses(a, b), WMD_TEMPERATURE).value  # [B]  WMD = Σ π C
    else:
        plan = sinkhorn(-cost, mx, my, *_log_masses(a, b), float(temperature), n_iter, exact="rows",
                       diagnose=False).plan
        distance = (plan * cost).sum((-1, -2))  # [B]  WMD = Σ π C
    score = torch.exp(-distance)
    return torch.where(empty, torch.zeros_like(score), score)


def _units(x: Tensor, mask: Tensor, sentence_ids: Tensor | None, variant: str, name: str):
    """Unit vectors ``[B, U, D]``, their mask ``[B, U]`` and masses ``[B, U]`` (summing to 1 over a
    non-empty document) for one side: words (``U = L``), sentences (``U = S``) or both (``L + S``)."""
    if sentence_ids is None:
        sentence_ids = torch.zeros(mask.shape, dtype=torch.long, device=mask.device)
    elif (not isinstance(sentence_ids, Tensor) or sentence_ids.shape != mask.shape
          or sentence_ids.is_floating_point() or sentence_ids.dtype == torch.bool):
        got = f"{sentence_ids.dtype} {tuple(sentence_ids.shape)}" if isinstance(sentence_ids, Tensor) else type(sentence_ids)
        raise ValueError(f"{name} must be an integer tensor of shape {tuple(mask.shape)}, got {got}")
    sentence_ids = sentence_ids.to(device=mask.device, dtype=torch.long)
    valid = mask & (sentence_ids >= 0)  # [B, L]
    words = _unit_vectors(x, valid)  # [B, L, D]  x_w
    size = valid.sum(-1, keepdim=True).clamp_min(1).to(x.dtype)  # [B, 1]  |A|
    word_mass = valid.to(x.dtype) / size  # [B, L]  1/|A|
    if variant == "wms":
        return words, valid, word_mass
    ids = sentence_ids.masked_fill(~valid, 0)
    n_sentences = int(ids.max()) + 1 if ids.numel() else 1
    member = torch.nn.functional.one_hot(ids, n_sentences).to(x.dtype) * valid.unsqueeze(-1)  # [B, L, S]
    counts = member.sum(1)  # [B, S]  |s|
    sentences = member.transpose(1, 2) @ words / counts.clamp_min(1).unsqueeze(-1)  # [B, S, D]  x_s
    sentence_mask, sentence_mass = counts > 0, counts / size  # [B, S]  |s|/|A|
    if variant == "sms":
        return sentences, sentence_mask, sentence_mass
    return (torch.cat([words, sentences], 1), torch.cat([valid, sentence_mask], 1),
            torch.cat([word_mass, sentence_mass], 1) / 2)
