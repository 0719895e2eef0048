"""Scoring a Ray Dataset with Ray Data: :class:`ScoreBatches`, a callable class for
``Dataset.map_batches`` that holds one scorer per worker.

RL stacks (verl, OpenRLHF) run on Ray clusters; a dataset of generated texts there is scored with::

    import ray
    from torchmover.integrations.ray import ScoreBatches

    pairs = ray.data.read_parquet("rollouts.parquet")  # columns "hyp" and "ref" (a text or a list of texts)
    scored = pairs.map_batches(
        ScoreBatches,
        fn_constructor_kwargs={"scorer": "my-scorer/"},  # a Scorer.save_pretrained directory, or options
        batch_size=256,  # pairs per call of a worker (its scorer batches them again by length)
        concurrency=4,  # workers (Ray actors), each loading the model once
        num_gpus=0.25,  # each worker's share of a GPU: four workers on one GPU here; leave out on CPUs
    )
    scored.write_parquet("scored/")  # the input columns and "score"

Ray starts ``concurrency`` actors, each constructing one :class:`ScoreBatches` (the model is loaded
once per worker, not per batch) and reserving ``num_gpus`` of a GPU: a fraction lets several workers
share one (the default model needs a few hundred MiB each; a fraction is a scheduling promise, not a
memory limit, so size it to the memory a worker needs). On a GPU the scorer's ``device="auto"`` is the
GPU Ray assigned to the worker. ``batch_size`` trades memory for speed as ``Scorer.score``'s does.

Each batch is scored on its own, so a statistic that depends on the call's texts would depend on how
Ray cuts the dataset: ``batch`` centering is refused, and IDF, a ``fixed`` centering mean and the
rescaling baseline must come fitted (fit them on a corpus once, :meth:`~torchmover.Scorer.save_pretrained`,
and pass the directory). The default model's measured default centering is ``none``.
"""
from __future__ import annotations

import os
from typing import Any, cast

import numpy as np
from torch import Tensor

from ..scorer import Scorer
from ..scorer.inputs import as_list
from ..scorer.units import PRF
from .parsing import reference_list


def scorer_of(scorer: Scorer | str | os.PathLike | dict | None) -> Scorer:
    """The :class:`~torchmover.Scorer` that ``scorer`` describes: itself; a directory written by
    :meth:`~torchmover.Scorer.save_pretrained` (fitted statistics included); or a dict of
    :class:`~torchmover.Scorer` options (None: the default scorer). Refuses a scorer whose scores would
    depend on how a dataset is cut into batches."""
    if scorer is None or isinstance(scorer, dict):
        scorer = Scorer(**(scorer or {}))
    elif isinstance(scorer, (str, os.PathLike)):
        scorer = Scorer.from_pretrained(scorer)
    elif not isinstance(scorer, Scorer):
        raise TypeError(f"scorer must be a Scorer, a save_pretrained directory or a dict of options, got "
                        f"{type(scorer).__name__}")
    config = scorer.config
    if config.centering == "batch":
        raise ValueError("Ray Data scores each batch on its own: centering='batch' would center each batch on its "
                         "own texts. Use centering='none', or 'fixed' fitted once (fit_centering, save_pretrained)")
    unfitted = [name for name, missing in (
        ("IDF (fit_idf)", config.idf and not scorer.idf),
        ("the centering mean (fit_centering)", config.centering in ("fixed", "running") and not scorer.centering.fitted),
        ("the rescaling baseline (fit_baseline)", config.rescale and scorer.baseline is None)) if missing]
    if unfitted:
        raise ValueError(f"this scorer needs {', '.join(unfitted)} fitted before Ray Data scores with it: fit it on a "
                         "corpus once, save_pretrained, and pass the directory")
    return scorer


def reference_lists(column, name: str) -> list[list[str]]:
    """The references of each row of a batch's ``column`` (called ``name``): a text, or a list or array
    of texts (:func:`~torchmover.integrations.parsing.reference_list`: None and blank entries dropped).
    A row without a reference raises a ValueError, one of another type a TypeError, naming the column
    and the row of the batch."""
    refs = []
    for i, value in enumerate(as_list(f"column {name!r}", column, "references", ndim=2)):
        where = f"column {name!r}, row {i} of the batch"
        row = reference_list(value, where)
        if row is None:
            raise ValueError(f"{where} has no reference to score against (got {value!r})")
        refs.append(row)
    return refs


class ScoreBatches:
    """A callable class for ``ray.data.Dataset.map_batches``: each Ray worker constructs one (one
    scorer, :func:`scorer_of`) and calls it on batches of pairs (module docs).

    Args:
        scorer: a :class:`~torchmover.Scorer` (sent to every worker), a
            :meth:`~torchmover.Scorer.save_pretrained` directory, or a dict of Scorer options
            (default: the default scorer).
        hyps, refs: the columns of the hypotheses and of the references (a text, or a list of texts
            each: several references; :func:`reference_lists`, a row without one is an error).
        output: the column of the scores (``return_all``: ``<output>_precision``, ``_recall``,
            ``_f1``).
        return_all: precision, recall and F1 instead of the scorer's direction.
        batch_size: the scorer's batch (pairs encoded and moved at once).

    A batch is a dict of columns (``batch_format="numpy"``, Ray's default) or a pandas DataFrame
    (``"pandas"``); the score columns are added to it (float32).
    """

    def __init__(self, scorer: Scorer | str | os.PathLike | dict | None = None, *, hyps: str = "hyp",
                 refs: str = "ref", output: str = "score", return_all: bool = False, batch_size: int = 64):
        self.scorer = scorer_of(scorer)
        self.hyps, self.refs, self.output = hyps, refs, output
        self.return_all, self.batch_size = return_all, batch_size

    def __call__(self, batch: Any) -> Any:
        for column in (self.hyps, self.refs):
            if column not in batch:
                raise KeyError(f"the batch has no column {column!r} (columns: {list(batch.keys())})")
        refs = reference_lists(batch[self.refs], self.refs)
        scores = self.scorer.score(batch[self.hyps], refs, batch_size=self.batch_size, progress=False,
                                   return_all=self.return_all)
        if self.return_all:  # a PRF exactly with return_all, else a tensor
            prf = cast(PRF, scores)
            for name, values in zip(prf._fields, prf):
                batch[f"{self.output}_{name}"] = values.numpy().astype(np.float32)
        else:
            batch[self.output] = cast(Tensor, scores).numpy().astype(np.float32)
        return batch
