"""One call from texts to scores, as ``bert_score.score`` does it: :func:`score`.

``torchmover.score(hyps, refs, **options)`` builds a :class:`~torchmover.Scorer` from ``options`` (the
Scorer's keyword arguments), keeps it in a small cache keyed by those options (the model is loaded
once for repeated calls), fits the corpus statistics the options ask for on the call's own texts
(:func:`fit_to_call`), and returns ``Scorer.score``'s result.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

from torch import Tensor

from ..scorer import PRF, Scorer
from ..scorer.inputs import check_references, check_texts, distinct_stripped

CACHE_SIZE = 4  # scorers (models) kept by score(); the least recently used one is dropped
_cache: OrderedDict[tuple, Scorer] = OrderedDict()


def _frozen(value: Any):
    """A hashable stand-in of an option value (lists and tuples become tuples, recursively)."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    hash(value)  # TypeError for anything else that cannot be a key
    return value


def cached_scorer(**options: Any) -> Scorer:
    """The scorer ``Scorer(**options)``, built once per distinct ``options`` and cached (the last
    ``CACHE_SIZE``); the same object for the same options."""
    try:
        key = tuple(sorted((name, _frozen(value)) for name, value in options.items()))
    except TypeError as e:
        raise TypeError(f"score() options must be hashable values (str, numbers, lists of str, an Encoder): {e}") from e
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    scorer = Scorer(**options)
    _cache[key] = scorer
    while len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return scorer


def fit_to_call(scorer: Scorer, references: Sequence[str], hypotheses: Sequence[str], *, batch_size: int = 64,
                progress: bool | None = None, baseline_corpus: Sequence[str] | None = None,
                baseline_pairs: int = 1000, distributed: bool = False) -> Scorer:
    """Fit the corpus statistics ``scorer`` needs on the texts of a call (the command line's and
    :func:`score`'s rule): IDF dictionaries on the distinct references and hypotheses, a ``fixed`` /
    ``running`` centering mean on the distinct references
    (:func:`~torchmover.scorer.inputs.distinct_stripped`: texts equal up to outer whitespace counted
    once), the rescaling baseline on ``baseline_corpus`` (default: the
    references; ``baseline_pairs`` random pairs, seed 0).

    ``distributed``: whether the call is a collective (every rank of an initialised
    ``torch.distributed`` group passes the same texts): the IDF and the centering mean are then fitted
    over the ranks, each encoding a share (:meth:`Scorer.fit_idf <torchmover.Scorer.fit_idf>`,
    :meth:`Scorer.fit_centering <torchmover.Scorer.fit_centering>`). By default they are fitted on
    this process alone, so a call on one rank, or on each rank's own texts, never waits for the others."""
    references = distinct_stripped("references", references)
    if scorer.config.idf:
        scorer.fit_idf(references, distinct_stripped("hypotheses", hypotheses), distributed=distributed)
    if scorer.config.centering in ("fixed", "running"):
        scorer.fit_centering(references, batch_size, progress=progress, distributed=distributed)
    if scorer.config.rescale:
        corpus = references if baseline_corpus is None else baseline_corpus
        scorer.fit_baseline(corpus, n_pairs=baseline_pairs, batch_size=batch_size, progress=progress)
    return scorer


def score(hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]], *, batch_size: int = 64,
          progress: bool | None = None, return_all: bool = False, baseline_corpus: Sequence[str] | None = None,
          baseline_pairs: int = 1000, distributed: bool = False, **options: Any) -> Tensor | PRF:
    """Score ``hyps`` against ``refs`` in one call: ``Tensor[B]``, or ``PRF(precision, recall, f1)``
    with ``return_all=True``.

    ``options`` are :class:`~torchmover.Scorer`'s keyword arguments (``model``, ``method``,
    ``centering``, ``idf``, ``rescale``, ...); the scorer is cached by them (:func:`cached_scorer`).
    Statistics are fitted on the call's texts (:func:`fit_to_call`): ``idf=True`` on its references
    and hypotheses, ``centering="fixed"`` on its references, ``rescale=True`` on ``baseline_corpus``
    (default: its references). The scorer, with its :attr:`~torchmover.Scorer.signature`, is
    ``cached_scorer(**options)``.

    ``distributed=True`` under ``torch.distributed``: a collective, as :meth:`Scorer.score
    <torchmover.Scorer.score>`'s: every rank passes the same lists, the statistics are fitted and the
    pairs scored over the ranks, and every rank returns the scores of the whole call. By default
    (``False``) the call runs on this process alone, whether or not a process group is initialised.

    Example:
        >>> import torchmover
        >>> P, R, F1 = torchmover.score(["the cat sat"], ["a cat sat"], return_all=True)
        >>> [round(f, 4) for f in F1.tolist()]
        [0.9168]
    """
    hyps = check_texts("hyps", hyps)
    groups = check_references(hyps, refs)
    scorer = fit_to_call(cached_scorer(**options), [r for g in groups for r in g], hyps, batch_size=batch_size,
                         progress=progress, baseline_corpus=baseline_corpus, baseline_pairs=baseline_pairs,
                         distributed=distributed)
    return scorer.score(hyps, groups, batch_size=batch_size, progress=progress, return_all=return_all,
                        distributed=distributed)
