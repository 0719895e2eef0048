"""Entropic optimal transport between two token clouds, in the log domain: one kernel, one loop.

The problem. For a gain matrix ``M`` (``[B, L1, L2]``: similarities ``S``, or a ground cost with its
sign flipped, ``−C``) between the real rows ``rows`` (``[B, L1]``, reference tokens) and columns
``cols`` (``[B, L2]``, hypothesis tokens) of each item (the pair mask is their outer product), with
masses ``a`` (``[B, L1]``) and ``b`` (``[B, L2]``), given as ``log_a`` and ``log_b``:

    max_π ⟨π, M⟩ + ε H(π)    subject to  π1 = a,  πᵀ1 = b.

Its solution is the Gibbs plan ``log π_ij = M_ij / ε + F_i + G_j``; Sinkhorn's iteration finds the dual
potentials ``F``, ``G`` by alternating the two half-steps that each meet one marginal exactly
(Cuturi 2013; in the log domain, Schmitzer 2019):

    columns:  G_j = log b_j − LSE_i (M_ij / ε + F_i)                                          (1)
    rows:     F_i = log a_i − LSE_j (M_ij / ε + G_j)                                          (2)

Each potential is kept in two parts, one in the units of ``M`` (a *shift*, ``u_i`` or ``v_j``) and
one in log-mass units (``f_i`` or ``g_j``): ``F_i = f_i − u_i / ε``, ``G_j = g_j − v_j / ε``, with
the shift the maximum of ``M`` minus the other side's shift, so that the tempered residual
``z_ij = (M_ij − u_i − v_j) / ε`` is ``≤ 0`` with maximum exactly 0 (:func:`tempered_residual`).
With a single potential of size ``~1/ε`` the log-masses are lost to rounding once ``ε`` is below
~1e-6 in float32; split, every step is exact down to ``ε = MIN_TEMPERATURE``.

This module is

- one kernel, :func:`softmin`: a half-step (1) or (2) on the split potentials, a masked
  log-sum-exp (:func:`log_sum_exp`) of the residual plus the other side's log-mass potential;
- one loop, :func:`_sweep`, over a list of ``ε``: :func:`sinkhorn` runs it on the fixed list
  ``[T] * n_iter`` (unrolled, differentiable: TWMD), :func:`converged_sinkhorn` on an ε-scaling
  schedule down to ``T`` and then, item by item, to a tolerance (no graph; the envelope gradient).

Both return a :class:`TransportPlan` (value, log-plan, iterations and per-item convergence).
Entries off the mask hold ``−inf`` (π = 0) in every returned plan and receive exactly zero gradient;
no step ever produces NaN, also for rows or columns that are entirely padding.
"""
from __future__ import annotations

import contextlib
import contextvars
import numbers
import warnings
from typing import Iterator, NamedTuple, cast

import torch
from torch import Tensor

NEG_INF = float("-inf")


# PyTorch's vectorised float32 exp on the CPU leaves its fast path for arguments below
# log(finfo(float32).tiny) ≈ −87.3, whose results are subnormal or 0, and is many times slower per
# element there. Masked entries (−inf) and the far tails of a plan live there. The solvers
# therefore never hand exp an exponent below EXP_FLOOR: e^−80 ≈ 1.8e−35 lies ~27 orders of magnitude
# below one rounding unit of any sum that also holds a term near e^0, so raising the exponents under it
# to it changes no sum (float32 or float64), and the entries raised get zero gradient (theirs was
# below e^−80 too). On a GPU the clamp is one cheap elementwise kernel.
EXP_FLOOR = -80.0


def log_sum_exp(x: Tensor, dim: int, zero_max: bool = False) -> Tensor:
    """``LSE_dim x = log Σ_dim exp(max(x, EXP_FLOOR))`` (``dim`` removed): the log-sum-exp of an ``x``
    whose maximum along ``dim`` is within a few tens of 0 (a residual shifted to its maximum, plus
    potentials of log-mass size), with every exponent on exp's fast path (``EXP_FLOOR``).

    ``zero_max``: the maximum of ``x`` along ``dim`` is exactly 0 wherever it matters (a bare
    residual of :func:`tempered_residual`), so ``exp`` cannot overflow and a real slice's sum is at
    least 1: no shift by the maximum (two passes fewer than ``torch.logsumexp``)."""
    floored = x.clamp_min(EXP_FLOOR)
    return floored.exp_().sum(dim).log() if zero_max else torch.logsumexp(floored, dim)


def floored_exp(log_x: Tensor) -> Tensor:
    """``exp(max(log_x, EXP_FLOOR))``: ``e^−80`` where ``log_x`` is below it, ``−inf`` included. For a
    plan that multiplies a gain which is exactly 0 off the mask (zero token vectors there), the
    product, its sum and its gradients are those of the exact plan."""
    return log_x.clamp_min(EXP_FLOOR).exp_()


def log_pair_mask(rows: Tensor, cols: Tensor, dtype: torch.dtype) -> Tensor:
    """``[B, L1, L2]``: 0 where row ``i`` (``rows`` ``[B, L1]``) and column ``j`` (``cols`` ``[B, L2]``)
    are both real, ``−inf`` elsewhere: the log of the pair mask, to be *added* to a gain.

    The solvers mask by this addition rather than by boolean kernels: on the CPU, PyTorch's boolean
    kernels over ``[B, L1, L2]`` (``masked_fill``, ``where``, ``&``, ``any``) cost several times a
    float addition per element. Built from the two small masks by one broadcast addition (one mask
    once, where the two are one tensor)."""
    def log_side(mask):
        return torch.full(mask.shape, NEG_INF, dtype=dtype, device=mask.device).masked_fill_(mask, 0.0)
    log_rows = log_side(rows)
    return log_rows.unsqueeze(-1) + (log_rows if cols is rows else log_side(cols)).unsqueeze(-2)


def real_sides(rows: Tensor, cols: Tensor) -> tuple[Tensor, Tensor]:
    """The rows ``[B, L1]`` and columns ``[B, L2]`` of the pair mask ``rows ⊗ cols`` with a real entry
    (none on an item whose other side is empty): computed once where the two masks are one tensor
    (a self-term ``C(X, X)``)."""
    real_rows = rows & cols.any(-1, keepdim=True)
    return real_rows, real_rows if cols is rows else cols & rows.any(-1, keepdim=True)


def tempered_residual(masked: Tensor, empty: Tensor, temperature: float | Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """``z = (M − m) / ε`` with ``m = max`` of ``M`` over the real entries along ``dim`` (detached),
    and ``m`` itself (0 on ``empty``, the slices along ``dim`` without a real entry, ``keepdim``), for
    ``masked`` = a finite ``M`` plus :func:`log_pair_mask` (``−inf`` off the mask, as ``z`` is) and
    ``ε = temperature`` (a float, or ``[B, 1, 1]`` per item).

    Subtracting the maximum *before* dividing by ``ε`` is what keeps small temperatures exact: the
    maximal entry becomes exactly ``0`` (a float minus itself) and every other entry is at most
    ``−ulp(M) / ε``, so ``exp(z)`` is the exact ``ε → 0`` limit (mass on the maxima only) instead of the
    rounding noise of ``M / ε ≈ 10¹⁰`` in which an ``O(1)`` log-mass would vanish. ``m`` is detached:
    every quantity built from ``z`` is invariant to it, so its gradient would only add and cancel
    terms of size ``1/ε``. The entries off the mask reach no output of the solvers: each is floored
    at ``EXP_FLOOR`` before any exp, and the floor passes them no gradient.
    """
    shift = masked.detach().amax(dim, keepdim=True).masked_fill_(empty, 0.0)
    return (masked - shift).div_(temperature), shift.squeeze(dim)  # fresh: divided in place


class Side(NamedTuple):
    """One side's dual potential ``F = potential − shift / ε`` (rows; ``G`` for columns): ``shift``
    ``[B, L]`` in the units of ``M``, ``potential`` ``[B, L]`` in log-mass units (``finfo.min / 8``
    on the slices without a real entry: finite, so that no arithmetic on padding makes inf or NaN)."""

    shift: Tensor
    potential: Tensor


def _exponent(masked: Tensor, other: Side | None, eps: float | Tensor, dim: int, real: Tensor,
              centered: bool = False) -> tuple[Tensor, Tensor]:
    """``z + f`` (for ``dim = −2``; ``z + g`` for ``dim = −1``) ``[B, L1, L2]``, the exponent that a
    half-step along ``dim`` normalises, and the new shift ``[B, L]`` of the side along ``dim``.
    ``other``: the other side's potential (None before the first half-step: ``F = 0``).

    The shift is ``v_j = max_i (M_ij − u_i)`` (:func:`tempered_residual`: the residual's maximum is
    exactly 0, the exact ``T → 0`` limit of a few iterations), or with ``centered`` the maximum of the
    whole exponent, ``v_j = max_i (M_ij − u_i + ε f_i)``: the log-mass part then stays within
    ``[log b_j − log L1, log b_j]`` however many iterations run (with the plain shift it absorbs the
    gap between the max and the soft-max, up to ``range(M) / ε``, and the exponents leave
    ``EXP_FLOOR``'s range)."""
    other_dim = -3 - dim  # the other side's quantities broadcast along it
    if other is None:
        return tempered_residual(masked, ~real.unsqueeze(dim), eps, dim)
    shifted = masked - other.shift.unsqueeze(other_dim)
    if not centered:
        residual, shift = tempered_residual(shifted, ~real.unsqueeze(dim), eps, dim)
    else:
        shift = (shifted + eps * other.potential.unsqueeze(other_dim)).amax(dim).masked_fill_(~real, 0.0)
        residual = (shifted - shift.unsqueeze(dim)).div_(eps)
    return residual + other.potential.unsqueeze(other_dim), shift


def _normalizer(exponent: Tensor, dim: int, real: Tensor, log_mass: Tensor, zero_max: bool = False) -> Tensor:
    """``log mass − LSE_dim exponent`` on the ``real`` slices ``[B, L]``, ``finfo.min / 8`` on the others."""
    return torch.where(real, log_mass - log_sum_exp(exponent, dim, zero_max), torch.finfo(exponent.dtype).min / 8)


def softmin(masked: Tensor, other: Side | None, eps: float | Tensor, dim: int, real: Tensor,
            log_mass: Tensor, centered: bool = False) -> Side:
    """The half-step along ``dim`` (``−2``: columns, eq. (1); ``−1``: rows, eq. (2)) from the other
    side's potential ``other``: the side whose marginal then holds exactly,

        v_j = max_i (M_ij − u_i),     g_j = log b_j − LSE_i ((M_ij − u_i − v_j) / ε + f_i)     (columns)

    (rows likewise with the roles swapped), ``masked`` ``[B, L1, L2]`` being ``M`` plus
    :func:`log_pair_mask`, ``real`` ``[B, L]`` the side's slices with a real entry and ``log_mass``
    ``[B, L]`` their log-masses. This is the masked soft-min of geomloss and OTT-JAX,
    ``F_i = −ε LSE_j (log b_j + (G_j − C_ij) / ε)`` with ``C = −M``, in split potentials (``centered``:
    see :func:`_exponent`)."""
    exponent, shift = _exponent(masked, other, eps, dim, real, centered)
    return Side(shift, _normalizer(exponent, dim, real, log_mass, zero_max=other is None))


class _Problem(NamedTuple):
    """What every half-step reads: ``masked`` ``[B, L1, L2]``, and by ``dim`` of the half-step the real
    slices ``real[dim]`` and log-masses ``log_mass[dim]`` of that side (``−1``: rows, ``−2``: columns)."""

    masked: Tensor
    real: dict
    log_mass: dict

    @staticmethod
    def of(sim: Tensor, rows: Tensor, cols: Tensor, log_a: Tensor, log_b: Tensor) -> "_Problem":
        return _Problem(sim + log_pair_mask(rows, cols, sim.dtype), dict(zip((-1, -2), real_sides(rows, cols))),
                        {-1: log_a, -2: log_b})

    def select(self, index: Tensor) -> "_Problem":
        return _Problem(self.masked[index], {d: r[index] for d, r in self.real.items()},
                        {d: m[index] for d, m in self.log_mass.items()})


def _dims(exact: str) -> tuple[int, int]:
    """The order of the half-steps of one iteration: the ``exact`` marginal's last."""
    if exact not in ("rows", "columns"):
        raise ValueError(f"exact must be 'rows' or 'columns', got {exact!r}")
    return (-2, -1) if exact == "rows" else (-1, -2)


def _sweep(problem: _Problem, epsilons: list, exact: str, centered: bool = False) -> tuple[dict, Tensor, int]:
    """THE Sinkhorn loop: one iteration (two half-steps, :func:`softmin`, the ``exact`` marginal's
    last) at each ``ε`` of ``epsilons``, from ``F = 0`` (``centered``: see :func:`_exponent`).
    The last half-step is left open: returns the potentials before it, its exponent and its ``dim``
    (:func:`_close` completes it; :func:`sinkhorn_value` reads the value off the exponent instead)."""
    sides: dict[int, Side] = {}
    steps = [(eps, dim) for eps in epsilons for dim in _dims(exact)]
    for eps, dim in steps[:-1]:
        sides[dim] = softmin(problem.masked, sides.get(-3 - dim), eps, dim, problem.real[dim], problem.log_mass[dim],
                             centered)
    eps, dim = steps[-1]
    exponent, shift = _exponent(problem.masked, sides.get(-3 - dim), eps, dim, problem.real[dim], centered)
    # its potential: _close; the open side's None is a placeholder that nothing reads before _close replaces it
    sides[dim] = Side(shift, cast(Tensor, None))
    return sides, exponent, dim


def _close(problem: _Problem, sides: dict, exponent: Tensor, dim: int) -> tuple[dict, Tensor]:
    """Complete the open last half-step of :func:`_sweep`: the potentials and ``log π`` ``[B, L1, L2]``
    (``exponent + potential``, ``−inf`` off the mask)."""
    potential = _normalizer(exponent, dim, problem.real[dim], problem.log_mass[dim])
    sides = {**sides, dim: Side(sides[dim].shift, potential)}
    return sides, exponent + potential.unsqueeze(dim)


class TransportPlan(NamedTuple):
    """The solution of a transport problem, with its diagnostics (OTT-JAX's output object).

    Attributes:
        value: ``[B]`` ``⟨π, M⟩ = Σ_ij π_ij M_ij``, differentiable w.r.t. ``M`` (for the converged
            solver through the envelope theorem: the plan is held constant).
        log_plan: ``[B, L1, L2]`` log of the plan π, ``−inf`` off the mask.
        n_iter: ``[B]`` Sinkhorn iterations run on each item (one iteration = a row and a column
            step; for the converged solver, the iterations after its ε-scaling warm start, until the
            item converged).
        marginal_error: ``[B]`` ``‖π1 − a‖₁ + ‖πᵀ1 − b‖₁`` (``None`` if not diagnosed).
        converged: ``[B]`` whether the item met the solver's tolerance (at ``T``, for the converged
            solver; ``None`` if not diagnosed).
    """

    value: Tensor
    log_plan: Tensor
    n_iter: Tensor
    marginal_error: Tensor | None
    converged: Tensor | None

    @property
    def plan(self) -> Tensor:
        return self.log_plan.exp()


CONVERGENCE_TOLERANCE = 1e-3
CHECK_EVERY = 10
MAX_ITER = 5000
# Below this temperature the converged solver cannot reach CONVERGENCE_TOLERANCE in float32 (measured
# on random 20 x 25-token clouds: converged at 1e-5 in 710 iterations, not in 5000 at 1e-6), and its
# value no longer moves (T = 1e-5 and 1e-4 agree to 1e-5): the T -> 0 limit is ``wmd``.
MIN_CONVERGED_TEMPERATURE = 1e-5


def marginal_error(log_plan: Tensor, log_a: Tensor, log_b: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """``‖π1 − a‖₁ + ‖πᵀ1 − b‖₁`` per batch item (``[B]``), counting the real rows (``rows``
    ``[B, L1]``) and columns (``cols`` ``[B, L2]``) only: those with a real entry (:func:`real_sides`)."""
    plan = floored_exp(log_plan)
    row_err = ((plan.sum(-1) - log_a.exp()).abs() * rows).sum(-1)
    col_err = ((plan.sum(-2) - log_b.exp()).abs() * cols).sum(-1)
    return row_err + col_err


def sinkhorn(
    sim: Tensor, rows: Tensor, cols: Tensor, log_a: Tensor, log_b: Tensor, temperature: float, n_iter: int,
    exact: str = "rows", diagnose: bool = True,
) -> TransportPlan:
    """``n_iter`` log-domain Sinkhorn iterations at ``ε = T`` (:func:`_sweep` over ``[T] * n_iter``) from
    the Gibbs plan ``log π⁰ = M / T``, ``M = sim`` ``[B, L1, L2]``, for the real rows ``rows``
    ``[B, L1]`` and columns ``cols`` ``[B, L2]``.

    ``exact="rows"`` (recall) ends each iteration with the row step (2), so every reference token
    ships exactly its mass ``a_i``: columns, then rows. ``exact="columns"`` (precision) does the two
    steps in the opposite order. Differentiable end to end (unrolled: the gradient is exact).
    ``diagnose=False`` skips the marginal error (``marginal_error`` and ``converged`` are then
    ``None``). :func:`sinkhorn_value` gives ``⟨π, M⟩`` of the same plan without building it.

    The returned plan is built from the last step's residual, so its exact marginal holds to
    rounding at every ``T >= MIN_TEMPERATURE``. One iteration is exact down to the ``T → 0`` limit:
    recall sends each hypothesis token's mass to its most similar reference tokens, then each
    reference token ships ``a_i`` to the columns that chose it (or, if none did, to the columns where
    it is closest to the maximum). Later iterations compare shifted gains ``M_ij − u_i`` that are
    exactly tied in exact arithmetic; once ``T`` is below their rounding (~1e-7 in float32) a tie can
    be broken by rounding, so for ``n_iter >= 2`` at such ``T`` the plan is still a valid plan
    (bounded score, exact marginal) but may differ from the exact limit. ``sim`` must be finite.
    """
    if n_iter < 1:
        raise ValueError(f"n_iter must be at least 1, got {n_iter!r}")
    problem = _Problem.of(sim, rows, cols, log_a, log_b)
    _, log_plan = _close(problem, *_sweep(problem, [temperature] * n_iter, exact))
    value = (floored_exp(log_plan) * sim).sum((-1, -2))
    iterations = torch.full(sim.shape[:1], n_iter, device=sim.device)
    if not diagnose:
        return TransportPlan(value, log_plan, iterations, None, None)
    error = marginal_error(log_plan.detach(), log_a, log_b, problem.real[-1], problem.real[-2])
    return TransportPlan(value, log_plan, iterations, error, error <= CONVERGENCE_TOLERANCE)


def sinkhorn_value(sim: Tensor, rows: Tensor, cols: Tensor, log_a: Tensor, log_b: Tensor, temperature: float,
                   n_iter: int, exact: str = "rows") -> Tensor:
    """``⟨π, M⟩`` ``[B]`` of the plan of :func:`sinkhorn` (same arguments), without building it: for
    ``exact="rows"`` the last step makes ``π_ij = a_i softmax_j(w_ij)``, ``w`` the exponent before
    it, so ``Σ π M = Σ_i a_i Σ_j softmax_j(w_ij) M_ij``: one softmax instead of a log-sum-exp, the
    plan's log and its exp (columns likewise). ``sim`` must be 0 off the mask (the family's
    similarities are: its padding vectors are 0), as the floored entries there weigh ``e^EXP_FLOOR``
    in the softmax. Differentiable; equal to ``sinkhorn(...).value`` to rounding, gradients included
    (tested). Reads no device data (the training hot path)."""
    if n_iter < 1:
        raise ValueError(f"n_iter must be at least 1, got {n_iter!r}")
    problem = _Problem.of(sim, rows, cols, log_a, log_b)
    _, exponent, dim = _sweep(problem, [temperature] * n_iter, exact)
    return plan_value(exponent, sim, torch.where(problem.real[dim], problem.log_mass[dim].exp(), 0.0), dim)


def plan_value(exponent: Tensor, sim: Tensor, mass: Tensor, dim: int) -> Tensor:
    """``Σ_ij π_ij S_ij`` ``[B]`` of the plan that gives each slice along ``dim`` its ``mass`` (``[B, L]``,
    the other side's), shared by softmax: ``π = mass · softmax_dim(exponent)``, ``Σ π S = Σ mass ·
    Σ_dim softmax(exponent) S``. ``exponent`` is floored at ``EXP_FLOOR`` first, which keeps the
    softmax's own ``exp(w − max w)`` on exp's fast path for an exponent whose maximum along ``dim`` is
    within a few tens of 0 (see :func:`log_sum_exp`); ``sim`` must be 0 wherever ``exponent`` is
    below the floor for a reason other than the plan's own tail (off the mask)."""
    shares = torch.softmax(exponent.clamp_min(EXP_FLOOR), dim)
    return ((shares * sim).sum(dim) * mass).sum(-1)


COSTS = ("cosine", "euclidean")


def cost_matrix(x: Tensor, y: Tensor, cost: str) -> Tensor:
    """``[B, L1, L2]`` ground cost: ``cosine`` ``1 − x·y`` (= ``|x − y|²/2`` on unit vectors) or
    ``euclidean`` ``‖x − y‖`` (its gradient is 0 where two points coincide)."""
    if cost == "cosine":
        return 1.0 - x @ y.transpose(-1, -2)
    if cost == "euclidean":  # not cdist's matmul shortcut: it gives ~1e-3, not 0, for identical points
        return torch.cdist(x, y, compute_mode="donot_use_mm_for_euclid_dist")
    raise ValueError(f"cost must be one of {COSTS}, got {cost!r}")


# The smallest temperature: float32's smallest normal number. Below it ``T`` is not representable in
# float32 arithmetic (it rounds to a subnormal or to 0, and ``S / T`` to inf or NaN).
MIN_TEMPERATURE = torch.finfo(torch.float32).tiny


# The largest temperature. At ``T = 1e30`` every ``|S / T|`` is below ``1e-30``: the plan is the product
# of the masses to float precision, as it is at any larger ``T``; and from about ``1e36`` on, the
# converged solver's ε-scaling overflows float32 (its schedule starts above ``T``).
MAX_TEMPERATURE = 1e30


def check_temperature(temperature: float) -> None:
    """Raise ``ValueError`` naming ``temperature`` unless it is a real number from ``MIN_TEMPERATURE``
    (~1.2e-38) to ``MAX_TEMPERATURE`` (1e30): zero, negative, NaN and infinite temperatures included."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    if not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
        raise ValueError(f"temperature must be positive and finite, from {MIN_TEMPERATURE:.3g} (float32's smallest "
                         f"normal number) to {MAX_TEMPERATURE:g} (where the plan is the product of the masses), "
                         f"got {temperature!r}")


def check_converged_temperature(temperature: float) -> None:
    """Raise ``ValueError`` naming ``temperature`` unless it is at least ``MIN_CONVERGED_TEMPERATURE``."""
    if not temperature >= MIN_CONVERGED_TEMPERATURE:
        raise ValueError(f"temperature must be >= {MIN_CONVERGED_TEMPERATURE:g} for the converged solver "
                         f"(n_iter=None, wmd, moverscore), got {temperature!r}; its T -> 0 limit is method='wmd'")


# The ε-scaling schedule of the converged solver (geomloss's, Feydy et al. 2019, Sec. 3.3): one
# iteration at each ε = GAIN_RANGE · scaling^k down to STAGES·T, then stages STAGES·T, ..., 2T, T, each
# iterated to the tolerance. GAIN_RANGE bounds the spread of M for unit vectors (cosines and Euclidean
# distances both lie in an interval of length 2): a constant, so that the schedule of an item depends
# on nothing but its temperature.
GAIN_RANGE = 2.0
ANNEALING_SCALING = 0.9
STAGES = 5  # 2^5 = 32
OVER_RELAXATION = 1.8


def _warm_start_epsilons(temperature: float, scaling: float) -> list[float]:
    """``[GAIN_RANGE · scaling^k > 2^STAGES · T] + [2^STAGES · T]``: the fixed list of the warm start."""
    first_stage = temperature * 2.0 ** STAGES
    epsilons, eps = [], GAIN_RANGE
    while eps > first_stage:
        epsilons.append(eps)
        eps *= scaling
    return epsilons + [first_stage]


def converged_sinkhorn(
    sim: Tensor, rows: Tensor, cols: Tensor, log_a: Tensor, log_b: Tensor, temperature: float, *,
    tolerance: float = CONVERGENCE_TOLERANCE, max_iter: int | None = None, scaling: float = ANNEALING_SCALING,
) -> TransportPlan:
    """The entropic plan at ``ε = T`` solved to convergence, each item on its own (no graph).

    Solves ``max_π ⟨π, M⟩ + T·H(π)`` subject to ``π1 = a``, ``πᵀ1 = b`` for ``M = sim`` ``[B, L1, L2]``
    between the real rows ``rows`` ``[B, L1]`` and columns ``cols`` ``[B, L2]`` (similarities, or
    ``−C`` for a ground cost ``C``; unit vectors keep ``M`` within a range of 2, which the warm start
    assumes). The loop of :func:`sinkhorn` (:func:`_sweep`) runs

    1. one iteration at each ``ε`` of the fixed ε-scaling list ``2, 2·0.9, ..., 32T`` (geomloss's
       annealing; the same for every item);
    2. then, **per item**, stages ``ε = 32T, 16T, ..., T``: iterations at the item's ``ε``, over-relaxed
       (``ω = 1.8``, Thibault et al. 2021, falling back to 1 for the item whose error grows), every
       ``CHECK_EVERY``-th one exact and followed by a check of its marginal error; an item within
       ``tolerance`` moves on to its next stage (its potentials rescaled, ``F ← F·ε/ε'``), and at
       ``T`` it stops: its plan no longer changes, and leaves the batch.

    So no item's iterations, relaxation or stopping depend on another's: a pair's plan is the same
    (to float rounding) alone or in any batch. The iterations run in float64 (float32 on MPS, which
    has no float64): at ``ε = 1e-3`` one float32 rounding unit of ``M`` moves the log-plan by ~1e-4,
    and the rounding of the batch's shapes (a reduction over 40 padded entries sums in another order
    than over 25) then moved a pair's score by up to 1e-5 (measured: 9e-6 on 64 mixed pairs). ``max_iter`` (default ``MAX_ITER``) caps the
    iterations of step 2; an item that has not met ``tolerance`` at ``T`` by then has
    ``converged = False`` (callers report it). The returned plan meets the row marginal exactly and
    the column marginal within ``tolerance`` (L1); a marginal error δ moves ``⟨π, M⟩`` by at most
    δ·max|M|. The plan carries no graph; ``value`` is differentiable w.r.t. ``sim`` through the
    envelope theorem (``∂/∂M max_π ⟨π, M⟩ + T·H(π) = π*``). ``temperature`` must be at least
    ``MIN_CONVERGED_TEMPERATURE`` (1e-5); the unrolled :func:`sinkhorn` takes any ``T`` that
    :func:`check_temperature` does.
    """
    check_converged_temperature(temperature)
    max_iter = MAX_ITER if max_iter is None else max_iter
    dtype = torch.float32 if sim.device.type == "mps" else torch.float64  # MPS has no float64
    with torch.no_grad():
        problem = _Problem.of(sim.detach().to(dtype), rows, cols, log_a.to(dtype), log_b.to(dtype))
        sides = _close(problem, *_sweep(problem, _warm_start_epsilons(temperature, scaling), "rows", True))[0]
        sides, eps, n_iter, converged = _iterate_per_item(problem, sides, temperature, tolerance, max_iter)
        log_plan = _log_plan(problem, sides, eps)
        error = marginal_error(log_plan, problem.log_mass[-1], problem.log_mass[-2], problem.real[-1],
                               problem.real[-2]).to(sim.dtype)
        log_plan = log_plan.to(sim.dtype)
    tally = _TALLY.get()
    if tally is not None:
        tally.add(converged)
    value = (floored_exp(log_plan) * sim).sum((-1, -2))  # the envelope gradient: π held constant
    return TransportPlan(value, log_plan, n_iter, error, converged)


def _log_plan(problem: _Problem, sides: dict, eps: Tensor) -> Tensor:
    """``log π = (M − v_j − u_i) / ε + g_j + f_i`` ``[B, L1, L2]``, in the order of operations of the row
    step that produced ``u`` and ``f`` (so its rows hold exactly as they did there)."""
    rows, cols = sides[-1], sides[-2]
    residual = ((problem.masked - cols.shift.unsqueeze(-2)) - rows.shift.unsqueeze(-1)).div_(eps)
    return residual + cols.potential.unsqueeze(-2) + rows.potential.unsqueeze(-1)


def _relax(new: Side, old: Side, omega: Tensor, eps: Tensor) -> Side:
    """The over-relaxed step ``F ← F + ω (F_sinkhorn − F)`` in split potentials (the new shift kept):
    ``f = f_s + (1 − ω) ((f − f_s) − (u − u_s) / ε)``; exactly ``new`` where ``ω = 1``."""
    drift = (old.potential - new.potential) - (old.shift - new.shift) / eps
    return Side(new.shift, new.potential + (1 - omega) * drift)


def _iterate_per_item(problem: _Problem, sides: dict, temperature: float, tolerance: float, max_iter: int):
    """Step 2 of :func:`converged_sinkhorn`: returns the potentials, ``ε`` ``[B, 1, 1]``, the iterations
    ``[B]`` and ``converged`` ``[B]`` of every item. Only the items still running are iterated (the
    batch shrinks as they stop); every decision is taken per item, from the item's own error."""
    batch = problem.masked.shape[0]
    device, dtype = problem.masked.device, problem.masked.dtype
    stage = torch.zeros(batch, dtype=torch.long, device=device)  # 0: ε = 2^STAGES·T ... STAGES: ε = T
    n_iter = torch.full((batch,), max_iter, dtype=torch.long, device=device)
    converged = torch.zeros(batch, dtype=torch.bool, device=device)
    final = {d: Side(s.shift.clone(), s.potential.clone()) for d, s in sides.items()}  # the stopped items' state

    def epsilon(stage: Tensor) -> Tensor:  # [b, 1]
        return (temperature * 2.0 ** (STAGES - stage)).to(dtype).unsqueeze(-1)

    live = torch.arange(batch, device=device)  # the items still running, and their state:
    p, omega = problem, torch.full((batch, 1), OVER_RELAXATION, dtype=dtype, device=device)
    previous = torch.full((batch,), torch.inf, dtype=dtype, device=device)  # each item's last error
    for k in range(max_iter):
        if not len(live):
            break
        eps = epsilon(stage[live])  # [b, 1]
        columns = softmin(p.masked, sides[-1], eps.unsqueeze(-1), -2, p.real[-2], p.log_mass[-2], True)
        met = None
        if k % CHECK_EVERY == 0:  # the last iteration was exact: rows hold, and the column step (1)
            # gives the columns' sums b_j exp(G_j − G_j^new): the error of each item's plan, for free
            drift = (sides[-2].potential - columns.potential) - (sides[-2].shift - columns.shift) / eps
            error = torch.where(p.real[-2], p.log_mass[-2].exp() * drift.exp().sub(1).abs(), 0.0).sum(-1)  # [b]
            omega = torch.where((error > 1.1 * previous + 0.1 * tolerance).unsqueeze(-1), 1.0, omega)
            previous, met = error, error <= tolerance
            stop = met & (stage[live] == STAGES)
            if bool(stop.any()):  # converged at T: keep the plan, leave the batch
                done, keep = live[stop], ~stop
                for d in (-1, -2):
                    final[d].shift[done], final[d].potential[done] = sides[d].shift[stop], sides[d].potential[stop]
                converged[done], n_iter[done] = True, k
                live, p, omega, previous, met, eps = live[keep], p.select(keep), omega[keep], previous[keep], met[keep], eps[keep]
                sides = {d: Side(s.shift[keep], s.potential[keep]) for d, s in sides.items()}
                columns = Side(columns.shift[keep], columns.potential[keep])
                if not len(live):
                    break
        w = torch.ones_like(omega) if k % CHECK_EVERY == CHECK_EVERY - 1 or k == max_iter - 1 else omega
        new = {-2: _relax(columns, sides[-2], w, eps)}
        rows = softmin(p.masked, new[-2], eps.unsqueeze(-1), -1, p.real[-1], p.log_mass[-1], True)
        new[-1] = _relax(rows, sides[-1], w, eps)
        if met is None or not bool(met.any()):
            sides = new
            continue
        # the items within tolerance at an earlier stage skip this iteration and move to the next stage:
        # F <- F ε/ε' (the shifts kept), ω and the error history reset
        ratio = eps / epsilon(stage[live] + 1)
        for d in (-1, -2):
            rescaled = torch.where(p.real[d], sides[d].potential * ratio, sides[d].potential)
            sides[d] = Side(torch.where(met.unsqueeze(-1), sides[d].shift, new[d].shift),
                            torch.where(met.unsqueeze(-1), rescaled, new[d].potential))
        stage[live] += met.long()
        omega = torch.where(met.unsqueeze(-1), OVER_RELAXATION, omega)
        previous = torch.where(met, torch.inf, previous)
    for d in (-1, -2):  # the items that ran out of iterations
        final[d].shift[live], final[d].potential[live] = sides[d].shift, sides[d].potential
    return final, epsilon(stage).unsqueeze(-1), n_iter, converged


class ConvergenceTally:
    """The items solved by :func:`converged_sinkhorn` inside a :func:`warn_if_not_converged` block."""

    def __init__(self):
        self.items, self.not_converged = 0, 0

    def add(self, converged: Tensor) -> None:
        """Count ``converged`` ``[B]`` (a read on the host: the converged solver has synced at every check)."""
        self.items += converged.numel()
        self.not_converged += int((~converged).sum())


_TALLY: contextvars.ContextVar[ConvergenceTally | None] = contextvars.ContextVar("torchmover_tally", default=None)


@contextlib.contextmanager
def warn_if_not_converged() -> Iterator[ConvergenceTally]:
    """Count every item that :func:`converged_sinkhorn` solves inside the block, and warn once at its
    end (a ``RuntimeWarning`` with the count) if any stopped at ``max_iter`` before meeting its
    tolerance: a call of ``Scorer.score`` or of a reward is one block, however many batches and
    transport problems (cross and self terms) it solves. Nested blocks count into the outermost one.
    Nothing is read where no converged solver runs (the one-iteration members stay sync-free)."""
    outer = _TALLY.get()
    if outer is not None:
        yield outer
        return
    tally = ConvergenceTally()
    token = _TALLY.set(tally)
    try:
        yield tally
    finally:
        _TALLY.reset(token)
    if tally.not_converged:
        warnings.warn(
            f"the converged transport solver did not converge on {tally.not_converged} of {tally.items} items "
            f"(pairs and self-terms) of this call: they stopped at max_iter={MAX_ITER} iterations above its "
            f"marginal-error tolerance {CONVERGENCE_TOLERANCE:g}, so their scores are less accurate (per item: "
            "return_plan=True in torchmover.functional, .plan.converged)", RuntimeWarning, stacklevel=3)
