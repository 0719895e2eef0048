"""Segment-level correlation of a metric with human scores, with bootstrap confidence intervals.

:func:`correlate` reports, per group (a language pair and year, ``"cs-en/2016"``) and averaged over
groups, Pearson's r, Spearman's ρ and Kendall's τ-b, each with a percentile-bootstrap confidence
interval (segments resampled with replacement within each group). Given each segment's system, it
also reports the **system level**, as WMT does: the same statistics between the mean metric score and
the mean human score of each system, per group (:func:`system_means`; the bootstrap then resamples
systems). :func:`compare` tests whether one metric correlates better with humans than another, by
Williams' test (Williams 1959, as used by Graham & Baldwin 2014; :func:`williams_test`) and by a paired
permutation test (:func:`paired_permutation_test`); :func:`paired_bootstrap_difference` puts a
confidence interval on the difference of two metrics' average correlations over groups. :func:`score_and_correlate` glues a
:class:`~torchmover.Scorer` to ratings read by :mod:`torchmover.evaluation.data`.

One kernel computes all three statistics for a batch of resamples given as counts ``c[b, i]`` (how
often segment ``i`` is drawn in resample ``b``); the point estimate is the same kernel with
``c = 1``, so estimate and bootstrap can never disagree in definition.

Example:
    >>> report = correlate([0.1, 0.4, 0.35, 0.8, 0.6], [-1.0, 0.2, 0.1, 1.3, 0.2], n_boot=200)
    >>> round(report.average.pearson.value, 4), round(report.average.kendall.value, 4)
    (0.9458, 0.9487)
"""
from __future__ import annotations

import dataclasses
import json
import math
import textwrap
import warnings
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, NamedTuple, Sequence, cast

import numpy as np

from ..runtime.checkpoint import atomic_savefig

if TYPE_CHECKING:
    from .data import Rating

__all__ = ["Estimate", "GroupCorrelation", "Report", "Comparison", "Difference", "correlate", "system_means",
           "williams_test", "paired_permutation_test", "paired_bootstrap_difference", "compare", "score_and_correlate"]

STATISTICS = ("pearson", "spearman", "kendall")
_LABELS = {"pearson": "Pearson r", "spearman": "Spearman ρ", "kendall": "Kendall τ-b"}
_BLOCK = 1 << 22  # elements of one block of the pairwise sign matrices in _kendall_tau_b
_PERMUTATION_BLOCK = 1 << 20  # permuted scores held at once by paired_permutation_test (8 MiB per array)


# --- the kernel: statistics of weighted (resampled) data -------------------------------------------

def _weighted_pearson(x: np.ndarray, y: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``r = Σ c (x - x̄)(y - ȳ) / sqrt(Σ c (x - x̄)² Σ c (y - ȳ)²)`` with ``c``-weighted means.

    ``x, y``: ``[n]`` or ``[B, n]``; ``c``: ``[B, n]`` counts -> ``[B]``. NaN where a variance is 0.
    """
    m = c.sum(-1, keepdims=True)  # [B, 1]
    dx = x - (c * x).sum(-1, keepdims=True) / m  # [B, n] (two-pass: no cancellation)
    dy = y - (c * y).sum(-1, keepdims=True) / m
    sxy, sxx, syy = (c * dx * dy).sum(-1), (c * dx * dx).sum(-1), (c * dy * dy).sum(-1)  # [B]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.clip(sxy / np.sqrt(sxx * syy), -1.0, 1.0)


def _weighted_ranks(x: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Average (mid-)ranks of each segment within each resample, as ``scipy.stats.rankdata``.

    Copies of one segment, and segments with equal values, tie. With ``W[b, u]`` the number of
    drawn segments equal to the ``u``-th smallest distinct value, that value's rank is
    ``Σ_{v<u} W[b, v] + (W[b, u] + 1) / 2``. ``x``: ``[n]``, ``c``: ``[B, n]`` -> ranks ``[B, n]``
    and the number of distinct drawn values ``[B]``.
    """
    order = np.argsort(x, kind="stable")
    new = np.r_[True, x[order][1:] != x[order][:-1]]  # [n] first of each distinct value
    value_of = np.empty(len(x), dtype=np.intp)
    value_of[order] = np.cumsum(new) - 1  # [n] index u of each segment's value
    W = np.add.reduceat(c[:, order], np.flatnonzero(new), axis=1)  # [B, U]
    rank = np.cumsum(W, axis=1) - W + (W + 1) / 2  # [B, U]
    return rank[:, value_of], (W > 0).sum(1)


def _kendall_tau_b(x: np.ndarray, y: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Kendall's τ-b of each resample: ``(n_c − n_d) / sqrt((n_0 − n_1)(n_0 − n_2))``.

    With ``A = sign(x_i − x_j) sign(y_i − y_j)`` and ``D^x = [x_i ≠ x_j]``, the resample with
    counts ``c`` has ``n_c − n_d = cᵀAc / 2`` and ``n_0 − n_1 = cᵀD^x c / 2`` (copies of a segment are
    tied pairs), so ``τ_b = cᵀAc / sqrt(cᵀD^x c · cᵀD^y c)``. ``O(B n²)`` time, in row blocks of the
    sign matrices; the quadratic forms are exact integers (float32 products of small integers).
    ``x, y``: ``[n]``, ``c``: ``[B, n]`` -> ``[B]``, NaN where either variable is constant.
    """
    n = len(x)
    c32 = c.astype(np.float32)  # [B, n]
    forms = np.zeros((3, c.shape[0]))  # cᵀAc, cᵀDˣc, cᵀDʸc
    step = max(1, _BLOCK // max(n, 1))
    for i0 in range(0, n, step):
        sx = np.sign(x[i0:i0 + step, None] - x[None, :]).astype(np.float32)  # [b, n]
        sy = np.sign(y[i0:i0 + step, None] - y[None, :]).astype(np.float32)  # [b, n]
        ci = c[:, i0:i0 + step]  # [B, b]
        for k, M in enumerate((sx * sy, np.abs(sx), np.abs(sy))):
            forms[k] += ((c32 @ M.T).astype(np.float64) * ci).sum(1)  # Σ_i c_i (M c)_i
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.clip(forms[0] / np.sqrt(forms[1] * forms[2]), -1.0, 1.0)


def _statistics(x: np.ndarray, y: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Pearson, Spearman and Kendall τ-b of ``B`` resamples given by counts ``c [B, n]`` -> ``[B, 3]``."""
    rx, distinct_x = _weighted_ranks(x, c)
    ry, distinct_y = _weighted_ranks(y, c)
    out = np.stack([_weighted_pearson(x, y, c), _weighted_pearson(rx, ry, c), _kendall_tau_b(x, y, c)], axis=1)
    out[(distinct_x < 2) | (distinct_y < 2)] = np.nan  # a constant variable: no correlation
    return out


def _bootstrap_counts(rng: np.random.Generator, n: int, n_boot: int) -> np.ndarray:
    """``[n_boot, n]`` counts of ``rng.integers(0, n, size=(n_boot, n))``: row ``b`` is resample ``b``."""
    idx = rng.integers(0, n, size=(n_boot, n))
    flat = (idx + n * np.arange(n_boot)[:, None]).ravel()
    return np.bincount(flat, minlength=n_boot * n).reshape(n_boot, n).astype(np.float64)


# --- results -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Estimate:
    """A point estimate and its confidence interval ``[low, high]`` (NaN when not computed)."""

    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:6.3f} [{self.low:6.3f}, {self.high:6.3f}]"

    def to_dict(self) -> dict[str, float | None]:
        return {k: (None if math.isnan(v) else v) for k, v in dataclasses.asdict(self).items()}


@dataclasses.dataclass(frozen=True)
class GroupCorrelation:
    """The three correlations of one group (or the average over groups) over ``n`` segments."""

    name: str
    n: int
    pearson: Estimate
    spearman: Estimate
    kendall: Estimate

    def to_dict(self) -> dict:
        return {"group": self.name, "n": self.n, **{s: getattr(self, s).to_dict() for s in STATISTICS}}


@dataclasses.dataclass(frozen=True)
class Report:
    """Correlations per group and their unweighted average over groups (the WMT convention).

    ``kendall`` is τ-b (ties corrected in both variables). Confidence intervals are percentile
    bootstrap intervals: ``n_boot`` resamples of the segments of each group, drawn with
    ``numpy.random.default_rng(seed)``; the average's interval comes from averaging the groups'
    statistics resample by resample. ``data`` keeps each group's ``(metric, human)`` arrays for
    :meth:`plot`. ``unit`` names what was correlated and resampled (``segments`` or ``systems``);
    ``system_level`` is the system-level report when the systems were known.
    """

    groups: tuple[GroupCorrelation, ...]
    average: GroupCorrelation
    n_boot: int
    confidence: float
    seed: int
    metric: str | None = None
    kendall_variant: str = "tau-b"
    unit: str = "segments"
    system_level: Report | None = None
    data: Mapping[str, tuple[np.ndarray, np.ndarray]] = dataclasses.field(
        default_factory=dict, repr=False, compare=False)

    def __getitem__(self, name: str) -> GroupCorrelation:
        for g in self.groups + (self.average,):
            if g.name == name:
                return g
        raise KeyError(f"no group {name!r}; groups: {[g.name for g in self.groups]}")

    def to_dict(self) -> dict:
        out = {"metric": self.metric, "unit": self.unit, "kendall_variant": self.kendall_variant,
               "confidence": self.confidence, "n_boot": self.n_boot, "seed": self.seed,
               "interval": "percentile bootstrap", "groups": [g.to_dict() for g in self.groups],
               "average": self.average.to_dict()}
        if self.system_level is not None:
            out["system_level"] = self.system_level.to_dict()
        return out

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON (``null`` for undefined values); raw data not included."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    def to_table(self) -> str:
        """Fixed-width text: one row per group and ``average``, columns r, ρ, τ-b with intervals (then
        the system-level table, if any)."""
        width = max([len(g.name) for g in self.groups] + [len("average"), len("group")])
        pct = f"{100 * self.confidence:g}%"
        lines = []
        if self.metric:
            lines.append(f"metric: {self.metric}")
        if self.unit == "systems":
            lines.append("system level: mean metric score vs mean human score of each system")
        lines.append(f"value [{pct} CI]: percentile bootstrap, {self.n_boot} resamples of {self.unit} within each "
                     f"group, seed {self.seed}; Kendall τ-b; average = unweighted mean over groups")
        head = f"{'group':<{width}}  {'n':>6}  " + "  ".join(f"{_LABELS[s]:<23}" for s in STATISTICS)
        lines += [head.rstrip(), "-" * len(head.rstrip())]
        for i, g in enumerate(self.groups + (self.average,)):
            if i == len(self.groups):
                lines.append("-" * len(head.rstrip()))
            lines.append(f"{g.name:<{width}}  {g.n:>6}  " + "  ".join(f"{getattr(g, s)!s:<23}" for s in STATISTICS))
        if self.system_level is not None:
            lines += ["", *dataclasses.replace(self.system_level, metric=None).to_table().splitlines()]
        return "\n".join(line.rstrip() for line in lines)

    def __str__(self) -> str:
        return self.to_table()

    def plot(self, path: str | Path, *, columns: int = 3, dpi: int = 120) -> Path:
        """Write a picture (atomically; a PNG, or the format the suffix of ``path`` names) with one scatter
        plot (metric score vs human score, least-squares line) per group.

        Needs matplotlib: ``pip install torchmover[plot]``.
        """
        try:
            from matplotlib.figure import Figure
        except ImportError as error:
            raise ImportError("Report.plot needs matplotlib: pip install torchmover[plot]") from error
        if not self.data:
            raise ValueError("this report has no data to plot (it was not made by correlate())")
        k = len(self.groups)
        cols = min(columns, k)
        rows = math.ceil(k / cols)
        fig = Figure(figsize=(4.2 * cols, 3.6 * rows + 0.6), layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False)
        for ax, g in zip(axes.flat, self.groups):
            x, y = self.data[g.name]
            ax.scatter(x, y, s=8, alpha=0.45, linewidths=0)
            if np.ptp(x) > 0:
                slope, intercept = np.polyfit(x, y, 1)
                xs = np.array([x.min(), x.max()])
                ax.plot(xs, slope * xs + intercept, color="C3", linewidth=1.2)
            ax.set_title(f"{g.name}  (n={g.n})\nr={g.pearson.value:.3f}  ρ={g.spearman.value:.3f}  "
                         f"τ-b={g.kendall.value:.3f}", fontsize=9)
            ax.set_xlabel("metric score", fontsize=8)
            ax.set_ylabel("human score", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[k:]:
            ax.set_visible(False)
        if self.metric:
            fig.suptitle(textwrap.fill(self.metric.replace("|", " | "), 75 * cols,
                                       break_on_hyphens=False, break_long_words=False), fontsize=7)
        return atomic_savefig(fig, path, dpi=dpi)


# --- correlate -----------------------------------------------------------------------------------

def _as_array(name: str, values) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor, possibly requiring grad or on a device
        values = values.detach().cpu().double().numpy()
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {a.shape}")
    bad = np.flatnonzero(~np.isfinite(a))
    if len(bad):
        raise ValueError(f"{name} must be finite, got {a[bad[0]]} at index {bad[0]}")
    return a


def correlate(scores, human, groups: Sequence | None = None, *, systems: Sequence | None = None,
              n_boot: int = 1000, seed: int = 0, confidence: float = 0.95, metric: str | None = None) -> Report:
    """Pearson r, Spearman ρ and Kendall τ-b between ``scores`` and ``human``, per group and averaged.

    Args:
        scores, human: ``[N]`` metric and human scores (lists, arrays or tensors).
        groups: ``[N]`` group labels (e.g. ``"cs-en/2016"``); ``None``: one group ``"all"``.
            Groups are reported sorted by name.
        n_boot: bootstrap resamples per group (0: no intervals).
        seed: seeds ``numpy.random.default_rng``; group ``g`` (in sorted order) draws
            ``rng.integers(0, n_g, size=(n_boot, n_g))`` after the groups before it.
        confidence: the intervals' coverage, e.g. 0.95 for the 2.5 and 97.5 percentiles.
        metric: a label (e.g. the scorer's signature) carried by the report.
        systems: ``[N]`` the system that produced each hypothesis; adds the system-level report
            (``report.system_level``: :func:`system_means`, then the same statistics and bootstrap
            over the systems of each group, drawn after the segments' resamples). Groups with fewer
            than 2 systems are left out of it, with a warning.

    A statistic of a constant variable is NaN (with a warning); resamples where it is undefined are
    left out of its interval.
    """
    x, y = _as_array("scores", scores), _as_array("human", human)
    if len(x) != len(y):
        raise ValueError(f"scores and human must have the same length, got {len(x)} and {len(y)}")
    labels = _group_labels(groups, len(x))
    _check_bootstrap(n_boot, confidence, least=0)
    members = _members(labels)

    rng = np.random.default_rng(seed)
    q = 50 * (1 - confidence), 50 * (1 + confidence)
    rows, data, replicates = [], {}, []
    for name in sorted(members):
        idx = np.asarray(members[name])
        gx, gy = x[idx], y[idx]
        data[name] = (gx, gy)
        point = _statistics(gx, gy, np.ones((1, len(idx))))[0]  # [3]
        if np.isnan(point).any():
            warnings.warn(f"group {name!r}: scores or human scores are constant, correlation undefined (NaN)",
                          stacklevel=2)
        reps = _statistics(gx, gy, _bootstrap_counts(rng, len(idx), n_boot)) if n_boot else None  # [n_boot, 3]
        replicates.append(reps)
        rows.append(_group(name, len(idx), point, reps, q))
    point = np.mean([[getattr(r, s).value for s in STATISTICS] for r in rows], axis=0)
    reps = np.mean(cast(list[np.ndarray], replicates), axis=0) if n_boot else None  # n_boot: every group has some
    average = _group("average", len(x), point, reps, q)
    system_level = None
    if systems is not None:
        system_level = _system_level(x, y, labels, systems, n_boot, int(rng.integers(2 ** 63)), confidence, metric)
    return Report(tuple(rows), average, n_boot, confidence, seed, metric, system_level=system_level, data=data)


def system_means(scores, human, groups: Sequence,
                 systems: Sequence) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """The mean metric score and the mean human score of each (group, system), the unit of WMT's
    system-level correlations: ``(metric_means [S], human_means [S], group [S], system [S])``, sorted
    by group, then system. ``systems[i]`` names the system of segment ``i`` (a str; never None)."""
    x, y = _as_array("scores", scores), _as_array("human", human)
    if not len(x) == len(y) == len(groups) == len(systems):
        raise ValueError(f"scores, human, groups and systems must have the same length, got "
                         f"{len(x)}, {len(y)}, {len(groups)}, {len(systems)}")
    members: dict[tuple[str, str], list[int]] = {}
    for i, (group, system) in enumerate(zip(groups, systems)):
        if system is None:
            raise ValueError(f"systems[{i}] is None: every segment needs its system for the system level")
        members.setdefault((str(group), str(system)), []).append(i)
    keys = sorted(members)
    return (np.array([x[members[k]].mean() for k in keys]), np.array([y[members[k]].mean() for k in keys]),
            [g for g, _ in keys], [system for _, system in keys])


def _system_level(x, y, labels, systems, n_boot, seed, confidence, metric) -> Report | None:
    """The system-level report of :func:`correlate` (None, with a warning, if no group has 2 systems)."""
    mx, my, groups, _ = system_means(x, y, labels, systems)
    counts = Counter(groups)
    single = sorted(g for g, c in counts.items() if c < 2)
    if single:
        warnings.warn(f"group(s) {single} have a single system: left out of the system level", stacklevel=3)
    keep = [i for i, g in enumerate(groups) if counts[g] >= 2]
    if not keep:
        return None
    report = correlate(mx[keep], my[keep], [groups[i] for i in keep], n_boot=n_boot, seed=seed,
                       confidence=confidence, metric=metric)
    return dataclasses.replace(report, unit="systems")


def _group_labels(groups, n: int) -> list[str]:
    """The group label of each of ``n`` scores (``"all"`` without ``groups``), as strings."""
    labels = ["all"] * n if groups is None else [str(g) for g in groups]
    if len(labels) != n:
        raise ValueError(f"groups must have one label per score, got {len(labels)} for {n} scores")
    return labels


def _check_bootstrap(n_boot, confidence, least: int) -> None:
    """``n_boot`` an int of at least ``least`` (0 or 1), ``confidence`` in (0, 1)."""
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < least:
        raise ValueError(f"n_boot must be a {'non-negative' if least == 0 else 'positive'} int, got {n_boot!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def _members(labels: Sequence[str]) -> dict[str, list[int]]:
    """Indices of each group label; every group needs at least 2 segments."""
    members: dict[str, list[int]] = {}
    for i, g in enumerate(labels):
        members.setdefault(g, []).append(i)
    if not members:
        raise ValueError("no scores to correlate")
    for g, idx in members.items():
        if len(idx) < 2:
            raise ValueError(f"group {g!r} has {len(idx)} segment: a correlation needs at least 2")
    return members


def _group(name: str, n: int, point: np.ndarray, reps: np.ndarray | None, q) -> GroupCorrelation:
    if reps is None or np.isnan(reps).all():
        bounds = np.full((2, 3), np.nan)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column stays NaN
            bounds = np.nanpercentile(reps, q, axis=0)  # [2, 3]
    return GroupCorrelation(name, n, *(Estimate(float(point[k]), float(bounds[0, k]), float(bounds[1, k]))
                                       for k in range(3)))


# --- Williams test -------------------------------------------------------------------------------

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            return h
    raise RuntimeError(f"incomplete beta continued fraction did not converge for a={a}, b={b}, x={x}")


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta ``I_x(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def _t_sf(t: float, df: float) -> float:
    """``P(T > t)`` for Student's t with ``df`` degrees of freedom: ``I_{df/(df+t²)}(df/2, 1/2) / 2``."""
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def williams_test(r12: float, r13: float, r23: float, n: int) -> tuple[float, float]:
    """Williams' test that ``ρ12 > ρ13`` for dependent correlations sharing variable 1 (the humans).

    ``r12``: corr(human, metric A), ``r13``: corr(human, metric B), ``r23``: corr(A, B), over ``n``
    segments. Williams (1959), in the form of Graham & Baldwin (2014, Eq. 1)::

        K = 1 − r12² − r13² − r23² + 2 r12 r13 r23
        t = (r12 − r13) √((n − 1)(1 + r23)) / √(2K (n − 1)/(n − 3) + (r12 + r13)²/4 · (1 − r23)³)

    Returns ``(t, p)`` with ``p = P(T_{n−3} > t)``, the one-sided p-value of "A correlates better
    than B"; ``p < 0.5`` exactly when ``r12 > r13``.

    Example:
        >>> t, p = williams_test(0.6, 0.5, 0.8, 500)
        >>> round(t, 4), round(p, 8)
        (4.3985, 6.67e-06)
    """
    for name, r in (("r12", r12), ("r13", r13), ("r23", r23)):
        if not -1.0 <= r <= 1.0:
            raise ValueError(f"{name} must be a correlation in [-1, 1], got {r!r}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 4:
        raise ValueError(f"n must be an int of at least 4 (the test has n − 3 degrees of freedom), got {n!r}")
    K = 1 - r12 ** 2 - r13 ** 2 - r23 ** 2 + 2 * r12 * r13 * r23  # det of the 3×3 correlation matrix
    if K < -1e-12:
        raise ValueError(f"r12={r12}, r13={r13}, r23={r23} are not the correlations of three variables "
                         f"(their correlation matrix has determinant {K:.3g} < 0)")
    K = max(K, 0.0)
    denominator = 2 * K * (n - 1) / (n - 3) + (r12 + r13) ** 2 / 4 * (1 - r23) ** 3
    numerator = (r12 - r13) * math.sqrt((n - 1) * (1 + r23))
    if denominator <= 0:
        t = 0.0 if numerator == 0 else math.copysign(math.inf, numerator)
    else:
        t = numerator / math.sqrt(denominator)
    return t, _t_sf(t, n - 3)


class Comparison(NamedTuple):
    """Result of :func:`compare`: the three correlations, ``n``, Williams' ``t`` and one-sided ``p``,
    and the one-sided ``p_permutation`` of the paired permutation test over ``n_permutations``
    permutations (NaN when none were run). Small p-values: A correlates with the humans better than B."""

    r_a: float
    r_b: float
    r_ab: float
    n: int
    t: float
    p: float
    p_permutation: float = math.nan
    n_permutations: int = 0


def _checked_triple(scores_a, scores_b, human, method: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if method not in ("pearson", "spearman"):
        raise ValueError(f"method must be 'pearson' or 'spearman', got {method!r}")
    a, b, h = _as_array("scores_a", scores_a), _as_array("scores_b", scores_b), _as_array("human", human)
    if not len(a) == len(b) == len(h):
        raise ValueError(f"scores_a, scores_b and human must have the same length, got {len(a)}, {len(b)}, {len(h)}")
    return a, b, h


def compare(scores_a, scores_b, human, *, method: str = "pearson", n_permutations: int = 1000,
            seed: int = 0) -> Comparison:
    """Is metric A's correlation with ``human`` greater than metric B's? Williams' test on Pearson
    correlations (``method="spearman"``: on ranks), and the paired permutation test
    (:func:`paired_permutation_test`, ``n_permutations`` permutations drawn with ``seed``; 0: not run)."""
    a, b, h = _checked_triple(scores_a, scores_b, human, method)
    ones = np.ones((1, len(h)))
    ranked = [_weighted_ranks(v, ones)[0][0] for v in (a, b, h)] if method == "spearman" else (a, b, h)
    ra, rb, rh = ranked
    r_a, r_b, r_ab = (float(_weighted_pearson(u, v, ones)[0]) for u, v in ((rh, ra), (rh, rb), (ra, rb)))
    if any(math.isnan(r) for r in (r_a, r_b, r_ab)):
        raise ValueError("a constant variable: correlations are undefined")
    t, p = williams_test(r_a, r_b, r_ab, len(h))
    p_permutation = (paired_permutation_test(a, b, h, method=method, n_permutations=n_permutations, seed=seed)
                     if n_permutations else math.nan)
    return Comparison(r_a, r_b, r_ab, len(h), t, p, p_permutation, n_permutations)


def _row_ranks(codes: np.ndarray, m: int) -> np.ndarray:
    """Average (mid-)ranks within each row of ``codes`` ``[B, n]``, integers in ``[0, m)`` that order
    like the values they stand for (equal codes tie), as ``scipy.stats.rankdata(codes, axis=1)``.

    With ``W[b, u]`` the number of entries of row ``b`` equal to ``u``, code ``u`` has rank
    ``Σ_{v<u} W[b, v] + (W[b, u] + 1) / 2`` — a counting sort, ``O(B (n + m))``."""
    rows = np.arange(codes.shape[0])[:, None]
    counts = np.bincount((codes + m * rows).ravel(), minlength=codes.shape[0] * m).reshape(-1, m)  # [B, m]
    below = np.cumsum(counts, axis=1) - counts
    return below[rows, codes] + (counts[rows, codes] + 1) / 2


def paired_permutation_test(scores_a, scores_b, human, *, method: str = "pearson", n_permutations: int = 1000,
                            seed: int = 0) -> float:
    """One-sided p-value of "metric A correlates with ``human`` better than metric B", by a paired
    permutation test (approximate randomisation, as in WMT's metrics tasks).

    Under the null hypothesis the two metrics are exchangeable on each segment. Permutation ``k``
    swaps the two metrics' scores of segment ``i`` where ``swap[k, i]`` is True, with
    ``swap = numpy.random.default_rng(seed).random((n_permutations, n)) < 0.5``, and recomputes
    ``Δ_k = corr(human, A_k) − corr(human, B_k)`` (``method``: ``pearson``, or ``spearman`` on the
    permuted scores' ranks). With the observed ``Δ``, ``p = (1 + #{k: Δ_k ≥ Δ}) / (1 + n_permutations)``
    (never 0; ``Δ_k`` within 1e-12 of ``Δ`` counts as reaching it). Unlike Williams' test it assumes
    no distribution, but its resolution is ``1 / (1 + n_permutations)``.
    """
    a, b, h = _checked_triple(scores_a, scores_b, human, method)
    if isinstance(n_permutations, bool) or not isinstance(n_permutations, int) or n_permutations < 1:
        raise ValueError(f"n_permutations must be a positive int, got {n_permutations!r}")
    n = len(h)
    if method == "spearman":  # permute integer codes of the values (shared by A and B), rank each row
        h = _weighted_ranks(h, np.ones((1, n)))[0][0]
        distinct, codes = np.unique(np.r_[a, b], return_inverse=True)
        a, b = codes[:n], codes[n:]

    def difference(pa: np.ndarray, pb: np.ndarray) -> np.ndarray:  # [B, n] each -> [B]
        if method == "spearman":
            pa, pb = _row_ranks(pa, len(distinct)), _row_ranks(pb, len(distinct))
        ones = np.ones(pa.shape)
        return _weighted_pearson(pa, h, ones) - _weighted_pearson(pb, h, ones)

    observed = difference(a[None], b[None])[0]
    if math.isnan(observed):
        raise ValueError("a constant variable: correlations are undefined")
    swap = np.random.default_rng(seed).random((n_permutations, n)) < 0.5
    reached = 0
    step = max(1, _PERMUTATION_BLOCK // max(n, 1))
    for k0 in range(0, n_permutations, step):
        s = swap[k0:k0 + step]
        deltas = difference(np.where(s, b, a), np.where(s, a, b))
        reached += int((deltas >= observed - 1e-12).sum())
    return (1 + reached) / (1 + n_permutations)


class Difference(NamedTuple):
    """Result of :func:`paired_bootstrap_difference`: ``value``, the observed difference of the two
    average correlations; ``mean``, ``low``, ``high``: the mean of the bootstrap differences and their
    percentile interval; ``p_le_0``: the fraction of resamples whose difference is ``<= 0``."""

    value: float
    mean: float
    low: float
    high: float
    p_le_0: float
    n_boot: int
    confidence: float


def paired_bootstrap_difference(scores_a, scores_b, human, groups: Sequence | None = None, *,
                                method: str = "pearson", n_boot: int = 1000, seed: int = 0,
                                confidence: float = 0.95) -> Difference:
    """The difference of two metrics' average correlations with ``human``, with a paired bootstrap
    interval: is metric A's average correlation over groups above metric B's?

    With groups ``g = 1 … G`` (sorted by name, each of ``n_g`` segments) and ``r_g(s)`` the
    correlation (``method``: ``pearson``, or ``spearman``) of scores ``s`` with ``human`` on group ``g``,
    the statistic is ``Δ = (1/G) Σ_g [r_g(A) − r_g(B)]``. Resample ``b`` draws, in each group, ``n_g``
    of its segments with replacement — the **same** segments for A and B (paired) — as
    ``numpy.random.default_rng(seed).integers(0, n_g, size=(n_boot, n_g))``, group after group (the
    draws of :func:`correlate`), and computes ``Δ_b`` on them. Returns ``Δ``, the mean of the ``Δ_b``,
    their ``confidence`` percentile interval and ``P(Δ_b <= 0)`` (a bootstrap estimate of how often
    A would not come out ahead). Pairing removes the variance the two metrics share (the segments'
    difficulty), so the interval is much narrower than the two correlations' own intervals suggest.
    """
    if method not in ("pearson", "spearman"):
        raise ValueError(f"method must be 'pearson' or 'spearman', got {method!r}")
    a, b, h = _as_array("scores_a", scores_a), _as_array("scores_b", scores_b), _as_array("human", human)
    if not len(a) == len(b) == len(h):
        raise ValueError(f"scores_a, scores_b and human must have the same length, got {len(a)}, {len(b)}, {len(h)}")
    labels = _group_labels(groups, len(h))
    _check_bootstrap(n_boot, confidence, least=1)
    members = _members(labels)

    def correlation(x: np.ndarray, y: np.ndarray, c: np.ndarray) -> np.ndarray:  # [B]
        if method == "spearman":
            x, y = _weighted_ranks(x, c)[0], _weighted_ranks(y, c)[0]
        return _weighted_pearson(x, y, c)

    rng = np.random.default_rng(seed)
    observed, deltas = 0.0, np.zeros(n_boot)
    for name in sorted(members):
        idx = np.asarray(members[name])
        ga, gb, gh = a[idx], b[idx], h[idx]
        ones = np.ones((1, len(idx)))
        observed += float(correlation(ga, gh, ones)[0] - correlation(gb, gh, ones)[0])
        counts = _bootstrap_counts(rng, len(idx), n_boot)
        deltas += correlation(ga, gh, counts) - correlation(gb, gh, counts)
    observed, deltas = observed / len(members), deltas / len(members)
    if math.isnan(observed) or np.isnan(deltas).any():
        raise ValueError("a constant variable in a group or a resample: the correlations are undefined")
    low, high = np.percentile(deltas, [50 * (1 - confidence), 50 * (1 + confidence)])
    return Difference(observed, float(deltas.mean()), float(low), float(high), float((deltas <= 0).mean()),
                      n_boot, confidence)


# --- scoring ratings -----------------------------------------------------------------------------

def score_and_correlate(scorer, records: Sequence[Rating], batch_size: int = 64, *, n_boot: int = 1000,
                        seed: int = 0, confidence: float = 0.95, progress: bool | None = None) -> Report:
    """Score ``records`` (:class:`~torchmover.evaluation.data.Rating`) with ``scorer.score(hyps, refs, ...)`` and
    correlate with their human scores per ``lp/year`` group; the report carries the scorer's
    signature, and the system level (``report.system_level``) when every record names its system."""
    if not records:
        raise ValueError("records is empty")
    _members([r.group for r in records])  # fail before scoring
    hyps, refs = [r.hyp for r in records], [r.ref for r in records]
    scores = scorer.score(hyps, refs, batch_size=batch_size, progress=progress)
    systems = [r.system for r in records]
    return correlate(scores, [r.score for r in records], [r.group for r in records],
                     systems=None if None in systems else systems, n_boot=n_boot, seed=seed,
                     confidence=confidence, metric=getattr(scorer, "signature", None))
