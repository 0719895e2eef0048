import numpy as np
import ot
import pytest
import torch

import torchmover.functional as F


def lp_moverscore(hyp, ref, hyp_w, ref_w):
    """1 − EMD with Euclidean cost between unit vectors, solved by the LP (POT)."""
    h = hyp / np.linalg.norm(hyp, axis=-1, keepdims=True)
    r = ref / np.linalg.norm(ref, axis=-1, keepdims=True)
    cost = np.linalg.norm(r[:, None] - h[None], axis=-1)
    return 1.0 - ot.emd2(ref_w / ref_w.sum(), hyp_w / hyp_w.sum(), cost)


@pytest.mark.parametrize("l1,l2", [(3, 3), (6, 4), (9, 11)])
def test_moverscore_agrees_with_the_lp(l1, l2):
    rng = np.random.default_rng(l1 * 100 + l2)
    hyp, ref = rng.normal(size=(2, l2, 12)), rng.normal(size=(2, l1, 12))
    hyp_w, ref_w = rng.uniform(0.1, 2, size=(2, l2)), rng.uniform(0.1, 2, size=(2, l1))
    got = F.moverscore(torch.tensor(hyp), torch.tensor(ref), hyp_weights=torch.tensor(hyp_w),
                       ref_weights=torch.tensor(ref_w))
    expected = [lp_moverscore(hyp[b], ref[b], hyp_w[b], ref_w[b]) for b in range(2)]
    np.testing.assert_allclose(got.numpy(), expected, atol=5e-4)  # the LP figure of test_functional.py::test_wmd_matches_lp_solver


def test_moverscore_of_a_text_with_itself_is_one_and_empty_is_zero():
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1] = False
    torch.testing.assert_close(F.moverscore(x, x, mask, torch.ones_like(mask)), torch.tensor([1.0, 0.0], dtype=torch.float64), atol=2e-3, rtol=0)


def test_moverscore_reports_its_plan_and_has_finite_gradients():
    hyp = torch.randn(3, 4, 8, requires_grad=True)
    ref = torch.randn(3, 6, 8)
    result = F.moverscore(hyp, ref, return_plan=True)
    assert result.plan.converged.all() and (result.plan.n_iter >= 0).all()
    result.score.sum().backward()
    assert torch.isfinite(hyp.grad).all() and hyp.grad.abs().sum() > 0


def test_identical_long_texts_score_exactly_one():
    """Distances between identical points are 0 also for long padded batches (cdist's matmul path is not)."""
    x = torch.nn.functional.normalize(torch.randn(2, 40, 16), dim=-1)
    torch.testing.assert_close(F.moverscore(x, x), torch.ones(2), atol=1e-5, rtol=0)
