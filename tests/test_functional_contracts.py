"""Contracts of the functional API at its edges: bounds with zero token vectors, weights of any finite
scale, the documented accuracy of the exact solvers on a degenerate LP, and argument checks."""
from __future__ import annotations

import math

import pytest
import torch

import torchmover.functional as F
from torchmover.functional.family import token_cloud
from torchmover.functional.sentences import sentence_movers
from torchmover.functional.transport import CONVERGENCE_TOLERANCE
from torchmover.functional.family import WMD_TEMPERATURE


def test_bertscore_stays_within_its_bound_with_a_zero_token_vector():
    """A zero token vector (e.g. one that centering made 0) matches nothing: bertscore, not normalised
    by default (as the Scorer's member), keeps ``|P|, |R|, |F| ≤ 1``; dividing by the self-term
    ``C(ref, ref) = 1/2`` gave ``P = sqrt(2)``."""
    e1 = torch.tensor([1.0, 0.0, 0.0])
    ref = torch.stack([torch.zeros(3), e1])[None]  # [1, 2, 3]: {0, e1}
    hyp = e1[None, None]  # [1, 1, 3]: {e1}
    p, r, f = F.bertscore(hyp, ref)
    assert (p.item(), r.item()) == pytest.approx((1.0, 0.5), abs=1e-7)  # Σ_j b_j max_i S_ij, Σ_i a_i max_j S_ij
    assert f.item() == pytest.approx(2 / 3, abs=1e-7)
    assert torch.equal(torch.stack(F.bertscore(hyp, ref)), torch.stack(F.bertscore(hyp, ref, normalize=False)))
    # the opt-in normalisation is what its docstring says: P / sqrt(C(ref, ref) C(hyp, hyp)) = 1 / sqrt(1/2)
    assert F.bertscore(hyp, ref, normalize=True)[0].item() == pytest.approx(math.sqrt(2), abs=1e-6)


MEMBERS = {
    "tempered_wmd": F.tempered_wmd,
    "tempered_wmd_f1": lambda *a, **k: F.tempered_wmd(*a, direction="f1", **k),
    "tempered_rwmd": lambda *a, **k: F.tempered_rwmd(*a, direction="precision", **k),
    "wmd": F.wmd,
    "moverscore": F.moverscore,
    "bertscore": lambda *a, **k: torch.stack(F.bertscore(*a, **k)),
    "sbert": F.sbert,
    "cka": F.cka,
}


def _batch(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    ref, hyp = torch.randn(2, 4, 6, generator=g, dtype=dtype), torch.randn(2, 3, 6, generator=g, dtype=dtype)
    # multiples of 1/8 in [1/2, 1] (3 significant bits): scaled by 2^k they stay exact, subnormal too
    rw = torch.randint(4, 9, (2, 4), generator=g).to(dtype) / 8
    hw = torch.randint(4, 9, (2, 3), generator=g).to(dtype) / 8
    return hyp, ref, hw, rw


@pytest.mark.parametrize("name", MEMBERS)
@pytest.mark.parametrize("dtype,scale", [(torch.float32, 2.0 ** 127), (torch.float32, 2.0 ** -140),
                                         (torch.float64, 2.0 ** 1023), (torch.float64, 2.0 ** -1060)])
def test_weights_are_scale_invariant_over_the_whole_range(name, dtype, scale):
    """Masses are ``w / Σ w``, whatever the weights' scale: weights whose sum overflows (3 x 2^127 in
    float32) or is subnormal (2^-140) give the same scores as the same weights near 1, to the bit (the
    scaled weights are exact, and so is the power of two the masses are computed with)."""
    fn = MEMBERS[name]
    hyp, ref, hw, rw = _batch(dtype)
    expected = fn(hyp, ref, hyp_weights=hw, ref_weights=rw)
    got = fn(hyp, ref, hyp_weights=hw * scale, ref_weights=rw * scale)
    assert torch.equal(got, expected), (got, expected)


@pytest.mark.parametrize("name", MEMBERS)
@pytest.mark.parametrize("dtype,scale", [(torch.float32, 1e-16), (torch.float32, 1e16),
                                         (torch.float64, 1e-140), (torch.float64, 1e140)])
def test_vectors_are_scale_invariant_within_their_dtypes_range(name, dtype, scale):
    """Token vectors are normalised in their dtype: scaled by any factor whose squares stay normal
    numbers of it (float32: entries from about 1e-18 to 1e18), a pair scores as the unscaled pair, to
    the dtype's rounding (the converged solvers' iterations carry the unit vectors' last bits further:
    7e-14 in float64)."""
    fn = MEMBERS[name]
    hyp, ref, hw, rw = _batch(dtype)
    expected = fn(hyp, ref, hyp_weights=hw, ref_weights=rw)
    got = fn(hyp * scale, ref * scale, hyp_weights=hw, ref_weights=rw)
    torch.testing.assert_close(got, expected, atol={torch.float32: 1e-6, torch.float64: 1e-12}[dtype], rtol=0)


@pytest.mark.parametrize("name", MEMBERS)
@pytest.mark.parametrize("scale", [1e-25, 1e25])
def test_float32_vectors_whose_norm_overflows_or_underflows_count_as_zero(name, scale):
    """Beyond that range a float32 vector's squared norm underflows to 0 or overflows to inf: the vector
    counts as 0, the documented rule of a zero vector (a text of no direction scores 0); in float64
    the same vectors score as unscaled ones."""
    fn = MEMBERS[name]
    hyp, ref, _, _ = _batch(torch.float32)
    assert torch.equal(fn(hyp * scale, ref), torch.zeros_like(fn(hyp, ref)))
    torch.testing.assert_close(fn(hyp.double() * scale, ref.double()), fn(hyp.double(), ref.double()),
                               atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", MEMBERS)
@pytest.mark.parametrize("value", [1e-45, 1e-40, 3e38])
def test_uniform_weights_of_any_finite_size_are_uniform_masses(name, value):
    """Equal weights are uniform masses, also where they are subnormal (1e-45 is float32's smallest)
    or their sum overflows: the score is the unweighted one (it was 3.38 for twmd at 1e-40)."""
    fn = MEMBERS[name]
    hyp, ref, _, _ = _batch()
    w = torch.full((2, 3), value)
    torch.testing.assert_close(fn(hyp, ref, hyp_weights=w), fn(hyp, ref), rtol=0, atol=1e-6)


@pytest.mark.parametrize("value", [1e-45, 1e-40, 1e-30, 1.0, 3e38])
def test_masses_sum_to_one(value):
    _, ref, _, rw = _batch()
    mask = torch.tensor([[True, True, True, False], [True, False, True, True]])
    mass = token_cloud(ref, mask, rw * value).mass
    torch.testing.assert_close(mass.sum(-1), torch.ones(2), rtol=0, atol=1e-6)
    assert (mass[~mask] == 0).all()


@pytest.mark.parametrize("name", MEMBERS)
def test_weighted_texts_of_no_token_score_zero(name):
    """A batch of texts padded to no column at all (every text empty) with weights ``[B, 0]``: scores 0,
    as an empty text's (the weights' largest, over no column, is not taken)."""
    hyp, ref, _, rw = _batch()
    empty = hyp[:, :0]
    got = MEMBERS[name](empty, ref, torch.zeros(2, 0, dtype=torch.bool), hyp_weights=torch.zeros(2, 0),
                        ref_weights=rw)
    scores = torch.stack(got) if isinstance(got, tuple) else got  # bertscore: (P, R, F)
    assert scores.shape[-1] == 2 and torch.equal(scores, torch.zeros_like(scores))


def test_masses_of_ordinary_weights_are_unchanged_to_the_bit():
    """The rescaling by a power of two is exact: ordinary weights (IDF) give ``w / Σ w`` bit for bit."""
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float64):
        x, w = torch.randn(5, 7, 4, generator=g, dtype=dtype), torch.rand(5, 7, generator=g, dtype=dtype) * 12
        w[0, 3] = 0  # a dropped token
        mask = torch.rand(5, 7, generator=g) > 0.2
        masked = torch.where(mask & (w > 0), w, 0.0)
        assert torch.equal(token_cloud(x, mask, w).mass, masked / masked.sum(-1, keepdim=True))


# --- the exact solvers' documented bound, on a degenerate LP (collinear tokens: S = ±1) --------------------

REF_LINE = torch.tensor([[1.0], [1.0], [-1.0], [1.0]], dtype=torch.float64)[None]  # [1, 4, 1]
HYP_LINE = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)[None]  # [1, 2, 1]
# The LP: the three +1 reference tokens (3/4) send 1/2 to +1 (S = 1) and 1/4 to −1 (S = −1), the −1
# token its 1/4 to −1 (S = 1): C* = 1/2 − 1/4 + 1/4 = 1/2, any split of the +1 tokens optimal. Cost
# ‖x − y‖ = 0 or 2: min Σ π C = 1/2.
LP_SIMILARITY, LP_DISTANCE = 0.5, 0.5
ENTROPIC = WMD_TEMPERATURE * math.log(2)  # T ln min(L1, L2)


def test_wmd_meets_its_lp_bound_on_a_degenerate_lp():
    """``C* − δ − T ln min(L1, L2) ≤ C ≤ C* + δ`` with ``δ ≤ 1e-3`` the marginal error (wmd's
    docstring). This pair is off by δ itself, 9.5e-4: more than the 5e-4 once documented."""
    out = F.wmd(HYP_LINE, REF_LINE, normalize=False, return_plan=True)
    delta = out.plan.marginal_error.item()
    assert out.plan.converged.item() and delta <= CONVERGENCE_TOLERANCE
    c = out.score.item()
    assert LP_SIMILARITY - delta - ENTROPIC <= c <= LP_SIMILARITY + delta
    assert abs(c - LP_SIMILARITY) > 5e-4  # the case that the old documented figure did not cover
    score = F.moverscore(HYP_LINE, REF_LINE).item()  # 1 − cost: the same bound
    assert 1 - LP_DISTANCE - CONVERGENCE_TOLERANCE - ENTROPIC <= score <= 1 - LP_DISTANCE + CONVERGENCE_TOLERANCE


def test_sentence_movers_meet_their_lp_bound_on_a_degenerate_lp():
    """``wms``: ``exp(−·)`` is 1-Lipschitz on distances ≥ 0, so the score is within
    ``δ + T ln min(U1, U2)`` of ``exp(−WMD*)`` (here 5.8e-4 off)."""
    got = sentence_movers(HYP_LINE, REF_LINE, variant="wms").item()
    expected = math.exp(-LP_DISTANCE)
    assert expected - CONVERGENCE_TOLERANCE - ENTROPIC <= got <= expected + CONVERGENCE_TOLERANCE


# --- gradients and directions as documented --------------------------------------------------------------

@pytest.mark.parametrize("fn", [F.wmd, F.moverscore], ids=["wmd", "moverscore"])
def test_converged_members_give_the_weights_no_gradient(fn):
    hyp, ref, hw, rw = _batch()
    hw.requires_grad_(True)
    hyp.requires_grad_(True)
    fn(hyp, ref, hyp_weights=hw, ref_weights=rw).sum().backward()
    assert hw.grad is None and hyp.grad is not None


def test_sms_has_no_direction_where_each_sentence_cancels():
    """A text of one sentence ``{x, −x}``: its words have a direction, its sentence vector is 0. sms
    moves sentence vectors only (no direction: 0), wms and s+wms move the words."""
    x = torch.tensor([1.0, 2.0, 0.5])
    doc = torch.stack([x, -x])[None]  # [1, 2, 3]
    other = torch.randn(1, 3, 3, generator=torch.Generator().manual_seed(0))
    assert sentence_movers(other, doc, variant="sms").item() == 0
    assert sentence_movers(doc, doc, variant="sms").item() == 0
    for variant in ("wms", "s+wms"):
        assert sentence_movers(other, doc, variant=variant).item() > 0


# --- argument checks ---------------------------------------------------------------------------------------

def test_n_iter_rejects_bools():
    x = torch.randn(1, 3, 4)
    for bad in (True, False):
        with pytest.raises(ValueError, match="n_iter"):
            F.tempered_wmd(x, x, n_iter=bad)


def test_masks_must_be_tensors():
    x = torch.randn(1, 3, 4)
    with pytest.raises(TypeError, match="hyp_mask"):
        F.tempered_wmd(x, x, [[True, True, False]])
    with pytest.raises(TypeError, match="ref_mask"):
        F.sbert(x, x, None, [[True, True, False]])


def test_center_checks_its_mask():
    x = torch.randn(2, 3, 4)
    ones = torch.ones
    for bad in (ones(1, 3, dtype=torch.bool), ones(2, 4, dtype=torch.bool), ones(3, dtype=torch.bool)):
        for mode in ("sentence", "batch", "none"):  # a [1, L] mask used to broadcast silently
            with pytest.raises(ValueError, match="mask"):
                F.center(x, bad, mode)
    with pytest.raises(TypeError, match="mask"):
        F.center(x, [[True] * 3] * 2, "batch")
    with pytest.raises(ValueError, match="x must be"):
        F.center(x[0], torch.ones(3, dtype=torch.bool), "batch")
