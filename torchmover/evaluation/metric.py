"""``MoverMetric``: a :class:`~torchmover.Scorer` as a ``torchmetrics.Metric`` (``pip install torchmover[metrics]``).

The metric is a stateful shell around the scorer and adds only accumulation: ``compute`` returns the
mean of the per-prediction scores ``s_i`` over every prediction seen, on every rank,

    score = (1 / N) Σ_{i=1}^{N} s_i,

so a corpus split over W processes gives the score of one process on the whole corpus.

Centering, and why results do not depend on how the data is cut into ``update`` calls:

- with a centering independent of the batch (``none``, ``fixed``, ...) ``update`` scores its batch at
  once and appends the ``s_i`` to the list state ``scores`` (all-gathered with ``dist_reduce_fx="cat"``);
- with ``batch`` centering, ``update`` only keeps the texts (``preds``, ``targets``: local list states,
  never gathered) and ``compute`` scores them all with :meth:`Scorer.score <torchmover.Scorer.score>`,
  which centers on the mean of every distinct text seen (under DDP: of every rank's, a text on several
  ranks counted once, through one all-reduce of token sums and counts), then gathers the scores.
  ``s_i`` therefore equals what the scorer's ``forward`` gives on the whole corpus at once, however
  the updates were cut.

The scorer scores in eval mode (no dropout) even when the module that holds the metric is training,
unless ``train_scorer=True``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence, cast

import torch
from torch import Tensor

try:
    from torchmetrics import Metric
    from torchmetrics.utilities import dim_zero_cat
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "torchmover.evaluation.metric needs torchmetrics; install it with `pip install torchmover[metrics]` "
        "(or `pip install torchmetrics`)"
    ) from e

from .._internal.moduletree import eval_mode
from ..runtime.devices import autocast_off
from ..scorer import Scorer, ScorerConfig
from ..scorer.config import RunOptions
from ..scorer.inputs import check_references, check_texts


class MoverMetric(Metric):
    """Mean word-mover similarity (TWMD by default) of predictions to their references.

    Args:
        scorer: a ready :class:`~torchmover.Scorer` (its centering, method, ... are used as they
            are). Omit it to build one from the keyword arguments that :class:`~torchmover.Scorer`
            accepts (``model``, ``layer``, ``method``, ``centering``, ...).
        return_per_sample: make :meth:`compute` return ``{"score": mean, "per_sample": scores}``
            (``scores``: ``[N]``, in update order; under DDP rank 0's then rank 1's ...) instead of
            the mean alone.
        train_scorer: score with the scorer in its own mode (dropout when training, per-batch
            centering synchronised across ranks) and under the caller's ``torch.autocast`` — to
            fine-tune the scorer through ``forward``. By default (False) every call runs the scorer in
            eval mode, even when the metric's parent module is training, and its modes are restored
            afterwards; and with autocast off, so that a training loop's mixed precision does not
            change the scores (the scorer's ``dtype`` does, and its signature says so).
        **kwargs: the remaining keyword arguments go to ``torchmetrics.Metric``
            (``sync_on_compute``, ``dist_sync_on_step``, ``process_group``, ...).

    ``preds`` and ``target`` may also be a single string each (one pair).
    ``metric(preds, target)`` (``forward``) returns the batch's value — the scorer's ``forward`` on
    the batch alone, whose ``batch`` centering uses the batch's mean — with autograd intact, e.g. as a
    loss for fine-tuning the scorer. With ``dist_sync_on_step=True`` it is the value of every rank's
    batch, their scores gathered in rank order (``per_sample``: ``[Σ_r B_r]``), whatever the centering:
    each rank's batch scored as above (in eval mode, the default, on its own batch's mean), this
    rank's scores with their graph. ``update`` runs without grad, as in every torchmetrics metric,
    and the accumulated state never keeps a graph. The scorer is a submodule: ``.to(device)``
    moves it, and its weights are part of the metric's ``state_dict``.

    Example:
        >>> metric = MoverMetric(centering="fixed", device="cpu")
        >>> _ = metric.scorer.fit_centering(["a cat sat", "the dog sat", "a bird flew"], progress=False)
        >>> metric.update(["the cat sat"], [["a cat sat", "the dog sat"]])
        >>> round(metric.compute().item(), 4)
        0.8402
    """

    is_differentiable = True
    higher_is_better = True
    full_state_update = False
    plot_legend_name = "score"
    plot_lower_bound = -1.0  # scores are normalised similarities, Sim(X, X) = 1 (rescaled: no lower bound)
    plot_upper_bound = 1.0

    scores: list[Tensor]
    preds: list[str]
    targets: list[tuple[str, ...]]

    def __init__(self, scorer: Scorer | None = None, *, return_per_sample: bool = False, train_scorer: bool = False,
                 **kwargs: Any):
        config = {k: kwargs.pop(k) for k in list(kwargs) if k in ScorerConfig.__dataclass_fields__}
        run = {k: kwargs.pop(k) for k in list(kwargs) if k in RunOptions.__dataclass_fields__}
        super().__init__(**kwargs)
        if scorer is None:
            scorer = Scorer.from_config(ScorerConfig(**config), **run)
        elif not isinstance(scorer, Scorer):
            raise TypeError(f"scorer must be a torchmover.Scorer or None, got {type(scorer).__name__}")
        elif config or run:
            raise ValueError(f"pass either scorer or Scorer options, not both: got scorer and {sorted({**config, **run})}")
        for option, value in (("return_per_sample", return_per_sample), ("train_scorer", train_scorer)):
            if not isinstance(value, bool):
                raise TypeError(f"{option} must be a bool, got {type(value).__name__}")
        self.scorer = scorer
        self.return_per_sample = return_per_sample
        self.train_scorer = train_scorer
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        # batch centering: the texts, scored together in compute (kept per rank, never gathered)
        self.add_state("preds", default=[], dist_reduce_fx=None)
        self.add_state("targets", default=[], dist_reduce_fx=None)
        self.to(scorer.encoder.device)  # the metric follows the scorer's device (Scorer(device="auto"))

    @property
    def _scores_at_compute(self) -> bool:
        """Whether scoring waits for :meth:`compute` (``batch`` centering: the mean of every text)."""
        return self.scorer.config.centering == "batch"

    @contextlib.contextmanager
    def _scoring_mode(self) -> Iterator[None]:
        """The scorer as this metric scores: by default in eval mode with autocast off (the scores its
        signature describes, also inside a training loop's mixed precision); with ``train_scorer``, as
        the caller runs it (its mode, the caller's autocast)."""
        if self.train_scorer:
            yield
            return
        with eval_mode(self.scorer), autocast_off(self.scorer.encoder.device):
            yield

    def update(self, preds: str | Sequence[str], target: str | Sequence[str] | Sequence[Sequence[str]]) -> None:
        """Score ``preds`` against ``target`` (one reference per prediction, or a list of them; or
        one string each)."""
        if isinstance(preds, str):
            preds, target = [preds], cast(Sequence[Any], [target])  # one text: its reference(s)
        preds = check_texts("preds", preds)  # checked here, so that errors name this method's arguments
        groups = check_references(preds, target, names=("preds", "target"))
        if self._scores_at_compute:
            self.preds.extend(preds)
            self.targets.extend(tuple(group) for group in groups)
            return
        with self._scoring_mode():
            self.scores.append(self.scorer(preds, groups))  # [B]

    def compute(self) -> Tensor | dict[str, Tensor]:
        """Mean score over every prediction seen (NaN before any); see ``return_per_sample``."""
        scores = self._scores_of_texts() if self._scores_at_compute else (
            dim_zero_cat(self.scores) if len(self.scores) else torch.zeros(0, device=self.device))  # [N]
        mean = scores.mean() if scores.numel() else torch.tensor(float("nan"), device=scores.device)
        return {"score": mean, "per_sample": scores} if self.return_per_sample else mean

    def _wrap_compute(self, compute):
        """torchmetrics' wrapping of ``compute`` (sync, cache, every one-element tensor squeezed), then
        ``per_sample`` made 1-D again, so that the scores of a single prediction are ``[1]``, not 0-d.
        torchmetrics wraps ``compute`` here at construction and again when a metric is unpickled, so
        a copy (``clone``, ``copy.deepcopy``, a pickle round trip) keeps the guarantee."""
        wrapped = super()._wrap_compute(compute)

        def with_1d_per_sample(*args, **kwargs):
            value = wrapped(*args, **kwargs)
            if isinstance(value, dict):
                value["per_sample"] = value["per_sample"].reshape(-1)
            return value
        return with_1d_per_sample

    def _scores_of_texts(self) -> Tensor:
        """``batch`` centering: the kept texts scored together. In ``forward`` (the batch's texts
        only) by the scorer's differentiable ``forward``, on the batch's mean; else by ``Scorer.score``
        on the mean of every rank's texts. Where the call syncs under ``torch.distributed``
        (``compute`` with ``sync_on_compute``, ``forward`` with ``dist_sync_on_step``), every rank's
        scores are then gathered in rank order, this rank's with their graph."""
        import torch.distributed as dist
        from torchmetrics.utilities.distributed import gather_all_tensors

        from ..runtime.distributed import is_distributed

        refs = [list(group) for group in self.targets]
        group = self.process_group or (dist.group.WORLD if dist.is_available() else None)
        synced = self._to_sync and is_distributed(self.process_group)
        if self._enable_grad:  # set by torchmetrics while forward computes the batch value
            with self._scoring_mode():
                scores = self.scorer(self.preds, refs)
        else:
            scores = self.scorer.score(self.preds, refs, progress=False, centering_group=group if synced else None)
            scores = cast(Tensor, scores).to(self.device)  # no return_all: a tensor
        return torch.cat(gather_all_tensors(scores, group)) if synced else scores

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        value = super().forward(*args, **kwargs)
        # the batch value keeps its graph; the accumulated state must not hold one graph per step
        self.scores = [s.detach() for s in self.scores]
        return value

    def plot(self, val: Tensor | dict[str, Tensor] | Sequence[Tensor] | Sequence[dict[str, Tensor]] | None = None,
             ax: Any = None) -> Any:
        """Plot a value of :meth:`compute` / ``forward`` (or a sequence of them, e.g. one per epoch);
        default: the current :meth:`compute`. Needs ``matplotlib``. Returns ``(figure, axes)``.

        With ``return_per_sample`` the mean (``"score"``) is plotted. The y axis spans the bounds
        ``[plot_lower_bound, plot_upper_bound] = [-1, 1]`` (a rescaled scorer: no lower bound).
        """
        from torchmetrics.utilities.plot import plot_single_or_multi_val

        val = self.compute() if val is None else val
        if isinstance(val, dict):
            val = val["score"]
        elif isinstance(val, Sequence) and val and isinstance(val[0], dict):
            val = [cast(dict[str, Tensor], v)["score"] for v in val]  # a sequence of dicts, as its first
        return plot_single_or_multi_val(
            val, ax=ax, higher_is_better=self.higher_is_better, name=type(self).__name__,
            lower_bound=None if self.scorer.config.rescale else self.plot_lower_bound,
            upper_bound=self.plot_upper_bound, legend_name=self.plot_legend_name)
