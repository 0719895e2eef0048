"""``MoverMetric``: a :class:`~torchmover.Scorer` as a ``torchmetrics.Metric`` (``pip install torchmover[metrics]``).

The metric is a stateful shell around the scorer and adds only accumulation: ``update`` scores a
batch and appends the per-hypothesis scores ``s_i`` to the list state ``scores`` (all-gathered with
``dist_reduce_fx="cat"`` under DDP); ``compute`` returns their mean over every hypothesis seen, on
every rank,

    score = (1 / N) Σ_{i=1}^{N} s_i,

so a corpus split over W processes gives the score of one process on the whole corpus.

Centering: with ``centering="batch"`` (the default for models without measured defaults) each ``s_i``
depends on the other texts
of its ``update`` call, so accumulated results depend on how the corpus is cut into updates. Fit a
``fixed`` centering (:meth:`~torchmover.Scorer.fit_centering`) for scores that do not. A scorer in
training mode with batch centering inside a DDP job centers each ``update`` over all ranks' batches
(:class:`~torchmover.Centering` ``sync``), so every rank must then call ``update`` in step.
"""
from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch
from torch import Tensor

try:
    from torchmetrics import Metric
    from torchmetrics.utilities import dim_zero_cat
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "torchmover.metric needs torchmetrics; install it with `pip install torchmover[metrics]` "
        "(or `pip install torchmetrics`)"
    ) from e

from .scorer import Scorer

_SCORER_OPTIONS = frozenset(inspect.signature(Scorer.__init__).parameters) - {"self"}


class MoverMetric(Metric):
    """Mean word-mover similarity (TWMD by default) of predictions to their references.

    Args:
        scorer: a ready :class:`~torchmover.Scorer` (its centering, method, ... are used as they
            are). Omit it to build one from the keyword arguments that :class:`~torchmover.Scorer`
            accepts (``model``, ``layer``, ``method``, ``centering``, ...).
        return_per_sample: make :meth:`compute` return ``{"score": mean, "per_sample": scores}``
            (``scores``: ``[N]``, in update order; under DDP rank 0's then rank 1's ...) instead of
            the mean alone.
        **kwargs: the remaining keyword arguments go to ``torchmetrics.Metric``
            (``sync_on_compute``, ``dist_sync_on_step``, ``process_group``, ...).

    ``metric(preds, target)`` (``forward``) returns the batch's mean with autograd intact, e.g. as a
    loss for fine-tuning the scorer; ``update`` runs without grad, as in every torchmetrics metric,
    and the accumulated ``scores`` never keep a graph. The scorer is a submodule: ``.to(device)``
    moves it, and its weights are part of the metric's ``state_dict``.

    Example:
        >>> metric = MoverMetric(centering="fixed")  # doctest: +SKIP
        >>> metric.scorer.fit_centering(corpus)  # doctest: +SKIP
        >>> metric.update(["the cat sat"], [["a cat sat", "the dog sat"]])  # doctest: +SKIP
        >>> metric.compute()  # doctest: +SKIP
    """

    is_differentiable = True
    higher_is_better = True
    full_state_update = False
    plot_legend_name = "score"

    scores: list[Tensor]

    def __init__(self, scorer: Scorer | None = None, *, return_per_sample: bool = False, **kwargs: Any):
        scorer_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in _SCORER_OPTIONS}
        super().__init__(**kwargs)
        if scorer is None:
            scorer = Scorer(**scorer_kwargs)
        elif not isinstance(scorer, Scorer):
            raise TypeError(f"scorer must be a torchmover.Scorer or None, got {type(scorer).__name__}")
        elif scorer_kwargs:
            raise ValueError(f"pass either scorer or Scorer options, not both: got scorer and {sorted(scorer_kwargs)}")
        if not isinstance(return_per_sample, bool):
            raise TypeError(f"return_per_sample must be a bool, got {type(return_per_sample).__name__}")
        self.scorer = scorer
        self.return_per_sample = return_per_sample
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.to(scorer.encoder.device)  # the metric follows the scorer's device (Scorer(device="auto"))

    def update(self, preds: Sequence[str], target: Sequence[str] | Sequence[Sequence[str]]) -> None:
        """Score ``preds`` against ``target`` (one reference per prediction, or a list of them)."""
        self.scores.append(self.scorer(preds, target))  # [B]

    def compute(self) -> Tensor | dict[str, Tensor]:
        """Mean score over every prediction seen (NaN before any); see ``return_per_sample``."""
        scores = dim_zero_cat(self.scores) if len(self.scores) else torch.zeros(0, device=self.device)  # [N]
        mean = scores.mean() if scores.numel() else torch.tensor(float("nan"), device=scores.device)
        return {"score": mean, "per_sample": scores} if self.return_per_sample else mean

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        value = super().forward(*args, **kwargs)
        # the batch value keeps its graph; the accumulated state must not hold one graph per step
        self.scores = [s.detach() for s in self.scores]
        return value

    def plot(self, val: Tensor | Sequence[Tensor] | None = None, ax: Any = None) -> Any:
        """Plot a value of :meth:`compute` / ``forward`` (or a sequence of them, e.g. one per epoch);
        default: the current :meth:`compute`. Needs ``matplotlib``. Returns ``(figure, axes)``.

        With ``return_per_sample`` the mean (``"score"``) is plotted.
        """
        val = self.compute() if val is None else val
        if isinstance(val, dict):
            val = val["score"]
        elif isinstance(val, Sequence) and val and isinstance(val[0], dict):
            val = [v["score"] for v in val]
        return self._plot(val, ax)
