"""The log-domain Sinkhorn kernels against naive NumPy loops."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from torch.utils._python_dispatch import TorchDispatchMode

from torchmover.functional import transport
from torchmover.functional import tempered_rwmd, tempered_wmd
from torchmover.functional.transport import CHECK_EVERY, converged_sinkhorn, marginal_error, sinkhorn


def naive_masked_lse(x, mask, dim):
    """Loop over the slices of a 2-D array: log Σ exp over the True entries, 0 for an empty slice."""
    x, mask = np.asarray(x), np.asarray(mask)
    if dim in (-1, 1):
        return np.array([[logsumexp(row[m]) if m.any() else 0.0] for row, m in zip(x, mask)])
    return naive_masked_lse(x.T, mask.T, -1).T


def naive_sinkhorn(s, a, b, temperature, n_iter, exact="rows"):
    """Sinkhorn on the real block only (no padding), entry by entry in log space."""
    log_p = s / temperature
    l1, l2 = s.shape
    for _ in range(n_iter):
        for step in (("columns", "rows") if exact == "rows" else ("rows", "columns")):
            if step == "rows":
                for i in range(l1):
                    log_p[i] += math.log(a[i]) - logsumexp(log_p[i])
            else:
                for j in range(l2):
                    log_p[:, j] += math.log(b[j]) - logsumexp(log_p[:, j])
    return log_p


def problem(seed, l1=5, l2=4, batch=3, dtype=torch.float64, weighted=True, dim=6):
    """Unit vectors x [B, L1, D], y [B, L2, D] (zero at padding), pair mask, masses a, b (zero off the mask)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.nn.functional.normalize(torch.randn(batch, l1, dim, generator=g, dtype=torch.float64), dim=-1)
    y = torch.nn.functional.normalize(torch.randn(batch, l2, dim, generator=g, dtype=torch.float64), dim=-1)
    rows = torch.arange(l1) < torch.randint(1, l1 + 1, (batch,), generator=g)[:, None]
    cols = torch.arange(l2) < torch.randint(1, l2 + 1, (batch,), generator=g)[:, None]
    rows[0], cols[0] = True, True
    x, y = x * rows[..., None], y * cols[..., None]
    a = (torch.rand(batch, l1, generator=g, dtype=torch.float64) + 0.2 if weighted else torch.ones(batch, l1, dtype=torch.float64)) * rows
    b = (torch.rand(batch, l2, generator=g, dtype=torch.float64) + 0.2 if weighted else torch.ones(batch, l2, dtype=torch.float64)) * cols
    a, b = a / a.sum(-1, keepdim=True), b / b.sum(-1, keepdim=True)
    mask = rows[:, :, None] & cols[:, None, :]
    return x.to(dtype), y.to(dtype), mask, a.to(dtype), b.to(dtype), rows, cols


def log_of(w):
    return torch.where(w > 0, w, torch.ones_like(w)).log()


@pytest.mark.parametrize("centered", [False, True])
@pytest.mark.parametrize("eps", [1.0, 1e-3])
@pytest.mark.parametrize("dim", [-1, -2])
def test_softmin_is_the_masked_sinkhorn_half_step(dim, eps, centered):
    """The kernel against eq. (1)/(2) written naively: ``G_j = log b_j − LSE_i (M_ij / ε + F_i)`` over the
    real entries, with ``F = f − u / ε`` and ``G = g − v / ε``; finite on the slices without a real entry."""
    g = torch.Generator().manual_seed(0)
    rows, cols = torch.rand(4, 6, generator=g) > 0.3, torch.rand(4, 5, generator=g) > 0.3
    rows[1], cols[2] = False, False  # items without a real row / column: every slice of theirs is empty
    rows[0, 0], cols[0, 0] = True, True
    real = dict(zip((-1, -2), transport.real_sides(rows, cols)))
    sim = torch.rand(4, 6, 5, generator=g, dtype=torch.float64) * 2 - 1
    masked = sim + transport.log_pair_mask(rows, cols, torch.float64)
    other_dim = -3 - dim
    other = transport.Side(torch.rand(real[other_dim].shape, generator=g, dtype=torch.float64),
                           torch.randn(real[other_dim].shape, generator=g, dtype=torch.float64))
    log_mass = torch.randn(real[dim].shape, generator=g, dtype=torch.float64)
    side = transport.softmin(masked, other, eps, dim, real[dim], log_mass, centered)
    assert torch.isfinite(side.potential).all() and torch.isfinite(side.shift).all()
    total = side.potential - side.shift / eps
    other_total = (other.potential - other.shift / eps).unsqueeze(other_dim)
    for k in range(4):
        m = (rows[k][:, None] & cols[k][None, :]).numpy()
        expected = log_mass[k].numpy() - naive_masked_lse((sim[k] / eps + other_total[k]).numpy(), m, dim).squeeze()
        np.testing.assert_allclose(total[k][real[dim][k]].numpy(), expected[real[dim][k].numpy()], rtol=1e-9)


@pytest.mark.parametrize("n_iter", [1, 2, 5])
@pytest.mark.parametrize("exact", ["rows", "columns"])
def test_sinkhorn_matches_naive_loop(exact, n_iter):
    x, y, mask, a, b, rows, cols = problem(1)
    s = x @ y.transpose(-1, -2)
    result = sinkhorn(s, rows, cols, log_of(a), log_of(b), 0.2, n_iter, exact=exact)
    assert (result.n_iter == n_iter).all() and result.log_plan.shape == s.shape
    assert (result.log_plan[~mask] == float("-inf")).all()
    for k in range(s.shape[0]):
        r, c = rows[k], cols[k]
        expected = naive_sinkhorn(s[k][r][:, c].numpy(), a[k][r].numpy(), b[k][c].numpy(), 0.2, n_iter, exact)
        np.testing.assert_allclose(result.log_plan[k][r][:, c].numpy(), expected, rtol=1e-10, atol=1e-10)
    plan = result.plan
    torch.testing.assert_close(plan, result.log_plan.exp())
    if exact == "rows":  # the last step's marginal holds exactly
        torch.testing.assert_close(plan.sum(-1), a)
    else:
        torch.testing.assert_close(plan.sum(-2), b)
    naive_error = (plan.sum(-1) - a).abs().sum(-1) + (plan.sum(-2) - b).abs().sum(-1)
    torch.testing.assert_close(result.marginal_error, naive_error)
    torch.testing.assert_close(result.converged, naive_error <= transport.CONVERGENCE_TOLERANCE)
    torch.testing.assert_close(result.value, (plan * s).sum((-1, -2)))


@pytest.mark.parametrize("temperature", [0.2, 1e-3])
@pytest.mark.parametrize("n_iter", [1, 3])
@pytest.mark.parametrize("exact", ["rows", "columns"])
def test_sinkhorn_value_is_the_plans_value_with_its_gradient(exact, n_iter, temperature):
    """Σ π S without the plan (one softmax for the last step) equals Σ π S of the plan, and so do the
    gradients, also through padded rows and columns (the sims are 0 there, as the family's are)."""
    x, y, mask, a, b, rows, cols = problem(6, l1=6, l2=5, batch=4)
    x.requires_grad_()
    args = (rows, cols, log_of(a), log_of(b), temperature, n_iter)

    def both():
        s = x @ y.transpose(-1, -2)
        return (transport.sinkhorn_value(s, *args, exact=exact),
                sinkhorn(s, *args, exact=exact).value)

    fast, slow = both()
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    (grad_fast,) = torch.autograd.grad(fast.sum(), x)
    (grad_slow,) = torch.autograd.grad(both()[1].sum(), x)
    torch.testing.assert_close(grad_fast, grad_slow, rtol=1e-9, atol=1e-9)
    assert grad_fast[~rows].abs().max() < 1e-30  # e^EXP_FLOOR-sized at most: padding takes no part
    assert torch.autograd.gradcheck(lambda v: transport.sinkhorn_value(v @ y.transpose(-1, -2), *args, exact=exact),
                                    (x.detach().clone().requires_grad_(),))


def test_sinkhorn_rejects_unknown_exact():
    x, y, mask, a, b, rows, cols = problem(2)
    with pytest.raises(ValueError, match="exact"):
        sinkhorn(x @ y.transpose(-1, -2), rows, cols, log_of(a), log_of(b), 0.1, 1, exact="both")


def test_sinkhorn_with_fully_padded_rows_and_columns_is_finite_with_finite_gradient():
    x, y, mask, a, b, rows, cols = problem(3, batch=4)
    rows, mask = rows.clone(), mask.clone()
    rows[1], mask[1] = False, False  # an entirely padded item
    s = (x @ y.transpose(-1, -2)).requires_grad_()
    result = sinkhorn(s, rows, cols, log_of(a), log_of(b), 1e-3, 3)
    value = (result.plan * s).sum()
    assert torch.isfinite(value)
    value.backward()
    assert torch.isfinite(s.grad).all() and (s.grad[~mask] == 0).all()


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("temperature", [0.05, 1e-3])
def test_converged_sinkhorn_reaches_the_entropic_fixed_point(temperature, weighted):
    x, y, mask, a, b, rows, cols = problem(4, l1=6, l2=5, weighted=weighted)
    result = converged_sinkhorn(x @ y.transpose(-1, -2), rows, cols, log_of(a), log_of(b), temperature)
    assert bool(result.converged.all()), result.marginal_error
    assert (result.n_iter % CHECK_EVERY == 0).all() and (result.n_iter < transport.MAX_ITER).all()
    assert bool((result.marginal_error <= transport.CONVERGENCE_TOLERANCE).all())
    torch.testing.assert_close(result.marginal_error,
                               marginal_error(result.log_plan, log_of(a), log_of(b), rows, cols))
    s = x @ y.transpose(-1, -2)
    for k in range(s.shape[0]):
        r, c = rows[k], cols[k]
        sk, ak, bk = s[k][r][:, c].numpy(), a[k][r].numpy(), b[k][c].numpy()
        # Sinkhorn's theorem: the only plan of the form exp(S/T + u_i + v_j) with marginals (a, b).
        # So check the form (the double-centred log π − S/T vanishes) ...
        log_k = result.log_plan[k][r][:, c].numpy() - sk / temperature
        residual = log_k - log_k.mean(0, keepdims=True) - log_k.mean(1, keepdims=True) + log_k.mean()
        assert np.abs(residual).max() < 1e-6 * max(1.0, np.abs(log_k).max())
        if temperature >= 0.01:  # ... and, where plain Sinkhorn is quick, compare with it
            log_p = sk / temperature
            for _ in range(500):
                log_p += np.log(bk)[None, :] - logsumexp(log_p, axis=0, keepdims=True)
                log_p += np.log(ak)[:, None] - logsumexp(log_p, axis=1, keepdims=True)
            np.testing.assert_allclose(result.plan[k][r][:, c].numpy(), np.exp(log_p), atol=2e-3)
            assert abs(float((result.plan[k] * s[k]).sum()) - float((np.exp(log_p) * sk).sum())) < 2e-3


def test_converged_sinkhorn_preserves_grad_mode_and_returns_no_graph():
    x, y, mask, a, b, rows, cols = problem(5)
    x.requires_grad_()
    with torch.no_grad():
        converged_sinkhorn(x @ y.transpose(-1, -2), rows, cols, log_of(a), log_of(b), 0.01)
        assert not torch.is_grad_enabled()
    assert torch.is_grad_enabled()
    sim = x @ y.transpose(-1, -2)
    result = converged_sinkhorn(sim, rows, cols, log_of(a), log_of(b), 0.01)
    assert torch.is_grad_enabled()
    assert not result.log_plan.requires_grad
    (grad,) = torch.autograd.grad(result.value.sum(), sim)  # the envelope gradient: the plan
    torch.testing.assert_close(grad, transport.floored_exp(result.log_plan))


def test_converged_sinkhorn_handles_coincident_points():
    """All points equal (identical one-token texts): a degenerate problem, solved exactly."""
    x = torch.zeros(2, 1, 3, dtype=torch.float64)
    x[..., 0] = 1.0
    real = torch.ones(2, 1, dtype=torch.bool)
    w = torch.ones(2, 1, dtype=torch.float64)
    result = converged_sinkhorn(x @ x.transpose(-1, -2), real, real, w.log(), w.log(), 1e-3)
    torch.testing.assert_close(result.plan, torch.ones(2, 1, 1, dtype=torch.float64))
    assert bool(result.converged.all())


def test_diagnostics_are_opt_in_and_do_not_change_the_plan():
    torch.manual_seed(0)
    sim = torch.randn(2, 4, 5)
    rows, cols = torch.ones(2, 4, dtype=torch.bool), torch.ones(2, 5, dtype=torch.bool)
    log_a, log_b = torch.full((2, 4), -math.log(4)), torch.full((2, 5), -math.log(5))
    full = sinkhorn(sim, rows, cols, log_a, log_b, 0.1, 2)
    lean = sinkhorn(sim, rows, cols, log_a, log_b, 0.1, 2, diagnose=False)
    torch.testing.assert_close(lean.log_plan, full.log_plan)
    assert lean.marginal_error is None and lean.converged is None and full.marginal_error.shape == (2,)


class ExpArguments(TorchDispatchMode):
    """Records the smallest argument of every ``exp`` dispatched (``logsumexp`` decomposes into one),
    and of the ``exp(x − max x)`` inside every softmax."""

    def __init__(self):
        super().__init__()
        self.lowest, self.calls = math.inf, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.exp.default, torch.ops.aten.exp_.default):
            self.lowest, self.calls = min(self.lowest, args[0].min().item()), self.calls + 1
        elif func is torch.ops.aten._softmax.default:
            x, dim = args[0], args[1]
            self.lowest, self.calls = min(self.lowest, (x - x.amax(dim, keepdim=True)).min().item()), self.calls + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("temperature", [0.15, 0.01])
@pytest.mark.parametrize("score", [
    lambda *a, t: tempered_wmd(*a, temperature=t),
    lambda *a, t: tempered_wmd(*a, temperature=t, n_iter=3, direction="f1"),
    lambda *a, t: tempered_rwmd(*a, temperature=t),
], ids=["twmd", "twmd-3-iterations-f1", "trwmd"])
def test_no_exp_argument_on_the_cpu_slow_path(score, temperature):
    """float32 ``exp`` on the CPU is 35-50x slower for arguments below log(finfo.tiny) ≈ -87.3 (subnormal
    or zero results): padding (-inf) and the tails of a small-T plan are floored at ``EXP_FLOOR``
    before every exp (and softmax) of the unrolled solvers, forward and backward."""
    x, y, mask, a, b, rows, cols = problem(3, l1=7, l2=6, batch=4, dtype=torch.float32)
    x.requires_grad_()
    with ExpArguments() as seen:
        score(x, y, rows, cols, t=temperature).sum().backward()
    assert seen.calls > 0 and seen.lowest > math.log(torch.finfo(torch.float32).tiny), seen.lowest


# |⟨π, S⟩ − LP| of the converged plan at T = 1e-3: at most 1.2e-4 on 200 random problems of 1 to 39 tokens a
# side (unit vectors in 16 dimensions, random masses; seeds 0-199 of this test's construction, one problem
# each), float32 and float64 alike (99th percentile 9.3e-5, median 1.7e-5), and at most 4.5e-4 on the 1600
# lower-dimensional pairs of test_functional.py::test_wmd_matches_lp_solver (8 dimensions, more near-ties).
# The rows hold exactly (1.1e-7 in float32), the columns within the solver's tolerance (at most 9.97e-4).
LP_VALUE_TOLERANCE = 5e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_converged_plan_against_the_exact_lp(dtype):
    """Exact WMD: the converged plan at ``T = 1e-3`` (``WMD_TEMPERATURE``) against POT's network simplex
    (``ot.emd2``): its value within LP_VALUE_TOLERANCE of the LP optimum, its rows exact, its columns within
    the solver's tolerance; pairs solved in one padded batch of mixed lengths."""
    ot = pytest.importorskip("ot")
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 40, (24, 2), generator=g)
    x = torch.nn.functional.normalize(torch.randn(24, 39, 16, generator=g, dtype=torch.float64), dim=-1)
    y = torch.nn.functional.normalize(torch.randn(24, 39, 16, generator=g, dtype=torch.float64), dim=-1)
    rows, cols = torch.arange(39) < lengths[:, :1], torch.arange(39) < lengths[:, 1:]
    x, y = x * rows[..., None], y * cols[..., None]
    a = (torch.rand(24, 39, generator=g, dtype=torch.float64) + 0.1) * rows
    b = (torch.rand(24, 39, generator=g, dtype=torch.float64) + 0.1) * cols
    a, b = a / a.sum(-1, keepdim=True), b / b.sum(-1, keepdim=True)
    sim = x @ y.transpose(-1, -2)
    result = converged_sinkhorn(sim.to(dtype), rows, cols, log_of(a).to(dtype), log_of(b).to(dtype), 1e-3)
    assert bool(result.converged.all())
    plan = result.plan.double()
    torch.testing.assert_close(plan.sum(-1), a, atol=1e-6 if dtype == torch.float32 else 1e-12, rtol=0)
    assert ((plan.sum(-2) - b).abs().sum(-1) <= transport.CONVERGENCE_TOLERANCE).all()
    for k in range(24):
        r, c = rows[k], cols[k]
        lp = -ot.emd2(a[k][r].numpy(), b[k][c].numpy(), -sim[k][r][:, c].numpy())
        assert abs(result.value[k].item() - lp) <= LP_VALUE_TOLERANCE, k
