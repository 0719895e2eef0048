"""pair_similarity: self-terms once per text, gathered by index, equal to scoring every pair on its own;
pair_similarities: every direction from each transport term computed once; the ops a term issues."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from optrace import OpTrace

import torchmover.functional.family as family
from torchmover.functional.family import (family_similarity, pair_similarities, pair_similarity, self_similarity,
                                          token_cloud)
from torchmover.functional.members import MEMBERS, member_term

TOKEN_MEMBERS = [name for name, m in MEMBERS.items() if not m.documents]
UNNORMALIZED = [name for name in TOKEN_MEMBERS if not MEMBERS[name].normalized]
CASES = [(m, d) for m in TOKEN_MEMBERS for d in (("recall", "precision", "f1") if MEMBERS[m].directed else ("recall",))]
TEMPERATURES = {"twmd": 0.1, "trwmd": 0.15}


def texts(seed, n, length, dim=5, empty=None):
    """``n`` random texts ``[n, length, dim]`` (float64) of random lengths, NaN in the padding,
    positive weights; text ``empty`` has no token."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, length, dim, generator=g, dtype=torch.float64)
    mask = torch.arange(length) < torch.randint(1, length + 1, (n,), generator=g)[:, None]
    if empty is not None:
        mask[empty] = False
    weights = torch.rand(n, length, generator=g, dtype=torch.float64) + 0.1
    return x.masked_fill(~mask[..., None], float("nan")), mask, weights


def term_of(method):
    return member_term(method, TEMPERATURES.get(method), 2)


@pytest.mark.parametrize("method,direction", CASES)
def test_indexed_pairs_equal_pairs_scored_one_by_one(method, direction):
    """Hypothesis 1 and reference 0 are in several pairs, reference 2 is empty."""
    hyp, hyp_mask, hyp_w = texts(0, 3, 4)
    ref, ref_mask, ref_w = texts(1, 3, 6, empty=2)
    hyp_index, ref_index = torch.tensor([1, 0, 1, 2, 1]), torch.tensor([0, 0, 2, 1, 0])
    normalize = method not in UNNORMALIZED
    term = term_of(method)
    got = pair_similarity(term, token_cloud(hyp, hyp_mask, hyp_w), token_cloud(ref, ref_mask, ref_w),
                          hyp_index, ref_index, normalize=normalize, direction=direction)
    expected = family_similarity(term, hyp[hyp_index], ref[ref_index], hyp_mask[hyp_index], ref_mask[ref_index],
                                 hyp_weights=hyp_w[hyp_index], ref_weights=ref_w[ref_index],
                                 normalize=normalize, direction=direction)
    tolerance = 1e-12 if method not in ("wmd", "moverscore") else 1e-6  # converged solvers: stopping point
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=0)
    assert got[2] == 0 and not got.isnan().any()


@pytest.mark.parametrize("method,direction", [c for c in CASES if c[0] not in UNNORMALIZED])
def test_supplied_reference_self_terms_are_used(method, direction):
    hyp, hyp_mask, _ = texts(2, 2, 4)
    ref, ref_mask, _ = texts(3, 2, 5)
    term = term_of(method)
    hyps, refs = token_cloud(hyp, hyp_mask), token_cloud(ref, ref_mask)
    ref_self = self_similarity(term, refs, direction)
    index = torch.tensor([0, 1, 1])
    plain = pair_similarity(term, hyps, refs, index, index, direction=direction)
    supplied = pair_similarity(term, hyps, refs, index, index, direction=direction, ref_self=ref_self)
    halved = pair_similarity(term, hyps, refs, index, index, direction=direction, ref_self=ref_self * 4)
    torch.testing.assert_close(supplied, plain, atol=1e-12, rtol=0)
    torch.testing.assert_close(halved, plain / 2, atol=1e-12, rtol=0)  # Sim ∝ C(ref, ref)^(-1/2) (inside [-1, 1])


def test_gradient_through_shared_texts():
    """A text in several pairs receives the sum of their gradients (gradcheck, float64)."""
    hyp, hyp_mask, _ = texts(4, 2, 3)
    ref, ref_mask, _ = texts(5, 2, 4)
    hyp, ref = hyp.nan_to_num(0.0).requires_grad_(), ref.nan_to_num(0.0).requires_grad_()
    hyp_index, ref_index = torch.tensor([0, 1, 0]), torch.tensor([1, 1, 0])

    def f(h, r):
        return pair_similarity(term_of("twmd"), token_cloud(h, hyp_mask), token_cloud(r, ref_mask),
                               hyp_index, ref_index, direction="f1")

    assert torch.autograd.gradcheck(f, (hyp, ref))


@pytest.mark.parametrize("method", UNNORMALIZED)
def test_unnormalized_members_have_unit_self_terms(method):
    """The members whose self-terms the scorer skips: C(X, X) = 1 for every text, every direction."""
    x, mask, weights = texts(3, 4, 6)
    cloud = token_cloud(x, mask, weights)
    for direction in ("recall", "precision", "f1") if MEMBERS[method].directed else ("recall",):
        torch.testing.assert_close(self_similarity(term_of(method), cloud, direction), torch.ones(4, dtype=x.dtype),
                                   atol=1e-6 if method == "moverscore" else 1e-12, rtol=0)


def test_bertscore_f1_term_is_the_harmonic_mean_of_its_recall_and_precision():
    """One similarity matrix for both directions gives what two separate matchings give."""
    hyp, ref = token_cloud(*texts(4, 3, 5)), token_cloud(*texts(5, 3, 7))
    terms = member_term("bertscore")
    args = (ref.vectors, hyp.vectors, ref.mask, hyp.mask, ref.mass, hyp.mass)
    r, p = terms["recall"](*args), terms["precision"](*args)
    torch.testing.assert_close(terms["f1"](*args), 2 * r * p / (r + p), atol=1e-15, rtol=0)


@pytest.mark.parametrize("method,direction", CASES)
def test_clouds_known_nonempty_score_as_the_placeholder_clouds(method, direction):
    """``nonempty=True`` (every text has a token, known on the host): no placeholder, ``empty`` None,
    the same scores, to the bit; with one side flagged only, the other side's empty text still scores 0."""
    hyp_args, ref_args = texts(3, 4, 5), texts(4, 3, 6)
    hyp_index, ref_index = torch.tensor([0, 1, 2, 3, 1]), torch.tensor([2, 0, 1, 1, 0])
    term = term_of(method)

    def score(hyp, ref):
        return pair_similarity(term, hyp, ref, hyp_index, ref_index, normalize=method not in UNNORMALIZED,
                               direction=direction)
    known = token_cloud(*hyp_args, nonempty=True), token_cloud(*ref_args, nonempty=True)
    assert known[0].empty is None and known[0].select(torch.tensor([1, 0])).empty is None
    assert torch.equal(score(*known), score(token_cloud(*hyp_args), token_cloud(*ref_args)))
    with_empty = texts(4, 3, 6, empty=1)
    got = score(known[0], token_cloud(*with_empty))
    assert torch.isfinite(got).all() and (got[ref_index == 1] == 0).all()
    if direction != "f1":  # the signed F1 is 0 where precision and recall differ in sign, as random clouds may
        assert (got[ref_index != 1] != 0).all()


@pytest.mark.parametrize("weighted", [False, True])
def test_clouds_of_finite_padding_are_the_clouds_of_any_padding(weighted):
    """``finite_padding=True`` (padding finite, as an encoder's output): no select over the vectors,
    the same cloud, to the bit (zeros at padding, of either sign), whatever finite values padding holds,
    huge ones included."""
    x, mask, weights = texts(6, 4, 7)
    garbage = torch.randn(x.shape, generator=torch.Generator().manual_seed(0), dtype=x.dtype)
    garbage[::2] *= 1e300  # every other text: norms overflowing to inf
    finite = torch.where(mask[..., None], x, garbage)
    w = weights if weighted else None
    default, fast = token_cloud(x, mask, w), token_cloud(finite, mask, w, finite_padding=True)
    for a, b in zip(default[:3], fast[:3]):
        assert torch.equal(a, b)
    assert torch.equal(default.empty, fast.empty)
    assert (fast.vectors[~mask] == 0).all() and torch.isfinite(fast.vectors).all()


@pytest.mark.parametrize("method", [m for m in TOKEN_MEMBERS if MEMBERS[m].directed])
def test_every_direction_at_once_equals_each_alone_with_each_term_computed_once(method, monkeypatch):
    """Precision, recall and F1 together: the scores of each direction alone, to the bit (an empty
    reference included), from two cross terms and four self terms (each alone: 1 + 2 for P and for R,
    2 + 4 for an F1 made of them)."""
    hyp, hyp_mask, hyp_w = texts(4, 3, 4)
    ref, ref_mask, ref_w = texts(5, 3, 6, empty=2)
    hyps, refs = token_cloud(hyp, hyp_mask, hyp_w), token_cloud(ref, ref_mask, ref_w)
    hyp_index, ref_index = torch.tensor([1, 0, 1, 2, 1]), torch.tensor([0, 0, 2, 1, 0])
    term, normalize = term_of(method), method not in UNNORMALIZED
    alone = {d: pair_similarity(term, hyps, refs, hyp_index, ref_index, normalize=normalize, direction=d)
             for d in ("precision", "recall", "f1")}
    calls = []
    cross = family._cross
    monkeypatch.setattr(family, "_cross", lambda *args: calls.append(1) or cross(*args))
    together = pair_similarities(term, hyps, refs, hyp_index, ref_index, normalize=normalize,
                                 directions=("precision", "recall", "f1"))
    for d in alone:
        assert torch.equal(together[d], alone[d]), d
    own_f1 = isinstance(term, dict) and "f1" in term
    assert len(calls) == (3 if own_f1 else 2) * (3 if normalize else 1)
    with pytest.raises(ValueError, match="ref_self holds the self-terms of one direction"):
        pair_similarities(term, hyps, refs, directions=("precision", "recall"), ref_self=torch.ones(3))


def test_unit_vectors_in_place_equal_the_out_of_place_ones_to_the_bit():
    torch.manual_seed(0)
    x, mask = torch.randn(4, 6, 5), torch.rand(4, 6) > 0.3
    x[0, 1] = 0.0  # a zero vector of a real token: stays 0
    mask[0, 1] = True
    expected = family._unit_vectors(x, mask, finite_padding=True)
    got = x.clone()
    assert family.unit_vectors_(got, mask) is got and torch.equal(got, expected)
    assert torch.equal(got[~mask], torch.zeros_like(got[~mask]))


@pytest.mark.parametrize("weights", ["uniform", "with zeros"])
@pytest.mark.parametrize("zero_mass_targets", [False, True])
@pytest.mark.parametrize("nonempty", [False, True])
def test_a_cloud_of_unit_vectors_equals_the_cloud_of_the_raw_vectors(weights, zero_mass_targets, nonempty):
    """``token_cloud(unit_vectors=True)`` of vectors normalised once (:func:`unit_vectors_`) is the cloud
    of the raw vectors, field by field, to the bit: the tokens a zero weight drops are zeroed, an empty
    text gets its placeholder, and the vectors passed in are not modified."""
    torch.manual_seed(1)
    x, mask = torch.randn(4, 6, 5), torch.rand(4, 6) > 0.3
    mask[:, 0] = True
    w = None
    if weights == "with zeros":
        w = torch.rand(4, 6) * (torch.rand(4, 6) > 0.4)
        w[:, 0] = 1.0
    if not nonempty:
        mask[2] = False  # an empty text
    units = family.unit_vectors_(x.clone(), mask)
    kept = units.clone()
    options = dict(zero_mass_targets=zero_mass_targets, nonempty=nonempty, validate=False)
    got = family.token_cloud(units, mask, w, unit_vectors=True, **options)
    expected = family.token_cloud(x, mask, w, finite_padding=True, **options)
    for a, b in zip(got, expected):
        assert (a is None and b is None) or torch.equal(a, b)
    assert torch.equal(units, kept)


def test_a_twmd_term_takes_one_bmm_and_a_self_term_each_side_once():
    """Launches a term issues (each op is a kernel launch on a GPU): the similarities are one ``bmm``
    of the vectors and the other side's transpose (``@`` on batched operands issues five more ops for
    the same kernel), and a self-term ``C(X, X)``, whose two sides are one cloud, computes what it
    needs of a side once: the logs of the masses, the log of the mask, the real rows."""
    torch.manual_seed(0)
    x, y = torch.randn(3, 5, 8), torch.randn(3, 4, 8)
    mask_x, mask_y = torch.rand(3, 5) > 0.3, torch.rand(3, 4) > 0.3
    a, b = mask_x / mask_x.sum(-1, keepdim=True).clamp_min(1), mask_y / mask_y.sum(-1, keepdim=True).clamp_min(1)
    term = member_term("twmd", 0.1, 1)["recall"]
    with OpTrace() as cross:
        term(x, y, mask_x, mask_y, a, b)
    with OpTrace() as self_term:
        term(x, x, mask_x, mask_x, a, a)
    names = [op.name for op in cross.ops]
    assert names.count("aten::bmm") == 1 and not {"aten::expand", "aten::_unsafe_view"} & set(names)
    once = Counter(op.name for op in cross.ops) - Counter(op.name for op in self_term.ops)
    assert once == Counter(["aten::gt.Scalar", "aten::ones_like", "aten::where.self", "aten::log",  # log masses
                            "aten::full", "aten::masked_fill_.Scalar",  # log of the mask
                            "aten::any.dim", "aten::bitwise_and.Tensor"])  # real rows
    assert len(self_term.ops) == len(cross.ops) - 8
