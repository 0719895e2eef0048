"""Every tempered member stays a similarity at any positive temperature (issue 13.1).

``S / T`` is ~1e12 at ``T = 1e-12``: with a single Sinkhorn potential of that size the log-masses are
lost to float32 rounding and scores went above 1. The sweep asserts finite scores and gradients,
``|Sim| <= 1 + 1e-6`` and ``Sim(X, X) = 1`` for every member, direction and iteration count (the
sentence movers, ``exp(−distance)`` of a tempered plan and not normalised, are checked to lie in
[0, 1]); the limit tests check the ``T -> 0`` values against their closed forms.
"""
import pytest
import torch

import torchmover.functional as F
from torchmover.functional.family import family_similarity
from torchmover.functional.members import member_term
from torchmover.functional.transport import MAX_TEMPERATURE, MIN_CONVERGED_TEMPERATURE, MIN_TEMPERATURE, sinkhorn

TEMPERATURES = [MIN_TEMPERATURE, 1e-12, 1e-9, 1e-6, 1e-3, 0.1, 1.0, 1e3, 1e6, MAX_TEMPERATURE]


def clouds(dtype=torch.float32):
    """Two batches of token clouds with padding, an exact duplicate token (ties in S) and a one-token text."""
    g = torch.Generator().manual_seed(0)
    hyp = torch.randn(4, 7, 16, generator=g, dtype=dtype)
    ref = torch.randn(4, 5, 16, generator=g, dtype=dtype)
    ref[:, 3] = ref[:, 1]
    hyp[:, 4] = ref[:, 1]
    hyp_mask = torch.ones(4, 7, dtype=torch.bool)
    ref_mask = torch.ones(4, 5, dtype=torch.bool)
    hyp_mask[1, 5:] = False
    ref_mask[2, 1:] = False
    return hyp, ref, hyp_mask, ref_mask


def members(temperature):
    """(name, f(hyp, ref, hyp_mask, ref_mask)) for every member and direction that takes a temperature."""
    out = []
    for direction in ("recall", "precision", "f1"):
        for n_iter in (1, 3):
            out.append((f"twmd-{direction}-{n_iter}", lambda h, r, hm, rm, d=direction, n=n_iter: F.tempered_wmd(
                h, r, hm, rm, temperature=temperature, n_iter=n, direction=d)))
        out.append((f"trwmd-{direction}", lambda h, r, hm, rm, d=direction: F.tempered_rwmd(
            h, r, hm, rm, temperature=temperature, direction=d)))
    for variant in ("sms", "s+wms", "wms"):
        out.append((variant, lambda h, r, hm, rm, v=variant: F.sentence_movers(
            h, r, hm, rm, torch.arange(h.shape[1]).div(3, rounding_mode="floor").expand(h.shape[:2]),
            torch.arange(r.shape[1]).div(3, rounding_mode="floor").expand(r.shape[:2]),
            variant=v, temperature=temperature, n_iter=2)))
    return out


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_scores_are_bounded_similarities_with_finite_gradients_at_any_temperature(temperature):
    hyp, ref, hyp_mask, ref_mask = clouds()
    for name, score in members(temperature):
        h = hyp.clone().requires_grad_()
        r = ref.clone().requires_grad_()
        s = score(h, r, hyp_mask, ref_mask)
        assert torch.isfinite(s).all(), name
        assert (s.abs() <= 1 + 1e-6).all(), (name, s.tolist())
        s.sum().backward()
        assert torch.isfinite(h.grad).all() and torch.isfinite(r.grad).all(), name
        if name in ("sms", "s+wms", "wms"):
            assert (s >= 0).all(), name
            continue
        own = score(ref, ref, ref_mask, ref_mask)
        torch.testing.assert_close(own, torch.ones_like(own), atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize("variant", ["sms", "s+wms", "wms"])
def test_tempered_sentence_movers_score_a_text_below_1_against_itself_and_1_in_the_limit(variant):
    """``exp(−Σ π C)`` is not normalised: a tempered plan spreads each unit's mass over the other text's
    units, so a text of several units moved onto itself costs more than 0 (documented); the score
    rises to the exact one, 1, as ``T`` falls. A one-unit text (ref 2) has one plan: 1 at every ``T``."""
    _, ref, _, ref_mask = clouds()
    ids = torch.arange(ref.shape[1]).div(3, rounding_mode="floor").expand(ref.shape[:2])
    own = [F.sentence_movers(ref, ref, ref_mask, ref_mask, ids, ids, variant=variant, temperature=t)
           for t in (MAX_TEMPERATURE, 10.0, 1.0, 0.1, 1e-2, 1e-4)]
    exact = F.sentence_movers(ref, ref, ref_mask, ref_mask, ids, ids, variant=variant)
    several = ref_mask.sum(-1) > 1
    torch.testing.assert_close(exact, torch.ones_like(exact), atol=1e-6, rtol=0)
    assert (own[2][several] < 0.9).all() and (own[2][~several] == 1).all()
    assert all((hot <= cold + 1e-6).all() for hot, cold in zip(own, own[1:])), [s.tolist() for s in own]
    torch.testing.assert_close(own[-1], exact, atol=1e-6, rtol=0)


@pytest.mark.parametrize("exact", ["rows", "columns"])
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_sinkhorn_meets_its_exact_marginal_at_any_temperature(exact, temperature):
    hyp, ref, hyp_mask, ref_mask = clouds()
    hyp, ref = torch.nn.functional.normalize(hyp, dim=-1), torch.nn.functional.normalize(ref, dim=-1)
    a = ref_mask / ref_mask.sum(-1, keepdim=True)
    b = hyp_mask / hyp_mask.sum(-1, keepdim=True)
    plan = sinkhorn(ref @ hyp.transpose(-1, -2), ref_mask, hyp_mask, a.log(), b.log(), temperature, 2, exact=exact).plan
    marginal, expected = (plan.sum(-1), a) if exact == "rows" else (plan.sum(-2), b)
    torch.testing.assert_close(marginal, expected.float(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("direction", ["recall", "precision"])
def test_trwmd_at_tiny_temperature_is_bertscore_also_with_ties(direction):
    hyp, ref, hyp_mask, ref_mask = clouds()
    greedy = family_similarity(member_term("bertscore"), hyp, ref, hyp_mask, ref_mask, direction=direction)
    relaxed = F.tempered_rwmd(hyp, ref, hyp_mask, ref_mask, temperature=1e-12, direction=direction)
    torch.testing.assert_close(relaxed, greedy, atol=1e-6, rtol=0)


@pytest.mark.parametrize("direction", ["recall", "precision", "f1"])
def test_twmd_limit_is_reached_in_float32_as_in_float64(direction):
    """Below the smallest gap between similarities the one-iteration plan no longer moves: float32 at
    T = 1e-12 equals float64 at T = 1e-7 (the gaps of these random clouds are far above 1e-7)."""
    hyp, ref, hyp_mask, ref_mask = clouds(torch.float64)
    limit = F.tempered_wmd(hyp, ref, hyp_mask, ref_mask, temperature=1e-7, direction=direction)
    tiny = F.tempered_wmd(hyp.float(), ref.float(), hyp_mask, ref_mask, temperature=1e-12, direction=direction)
    torch.testing.assert_close(tiny.double(), limit, atol=1e-6, rtol=0)


@pytest.mark.parametrize("temperature", [1e-3, 1.0, 1e3])
def test_twmd_gradient_passes_gradcheck(temperature):
    hyp, ref, hyp_mask, ref_mask = clouds(torch.float64)
    hyp, ref = hyp[:2, :4].requires_grad_(), ref[:2, :3].requires_grad_()
    for direction in ("recall", "f1"):
        assert torch.autograd.gradcheck(lambda h, r: F.tempered_wmd(
            h, r, temperature=temperature, n_iter=2, direction=direction), (hyp, ref))
        assert torch.autograd.gradcheck(lambda h, r: F.tempered_rwmd(
            h, r, temperature=temperature, direction=direction), (hyp, ref))


def test_temperatures_outside_the_range_are_rejected_by_every_entry_point(tiny_encoder):
    """Below float32's smallest normal number, and above 1e30 (infinity included: it gave Sim(X, X) = 0
    from twmd's one iteration, 0 from wmd and NaN from moverscore), and anything but a real number."""
    from torchmover import Scorer

    hyp, ref, _, _ = clouds()
    ids = torch.zeros(hyp.shape[:2], dtype=torch.long), torch.zeros(ref.shape[:2], dtype=torch.long)
    for bad, match in [*((t, "temperature must be positive and finite") for t in
                         (MIN_TEMPERATURE / 10, 0.0, -1.0, float("nan"), MAX_TEMPERATURE * 10, float("inf"))),
                       *((t, "temperature must be a positive number") for t in ("0.1", True, torch.tensor(0.1)))]:
        for call in (lambda: F.tempered_wmd(hyp, ref, temperature=bad), lambda: F.tempered_rwmd(hyp, ref, temperature=bad),
                     lambda: F.wmd(hyp, ref, temperature=bad), lambda: F.moverscore(hyp, ref, temperature=bad),
                     lambda: F.sentence_movers(hyp, ref, None, None, *ids, temperature=bad),
                     lambda: Scorer(tiny_encoder, temperature=bad)):
            with pytest.raises(ValueError, match=match):
                call()


def test_converged_solver_rejects_temperatures_below_its_range():
    hyp, ref, _, _ = clouds()
    with pytest.raises(ValueError, match="temperature must be >= 1e-05"):
        F.tempered_wmd(hyp, ref, temperature=MIN_CONVERGED_TEMPERATURE / 10, n_iter=None)
    with pytest.raises(ValueError, match="temperature"):
        F.wmd(hyp, ref, temperature=1e-9)
    assert torch.isfinite(F.tempered_wmd(hyp, ref, temperature=1e-3, n_iter=None)).all()


def test_scorer_at_tiny_temperature_scores_like_its_limit(tiny_encoder):
    from torchmover import Scorer

    hyps, refs = ["the cat sat on the mat", "hello hello world"], ["a cat is on the mat", "hello world"]
    for direction in ("recall", "f1"):
        tiny = Scorer(tiny_encoder, temperature=1e-10, direction=direction)(hyps, refs)
        small = Scorer(tiny_encoder, temperature=1e-7, direction=direction)(hyps, refs)
        assert (tiny.abs() <= 1 + 1e-6).all()
        torch.testing.assert_close(tiny, small, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="temperature"):
        Scorer(tiny_encoder, temperature=1e-7, n_iter=None)
