"""How much does each undocumented choice move a metric's correlation with humans?

The reproducibility study of Chen, Belouadi & Eger (2022, "Reproducibility issues for BERT-based
evaluation metrics") varies one preprocessing or metric choice at a time and reports how much the
segment-level correlation with human judgements moves. :func:`run_sensitivity` does the same for a
:class:`~torchmover.Scorer`: starting from a base configuration it varies **one factor at a time**
over its levels (every other option stays at the base value), scores the data set with each variant
and correlates the scores with the human scores per group (a language pair and year, ``"de-en/2016"``).

Factors (``FACTORS``) and their levels:

=============== ====================================================================================
``stopwords``   ``none`` / ``english`` (:data:`torchmover.text.weights.ENGLISH_STOPWORDS`)
``idf``         ``uniform`` weights / ``references``: one IDF dictionary fitted on the data set's
                references, used for both sides / ``separate``: references and hypotheses each fitted
                on their own side (MoverScore v2)
``subwords``    ``all`` / ``first`` / ``mean``
``punctuation`` ``keep`` / ``drop``
``layer``       every layer of the model, ``1 … num_hidden_layers`` (a new encoder per layer)
``centering``   ``none`` / ``batch`` / ``fixed`` (mean fitted on the data set's references) / ``sentence``
``temperature`` 0.02, 0.05, 0.1, 0.15, 0.2 (tempered methods: ``twmd``, ``trwmd``)
``iterations``  1, 2, 5, ``converged`` (``twmd``)
=============== ====================================================================================

A base value outside a factor's levels (a custom stopword list, ``T = 0.3``, ``centering="running"``)
is added as one more level, so every factor has a base level. With ``idf=True`` in the base options
the base level is ``separate`` (as ``torchmover correlate --idf`` fits it).

For each factor ``f`` and group ``g``, with ``r_k`` the correlation at level ``k`` (``K`` levels) and
``r_base`` the base level's:

* coefficient of variation ``CV = 100 · σ / |μ|``, ``μ = (1/K) Σ_k r_k``,
  ``σ = sqrt((1/K) Σ_k (r_k − μ)²)`` — the **population** standard deviation (``ddof = 0``);
* relative difference ``RD = 100 · max_k |r_k − r_base| / |r_base|``: the largest change from the base,
  in percent of the base correlation.

Both are in percent; the ``average`` column is the unweighted mean of the groups' values (not the CV
of the averaged correlation). Scores use ``scorer.score(..., batch_size)`` with one ``batch_size`` for
every variant (default 32, the TWMD paper's); ``batch`` centering uses the mean of every text of the
call, whatever the ``batch_size``.

Cost. The base :class:`~torchmover.Scorer` is built once; variants share its encoder
(``Scorer(base.encoder, **options)``), and the encoder's outputs are memoised per batch of texts, so
a factor that does not touch the encoder costs only the transport (``layer`` loads one encoder per
layer). The base variant is scored once and shared by every factor.

Example:
    >>> table = {"a": [0.30, 0.36, 0.33], "b": [0.5, 0.5, 0.5]}
    >>> cv = coefficient_of_variation(table["a"])
    >>> round(cv, 4), relative_difference(table["a"], base=0)
    (7.4227, 20.0)
"""
from __future__ import annotations

import dataclasses
import json
import math
import textwrap
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, cast

import numpy as np
import torch
from torch import nn

from ..functional.members import MEMBERS, get_member
from ..runtime.checkpoint import atomic_savefig
from ..scorer import Scorer, ScorerConfig
from ..scorer.config import NAMED_STOPWORDS, encoder_fields
from ..text.encoder import Encoder, TokenEmbeddings, kept_spans
from ..text.weights import PUNCTUATION_POLICIES, SUBWORD_POLICIES
from .correlation import correlate
from ..scorer.inputs import distinct_stripped

if TYPE_CHECKING:
    from .data import Rating

__all__ = ["FACTORS", "Level", "FactorResult", "SensitivityReport", "coefficient_of_variation",
           "relative_difference", "run_sensitivity", "select_per_group"]

FACTORS = ("stopwords", "idf", "subwords", "punctuation", "layer", "centering", "temperature", "iterations")
TEMPERATURES = (0.02, 0.05, 0.1, 0.15, 0.2)
ITERATIONS = (1, 2, 5, None)  # None = converged
CENTERINGS = ("none", "batch", "fixed", "sentence")
IDF_CORPORA = ("uniform", "references", "separate")
STATISTICS = ("pearson", "kendall")
# The config fields a variant passes to Scorer(encoder, **options): all but the encoder's, and but
# rescaling (a linear map of the scores: it moves no correlation).
_SCORING_FIELDS = tuple(name for name in ScorerConfig.__dataclass_fields__
                        if name not in encoder_fields() and name != "rescale")


# --- the two summaries ---------------------------------------------------------------------------

def coefficient_of_variation(values: Sequence[float]) -> float:
    """``100 · σ / |μ|`` of ``values`` with the population standard deviation (``ddof = 0``).

    NaN when a value is NaN or ``μ = 0``.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or len(v) == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {v.shape}")
    mean = v.mean()
    if not np.isfinite(mean) or mean == 0:
        return math.nan
    return float(100.0 * v.std(ddof=0) / abs(mean))


def relative_difference(values: Sequence[float], base: int) -> float:
    """``100 · max_k |r_k − r_base| / |r_base|`` with ``r_base = values[base]``.

    NaN when a value is NaN or ``r_base = 0``.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or len(v) == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {v.shape}")
    if not (isinstance(base, (int, np.integer)) and 0 <= base < len(v)):
        raise ValueError(f"base must be an index into values (0 <= base < {len(v)}), got {base!r}")
    r_base = v[base]
    if not np.isfinite(v).all() or r_base == 0:
        return math.nan
    return float(100.0 * np.abs(v - r_base).max() / abs(r_base))


# --- results -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Level:
    """One level of a factor: its ``name``, the variant's ``signature``, and per group its
    ``pearson`` r and ``kendall`` τ-b (``average``: the unweighted mean over groups)."""

    name: str
    signature: str
    pearson: Mapping[str, float]
    kendall: Mapping[str, float]
    seconds: float

    def to_dict(self) -> dict:
        return {"level": self.name, "signature": self.signature, "seconds": round(self.seconds, 2),
                **{s: {g: _json_float(v) for g, v in getattr(self, s).items()} for s in STATISTICS}}


@dataclasses.dataclass(frozen=True)
class FactorResult:
    """A factor's levels (in order) and which of them is the base configuration."""

    name: str
    levels: tuple[Level, ...]
    base: int

    def values(self, group: str, statistic: str = "pearson") -> list[float]:
        """The correlation of ``group`` (or ``"average"``) at each level."""
        return [getattr(level, statistic)[group] for level in self.levels]

    def cv(self, group: str, statistic: str = "pearson") -> float:
        """:func:`coefficient_of_variation` of ``group``'s correlations over the levels."""
        return coefficient_of_variation(self.values(group, statistic))

    def rd(self, group: str, statistic: str = "pearson") -> float:
        """:func:`relative_difference` of ``group``'s correlations from the base level."""
        return relative_difference(self.values(group, statistic), self.base)


@dataclasses.dataclass(frozen=True)
class SensitivityReport:
    """Correlations of every variant, per factor and group, with the CV and relative difference.

    ``groups`` are sorted by name; for a summary (:meth:`cv_table`, :meth:`rd_table`) the
    ``average`` column is the mean of the groups' values.
    """

    factors: tuple[FactorResult, ...]
    groups: tuple[str, ...]
    base_signature: str
    batch_size: int
    n_records: int
    seconds: float

    def __getitem__(self, name: str) -> FactorResult:
        for f in self.factors:
            if f.name == name:
                return f
        raise KeyError(f"no factor {name!r}; factors: {[f.name for f in self.factors]}")

    def _summary(self, kind: str, statistic: str) -> dict[str, dict[str, float]]:
        out = {}
        for f in self.factors:
            row = {g: getattr(f, kind)(g, statistic) for g in self.groups}
            finite = [v for v in row.values() if not math.isnan(v)]
            row["average"] = float(np.mean(finite)) if finite else math.nan
            out[f.name] = row
        return out

    def cv_table(self, statistic: str = "pearson") -> dict[str, dict[str, float]]:
        """``{factor: {group: CV, ..., "average": mean CV over groups}}`` in percent."""
        return self._summary("cv", _check_statistic(statistic))

    def rd_table(self, statistic: str = "pearson") -> dict[str, dict[str, float]]:
        """``{factor: {group: RD, ..., "average": mean RD over groups}}`` in percent."""
        return self._summary("rd", _check_statistic(statistic))

    def ranking(self, statistic: str = "pearson") -> list[tuple[str, float]]:
        """Factors from most to least sensitive by average CV."""
        table = self.cv_table(statistic)
        return sorted(((f, row["average"]) for f, row in table.items()),
                      key=lambda x: -x[1] if not math.isnan(x[1]) else math.inf)

    def to_dict(self) -> dict:
        definitions = {
            "cv": "100 * std / |mean| of the correlations over the factor's levels, population std (ddof=0)",
            "relative_difference": "100 * max_k |r_k - r_base| / |r_base|",
            "average": "unweighted mean over groups of the per-group value",
        }
        return {
            "base": self.base_signature, "batch_size": self.batch_size, "n_records": self.n_records,
            "groups": list(self.groups), "seconds": round(self.seconds, 1), "definitions": definitions,
            "factors": [{
                "factor": f.name, "base_level": f.levels[f.base].name,
                "levels": [level.to_dict() for level in f.levels],
                **{f"{kind}_{s}": {g: _json_float(v) for g, v in getattr(self, f"{kind}_table")(s)[f.name].items()}
                   for kind in ("cv", "rd") for s in STATISTICS},
            } for f in self.factors],
        }

    def to_json(self, indent: int | None = 2) -> str:
        """Every correlation, CV and relative difference as JSON (``null`` for NaN)."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "SensitivityReport":
        """The report :meth:`to_json` wrote (to re-print or re-plot it without rescoring)."""
        d = json.loads(text)

        def level(x: dict) -> Level:
            pearson, kendall = ({g: math.nan if v is None else v for g, v in x[s].items()} for s in STATISTICS)
            return Level(x["level"], x["signature"], pearson, kendall, x["seconds"])

        factors = tuple(FactorResult(f["factor"], tuple(level(x) for x in f["levels"]),
                                     [x["level"] for x in f["levels"]].index(f["base_level"])) for f in d["factors"])
        return cls(factors, tuple(d["groups"]), d["base"], d["batch_size"], d["n_records"], d["seconds"])

    def to_table(self, statistic: str = "pearson") -> str:
        """Fixed-width text: the CV table and the relative-difference table (factor × group, and
        the average over groups), then each factor's levels with their average correlation."""
        statistic = _check_statistic(statistic)
        label = {"pearson": "Pearson r", "kendall": "Kendall τ-b"}[statistic]
        short = [_short(g) for g in self.groups] + ["avg"]
        width = max(len(f.name) for f in self.factors) if self.factors else 6
        cols = [max(6, len(s)) for s in short]
        lines = [f"base: {self.base_signature}",
                 f"{self.n_records} segments, {len(self.groups)} groups, batch size {self.batch_size}; "
                 f"one factor varied at a time; statistic: {label}"]

        def block(title: str, table: dict[str, dict[str, float]]) -> None:
            head = f"{'factor':<{width}}  " + "  ".join(f"{s:>{c}}" for s, c in zip(short, cols))
            lines.extend(["", title, head, "-" * len(head)])
            for f in self.factors:
                row = table[f.name]
                values = [row[g] for g in self.groups] + [row["average"]]
                lines.append(f"{f.name:<{width}}  " + "  ".join(f"{_fmt(v, 2):>{c}}" for v, c in zip(values, cols)))

        block("CV (%) = 100·σ/|μ| over the levels, σ the population std; avg = mean over groups",
              self.cv_table(statistic))
        block("relative difference (%) = 100·max_k |r_k − r_base| / |r_base|; avg = mean over groups",
              self.rd_table(statistic))
        lines.extend(["", f"levels: average {label} over groups (* = base)"])
        for f in self.factors:
            cells = [f"{lv.name}{'*' if i == f.base else ''} {_fmt(getattr(lv, statistic)['average'], 4)}"
                     for i, lv in enumerate(f.levels)]
            lines.append(f"{f.name:<{width}}  " + " | ".join(cells))
        groups = ", ".join(f"{s}={g}" for s, g in zip(short, self.groups) if s != g)
        if groups:
            lines.extend(["", f"groups: {groups}"])
        return "\n".join(line.rstrip() for line in lines)

    def __str__(self) -> str:
        return self.to_table()

    def plot(self, path: str | Path, *, statistic: str = "pearson", columns: int = 3, dpi: int = 120) -> Path:
        """Write a picture (atomically; a PNG, or the format the suffix of ``path`` names): per factor, the
        correlation at each level (one line per group, the average in black, the base level marked), and
        a heat map of the CV by factor × group.

        Needs matplotlib: ``pip install torchmover[plot]``.
        """
        statistic = _check_statistic(statistic)
        try:
            from matplotlib.figure import Figure
        except ImportError as error:
            raise ImportError("SensitivityReport.plot needs matplotlib: pip install torchmover[plot]") from error
        if not self.factors:
            raise ValueError("this report has no factors to plot")
        label = {"pearson": "Pearson r", "kendall": "Kendall τ-b"}[statistic]
        k = len(self.factors) + 1
        cols = min(columns, k)
        rows = math.ceil(k / cols)
        fig = Figure(figsize=(4.4 * cols, 3.4 * rows + 0.8), layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False)
        colors = {g: f"C{i % 10}" for i, g in enumerate(self.groups)}
        for ax, f in zip(axes.flat, self.factors):
            x = np.arange(len(f.levels))
            for g in self.groups:
                ax.plot(x, f.values(g, statistic), marker="o", markersize=3, linewidth=0.9, alpha=0.75,
                        color=colors[g], label=_short(g))
            ax.plot(x, f.values("average", statistic), marker="s", markersize=4, linewidth=2.2, color="black",
                    label="average")
            ax.axvline(f.base, color="0.6", linestyle=":", linewidth=1)
            ax.set_xticks(x, [lv.name + ("*" if i == f.base else "") for i, lv in enumerate(f.levels)],
                          fontsize=7, rotation=30 if len(f.levels) > 4 else 0)
            ax.set_title(f"{f.name}  (avg CV {np.nanmean([f.cv(g, statistic) for g in self.groups]):.1f}%)",
                         fontsize=9)
            ax.set_ylabel(label, fontsize=8)
            ax.tick_params(axis="y", labelsize=7)
            ax.grid(alpha=0.3)
        axes.flat[0].legend(fontsize=6, ncol=2, loc="best")
        heat = axes.flat[len(self.factors)]
        table = self.cv_table(statistic)
        names = [f.name for f in self.factors]
        columns_ = list(self.groups) + ["average"]
        grid = np.array([[table[n][g] for g in columns_] for n in names])
        im = heat.imshow(grid, cmap="viridis", aspect="auto")
        heat.set_xticks(range(len(columns_)), [_short(g) if g != "average" else "avg" for g in columns_],
                        fontsize=6, rotation=60)
        heat.set_yticks(range(len(names)), names, fontsize=7)
        finite = grid[np.isfinite(grid)]
        middle = (finite.max() + finite.min()) / 2 if finite.size else 0
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                heat.text(j, i, _fmt(grid[i, j], 1), ha="center", va="center", fontsize=5.5,
                          color="black" if np.isfinite(grid[i, j]) and grid[i, j] > middle else "white")
        heat.set_title("CV (%) of the correlation over levels", fontsize=9)
        fig.colorbar(im, ax=heat, shrink=0.8)
        for ax in list(axes.flat)[k:]:
            ax.set_visible(False)
        base = textwrap.fill("base: " + self.base_signature.replace("|", " | "), 70 * cols,
                             break_on_hyphens=False, break_long_words=False)
        fig.suptitle(f"{label} per level, one factor varied at a time (* = base)\n{base}", fontsize=7)
        return atomic_savefig(fig, path, dpi=dpi)


def _check_statistic(statistic: str) -> str:
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
    return statistic


def _short(group: str) -> str:
    """``"de-en/2016"`` -> ``"de-en/16"``: keeps table columns narrow."""
    lp, _, year = group.partition("/")
    return f"{lp}/{year[2:]}" if len(year) == 4 and year.isdigit() else group


def _fmt(value: float, digits: int) -> str:
    return "nan" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _json_float(value: float) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


# --- the levels of each factor -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Variant:
    """What distinguishes one variant: the encoder layer, the scoring options (hashable) and the
    corpus the IDF dictionaries are fitted on."""

    layer: int
    options: tuple[tuple[str, object], ...]
    idf_corpus: str  # uniform / references / separate


def _levels(factor: str, config, idf_corpus: str, n_layers: int) -> tuple[list[str], list[dict], int]:
    """``(names, changes, base_index)`` of ``factor``: the option changes of each level from the base
    config (``{"layer": k}``, scoring options, ``{"idf_corpus": ...}``)."""
    if factor == "stopwords":
        names = ["none", "english"]
        changes: list[dict[str, Any]] = [{"stopwords": ()}, {"stopwords": NAMED_STOPWORDS["english"]}]
        current = config.stopwords
        base = 0 if not current else 1 if current == NAMED_STOPWORDS["english"] else None
        if base is None:
            names.append("custom")
            changes.append({"stopwords": current})
            base = 2
        return names, changes, base
    if factor == "idf":
        idf_changes: list[dict[str, Any]] = [{"idf": False, "idf_corpus": "uniform"},
                                             {"idf": True, "idf_corpus": "references"},
                                             {"idf": True, "idf_corpus": "separate"}]
        return list(IDF_CORPORA), idf_changes, IDF_CORPORA.index(idf_corpus)
    if factor == "subwords":
        return list(SUBWORD_POLICIES), [{"subwords": s} for s in SUBWORD_POLICIES], SUBWORD_POLICIES.index(config.subwords)
    if factor == "punctuation":
        return (list(PUNCTUATION_POLICIES), [{"punctuation": p} for p in PUNCTUATION_POLICIES],
                PUNCTUATION_POLICIES.index(config.punctuation))
    if factor == "layer":
        first = max(1, config.power_mean_layers - 1)  # power means need power_mean_layers <= layer + 1
        layers = sorted(set(range(first, n_layers + 1)) | {config.layer})
        return [str(k) for k in layers], [{"layer": k} for k in layers], layers.index(config.layer)
    if factor == "centering":
        centerings = list(CENTERINGS)
        if config.centering not in centerings:
            centerings.append(config.centering)
        changes = [{"centering": c, "center_scope": config.center_scope if c == "batch" else "joint"}
                   for c in centerings]
        names = [c + (f"-{config.center_scope}" if c == "batch" and config.center_scope != "joint" else "")
                 for c in centerings]
        return names, changes, centerings.index(config.centering)
    if factor == "temperature":
        temperatures = sorted(set(TEMPERATURES) | {config.temperature})
        return ([f"{t:g}" for t in temperatures], [{"temperature": t} for t in temperatures],
                temperatures.index(config.temperature))
    if factor == "iterations":
        fixed = [n for n in ITERATIONS if n is not None]
        if config.n_iter is not None and config.n_iter not in fixed:
            fixed.append(config.n_iter)
        iterations: list[int | None] = [*sorted(fixed), None]
        names = ["converged" if n is None else str(n) for n in iterations]
        return names, [{"n_iter": n} for n in iterations], iterations.index(config.n_iter)
    raise ValueError(f"unknown factor {factor!r}; choose from {FACTORS}")


def _applicable(factor: str, method: str) -> bool:
    member = get_member(method)
    if factor == "temperature":
        return member.temperature == "tuned"
    if factor == "iterations":
        return member.temperature == "tuned" and member.iterations
    return True


def _check_factors(factors, method: str) -> list[str]:
    if factors is None:
        return [f for f in FACTORS if _applicable(f, method)]
    if isinstance(factors, str):
        factors = [f.strip() for f in factors.split(",") if f.strip()]
    factors = list(dict.fromkeys(factors))
    if not factors:
        raise ValueError("factors is empty")
    unknown = [f for f in factors if f not in FACTORS]
    if unknown:
        raise ValueError(f"unknown factor(s) {unknown}; choose from {FACTORS}")
    inapplicable = [f for f in factors if not _applicable(f, method)]
    if inapplicable:
        where = {f: [m for m in MEMBERS if _applicable(f, m)] for f in inapplicable}
        raise ValueError(f"factor(s) {inapplicable} do not apply to method {method!r} (they apply to {where})")
    return factors


# --- running -------------------------------------------------------------------------------------

class _MemoEncoder(Encoder):
    """An encoder that shares another's model and remembers its outputs and its tokenizations per
    tuple of texts while grad is off and it is in eval mode: variants that do not change the encoder
    then tokenize each call's texts once and encode each batch once. The outputs are shared, never
    modified by a scorer (the token policy and centering make new tensors)."""

    def __init__(self, inner: Encoder):
        nn.Module.__init__(self)  # not Encoder.__init__: the model is already cut at the layer
        self.model, self.tokenizer = inner.model, inner.tokenizer
        self.layer, self.name, self.revision = inner.layer, inner.name, inner.revision
        self.max_length, self.special_tokens = inner.max_length, inner.special_tokens
        self.power_mean_layers, self.reads_type_ids = inner.power_mean_layers, inner.reads_type_ids
        self.special_ends, self.last_state_is_layer = inner.special_ends, inner.last_state_is_layer
        self.pass_cost = inner.pass_cost
        self._memo: dict[tuple[str, ...], TokenEmbeddings] = {}
        self._tokens: dict[tuple[str, ...], object] = {}

    def _remembers(self) -> bool:
        return not (torch.is_grad_enabled() or self.training)

    def tokenize(self, texts: Sequence[str], *, word_ids: bool = True):
        """:meth:`Encoder.tokenize`, remembered with word ids (which serve a caller that needs none)."""
        if not self._remembers():
            return super().tokenize(texts, word_ids=word_ids)
        key = tuple(texts)
        if key not in self._tokens:
            self._tokens[key] = super().tokenize(texts, word_ids=True)
        return self._tokens[key]

    def forward(self, texts: Sequence[str], token_policy=None, *, with_word_ids: bool = True,
                tokenized=None) -> TokenEmbeddings:
        if not self._remembers():
            return super().forward(texts, token_policy, with_word_ids=with_word_ids, tokenized=tokenized)
        key = tuple(texts)  # remembered with word ids, for every policy
        if key not in self._memo:
            self._memo[key] = super().forward(texts, tokenized=tokenized if tokenized is not None
                                              and tokenized.encodings is not None else None)
        tokens = self._memo[key]  # the token policy on the memoised tokens: one encoding for every policy
        if token_policy is None:
            return tokens
        mask = token_policy(tokens.mask, tokens.input_ids, tokens.word_ids)
        return tokens._replace(mask=mask, spans=kept_spans(mask.cpu().numpy()))  # the policy's spans


def _original_layers(encoder: Encoder) -> int:
    """Number of hidden layers of the encoder's model before it was cut at ``layer``."""
    from transformers import AutoConfig

    from ..text.encoder import resolve_model_path

    try:
        return int(AutoConfig.from_pretrained(resolve_model_path(encoder.source)).num_hidden_layers)
    except (OSError, ValueError) as error:
        raise ValueError(f"the layer factor needs the model's configuration, and {encoder.source!r} could not be "
                         f"loaded ({error}); pass encoder_for_layer= and n_layers=") from error


def select_per_group(records: Sequence[Rating], n: int | None) -> list[Rating]:
    """The first ``n`` records of each group (``lp/year``), in input order; ``None``: all."""
    if n is None:
        return list(records)
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"max_per_group must be an int >= 2 (a correlation needs 2 segments), got {n!r}")
    seen: dict[str, int] = {}
    out = []
    for r in records:
        if seen.get(r.group, 0) < n:
            seen[r.group] = seen.get(r.group, 0) + 1
            out.append(r)
    return out


def run_sensitivity(records: Sequence[Rating], base_options: Mapping | Scorer | None = None, *,
                    factors: Sequence[str] | str | None = None, batch_size: int = 32, progress: bool | None = None,
                    encoder_for_layer: Callable[[int], Encoder] | None = None,
                    n_layers: int | None = None) -> SensitivityReport:
    """Vary one factor at a time from the base configuration; correlate every variant with humans.

    Args:
        records: ratings (:class:`~torchmover.evaluation.data.Rating`); groups are ``lp/year``, each needs at
            least 2 records.
        base_options: :class:`~torchmover.Scorer` options of the base configuration (``model`` may be
            a ready :class:`~torchmover.Encoder`), or a built Scorer; ``None``: the default Scorer.
            Its IDF and fixed centering are (re)fitted here on the records.
        factors: names from ``FACTORS`` (a list or a comma-separated string); ``None``: every factor
            that applies to the base method (``temperature`` needs twmd/trwmd, ``iterations`` twmd).
        batch_size: hypotheses per ``scorer.score`` batch, the same for every variant.
        progress: a bar over the variants (``None``: when standard error is a terminal;
            :mod:`torchmover.runtime.progress`).
        encoder_for_layer: ``k -> Encoder`` at layer ``k`` for the ``layer`` factor (default:
            ``Encoder.from_pretrained`` of the base model with its encoder options).
        n_layers: the model's number of hidden layers (default: read from its configuration).

    Returns a :class:`SensitivityReport`. Corpus statistics are fitted on the records, in this process
    (never a collective): IDF on the distinct references (``references``) or on references and
    hypotheses separately (``separate``), a ``fixed`` centering mean on the distinct references (texts
    equal up to outer whitespace are one text: :func:`~torchmover.scorer.inputs.distinct_stripped`).
    """
    from tqdm.auto import tqdm

    from ..runtime.progress import show_progress

    records = list(records)
    if not records:
        raise ValueError("records is empty")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    groups_of = [r.group for r in records]
    counts = {g: groups_of.count(g) for g in set(groups_of)}
    small = sorted(g for g, c in counts.items() if c < 2)
    if small:
        raise ValueError(f"group(s) {small} have fewer than 2 records: a correlation needs at least 2")

    start = time.perf_counter()
    if base_options is None:
        base_options = {}
    base = base_options if isinstance(base_options, Scorer) else Scorer(**dict(base_options))
    config = base.config
    base_idf = "separate" if config.idf else "uniform"
    factor_names = _check_factors(factors, config.method)

    hyps, refs, human = [r.hyp for r in records], [r.ref for r in records], [r.score for r in records]
    distinct_refs, distinct_hyps = distinct_stripped("refs", refs), distinct_stripped("hyps", hyps)
    scoring = {name: getattr(config, name) for name in _SCORING_FIELDS}

    base_layer = cast(int, config.layer)  # a scorer's config is resolved (ScorerConfig.resolve): its layer is set
    encoders: dict[int, Encoder] = {base_layer: _MemoEncoder(base.encoder)}

    def encoder_at(layer: int) -> Encoder:
        if layer not in encoders:
            if encoder_for_layer is not None:
                encoder = encoder_for_layer(layer)
            else:
                encoder = Encoder.from_pretrained(base.encoder.source, layer=layer, revision=config.revision,
                                                  max_length=config.max_length,
                                                  special_tokens=cast(str, config.special_tokens),  # resolved: set
                                                  power_mean_layers=cast(int, config.power_mean_layers),
                                                  model_name=config.model)
                encoder.to(base.encoder.device)
            if encoder.layer != layer:
                raise ValueError(f"encoder_for_layer({layer}) returned an encoder at layer {encoder.layer}")
            encoders[layer] = encoder  # scored once: no memo needed
        return encoders[layer]

    # The plan: every factor's levels as variants, the base shared.
    plan: list[tuple[str, list[str], list[_Variant], int]] = []
    for name in factor_names:
        if name == "layer" and n_layers is None:
            n_layers = _original_layers(base.encoder)
        level_names, changes, base_index = _levels(name, config, base_idf, n_layers or base_layer)
        variants = []
        for change in changes:
            change = dict(change)
            layer = change.pop("layer", config.layer)
            corpus = change.pop("idf_corpus", base_idf)
            variants.append(_Variant(layer, tuple(sorted({**scoring, **change}.items())), corpus))
        plan.append((name, level_names, variants, base_index))
    distinct = list(dict.fromkeys(v for _, _, variants, _ in plan for v in variants))
    # Encoder-sharing variants first, then one layer at a time (each loaded encoder freed after use).
    distinct.sort(key=lambda v: (v.layer != config.layer, v.layer))

    results: dict[_Variant, Level] = {}
    bar = tqdm(distinct, desc="sensitivity", unit="variant", disable=not show_progress(progress))
    for variant in bar:
        options = dict(variant.options)
        bar.set_postfix_str(_describe(variant, config, scoring, base_idf), refresh=False)
        t0 = time.perf_counter()
        scorer = Scorer(encoder_at(variant.layer), **options)
        if options["idf"]:
            scorer.fit_idf(distinct_refs, distinct_hyps if variant.idf_corpus == "separate" else None,
                           distributed=False)
        if options["centering"] in ("fixed", "running"):
            scorer.fit_centering(distinct_refs, batch_size, progress=False, distributed=False)
        scores = scorer.score(hyps, refs, batch_size=batch_size, progress=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a constant variable: NaN, reported as such
            report = correlate(scores, human, groups_of, n_boot=0, metric=scorer.signature)
        pearson, kendall = ({**{g.name: getattr(g, s).value for g in report.groups},
                             "average": getattr(report.average, s).value} for s in STATISTICS)
        results[variant] = Level("", scorer.signature, pearson, kendall, time.perf_counter() - t0)
        if variant.layer != config.layer and not any(v.layer == variant.layer for v in distinct if v not in results):
            encoders.pop(variant.layer, None)  # free a per-layer encoder once its variants are done

    factor_results = tuple(
        FactorResult(name, tuple(dataclasses.replace(results[v], name=n) for n, v in zip(level_names, variants)),
                     base_index)
        for name, level_names, variants, base_index in plan)
    base_variant = _Variant(base_layer, tuple(sorted(scoring.items())), base_idf)  # in every factor
    return SensitivityReport(factor_results, tuple(sorted(counts)), results[base_variant].signature, batch_size,
                             len(records), time.perf_counter() - start)


def _describe(variant: _Variant, config, scoring: dict, base_idf: str) -> str:
    """The variant's difference from the base, for the progress bar."""
    changed = [f"{k}={v!r}" for k, v in variant.options if scoring.get(k) != v and k not in ("stopwords", "idf")]
    if dict(variant.options)["stopwords"] != scoring["stopwords"]:
        changed.append("stopwords")
    if variant.layer != config.layer:
        changed.append(f"layer={variant.layer}")
    if variant.idf_corpus != base_idf:
        changed.append(f"idf={variant.idf_corpus}")
    return ", ".join(changed) or "base"
