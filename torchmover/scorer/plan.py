"""Host-side planning of a call: which rows of the encoded texts each (hypothesis, reference) pair
reads, built on the host from the texts before the encoder runs, then sent to the device in one
transfer (``plan.to_device(device)``; many plans at once with
:func:`~torchmover._internal.transfer.send_plans`). Nothing here reads device data.

A plan is a ``NamedTuple`` whose index fields are host lists (or integer arrays) before it is sent
and long tensors after; its other fields (counts, flags) are the same on both sides.
"""
from __future__ import annotations

import itertools
from typing import NamedTuple, Sequence

import numpy as np
import torch
from torch import Tensor

from .._internal.arena import Gather
from .._internal.transfer import plan_to_device
from ..text.length_groups import length_groups


class PairIndex(NamedTuple):
    """One row per (hypothesis, reference) pair: ``hyp`` / ``ref`` rows into the hypothesis / reference
    units, and ``owner``, the hypothesis each pair belongs to (each None where pair ``p`` is simply
    row ``p`` of all the rows: nothing to gather; an ``owner`` of None means one reference per
    hypothesis, nothing to combine)."""

    hyp: list[int] | Tensor | None
    ref: list[int] | Tensor | None
    owner: list[int] | Tensor | None

    def to_device(self, device: torch.device | str | None) -> PairIndex:
        """This plan with its index fields on ``device``: :func:`~torchmover._internal.transfer.plan_to_device`."""
        return plan_to_device(self, device)


class CallPlan(NamedTuple):
    """Where the texts of a call's pairs are, in the units of its distinct texts (hypotheses first):
    the first ``n_hyp_texts`` rows are the distinct hypotheses, ``ref_rows`` the distinct references
    (a ``slice`` where they are the rows after the hypotheses, in order: read without a copy),
    ``index`` the pairs (into those two), ``n_hyps`` the hypotheses."""

    n_hyp_texts: int
    ref_rows: list[int] | Tensor | slice
    index: PairIndex  # type: ignore[assignment]  # a field named index shadows tuple.index
    n_hyps: int

    def to_device(self, device: torch.device | str | None) -> CallPlan:
        """This plan with its index fields on ``device``: :func:`~torchmover._internal.transfer.plan_to_device`."""
        return plan_to_device(self, device)


class BatchPlan(NamedTuple):
    """One batch of :meth:`Scorer.score <torchmover.Scorer.score>`: ``positions`` of its hypotheses in
    the call (where its scores go), ``rows`` of its distinct texts in the call's arena (``where``, the
    host side of that gather: runs and width), the :class:`CallPlan` of its pairs into them, and
    whether every text has a unit (``nonempty``, known on the host)."""

    positions: list[int] | Tensor
    rows: np.ndarray | Tensor
    where: Gather
    call: CallPlan
    nonempty: bool

    def to_device(self, device: torch.device | str | None) -> BatchPlan:
        """This plan with its index fields on ``device``: :func:`~torchmover._internal.transfer.plan_to_device`."""
        return plan_to_device(self, device)


def pair_index(hyps: list[str], groups: list[list[str]], hyp_row: dict[str, int],
               ref_row: dict[str, int]) -> PairIndex:
    """The host :class:`PairIndex` of every (hypothesis, reference) pair, from each text's row among the
    distinct hypotheses (``hyp_row``) and references (``ref_row``); ``None`` where the rows are simply
    ``0, 1, …``. With one reference per hypothesis (the owners are ``0, 1, …``) the rows are looked up
    by ``map``, without a Python loop over the pairs."""
    def rows(values, n_rows):
        return None if len(values) == n_rows and values == list(range(n_rows)) else values
    refs = list(itertools.chain.from_iterable(groups))
    if len(refs) == len(groups):
        owner, pair_hyps = None, hyps
    else:
        owner = [i for i, g in enumerate(groups) for _ in g]
        pair_hyps = [hyps[i] for i in owner]
    return PairIndex(rows(list(map(hyp_row.__getitem__, pair_hyps)), len(hyp_row)),
                     rows(list(map(ref_row.__getitem__, refs)), len(ref_row)), owner)


#: One transport batch's overhead counted in padded cells (entries of its ``[B, L1, L2]`` problems), by
#: device type: where a device has none, a reward call's pairs are moved in one batch. On the 2-core
#: CPU (``bench/bench_transport_batches.py``, default model, 2 threads) costs from 1,024 to 65,536
#: cells moved the pairs of a 512-completion reward call in 42 to 50 ms, against 231 ms in one batch;
#: on a GPU the transport of such a call is bound by launching its kernels, so more batches would add
#: launches (not measured there: ``--device cuda`` does).
TRANSPORT_BATCH_COST = {"cpu": 16384}


class PairGroup(NamedTuple):
    """Pairs moved in one transport batch: the rows ``hyps`` of their (distinct) hypotheses and the
    ``pairs`` themselves (slices), each side cut to its first ``hyp_width`` / ``ref_width`` columns (the
    widest text of the group: every real unit lies within them)."""

    hyps: slice
    pairs: slice
    hyp_width: int
    ref_width: int


def transport_groups(lengths: Sequence[int], cost: int) -> list[np.ndarray] | None:
    """The distinct hypotheses of a reward call (each one's token count) cut into groups of similar
    length, the shortest first, each sorted by length, or None where one batch is best. ``cost``: a
    batch's overhead in cells (:data:`TRANSPORT_BATCH_COST` of the device). A hypothesis moved in a
    batch whose longest has ``W`` tokens costs about ``W²`` cells (its self-term's problem; its
    reference's problem grows with ``W`` too), so the groups are
    :func:`~torchmover.text.length_groups.length_groups` of the squared lengths: the grouping of least
    such padded area plus ``cost`` per batch."""
    return length_groups(np.square(np.asarray(lengths, dtype=np.int64)), cost)


def pairs_by_group(index: PairIndex, n_hyps: int,
                   hyp_bounds: Sequence[int]) -> tuple[PairIndex, list[tuple[slice, slice]]]:
    """``index`` (host) with its pairs ordered by their hypothesis rows, so that the pairs of the rows
    ``hyp_bounds[k] … hyp_bounds[k + 1] − 1`` (a group of :func:`transport_groups`, laid out one after
    the other) are contiguous; each pair keeps its reference and its owner, the position of its
    hypothesis in the call (explicit now: the scores are put back in order by combining the pairs by
    owner). Returns the new index and each group's ``(hypothesis rows, pairs)`` as slices."""
    n_pairs = n_hyps if index.owner is None else len(index.owner)
    hyp = np.arange(n_pairs) if index.hyp is None else np.asarray(index.hyp, dtype=np.int64)
    order = np.argsort(hyp, kind="stable")  # a hypothesis's pairs keep their order (multi_ref="mean" sums in it)
    ref = order if index.ref is None else np.asarray(index.ref, dtype=np.int64)[order]
    owner = order if index.owner is None else np.asarray(index.owner, dtype=np.int64)[order]
    pair_bounds = np.searchsorted(hyp[order], hyp_bounds).tolist()
    slices = [(slice(a, b), slice(p, q)) for a, b, p, q in
              zip(hyp_bounds[:-1], hyp_bounds[1:], pair_bounds[:-1], pair_bounds[1:])]
    return PairIndex(hyp[order].tolist(), ref.tolist(), owner.tolist()), slices


def pair_groups(slices: list[tuple[slice, slice]], hyp_stops: Sequence[int],
                pair_ref_stops: Sequence[int]) -> list[PairGroup]:
    """The :class:`PairGroup` of each group of :func:`pairs_by_group`, its widths from the column after
    each hypothesis row's last unit (``hyp_stops``) and each pair's reference's (``pair_ref_stops``,
    in the new order), both known on the host; at least one column each."""
    return [PairGroup(h, p, max(max(hyp_stops[h], default=1), 1), max(max(pair_ref_stops[p], default=1), 1))
            for h, p in slices]


def call_plan(hyps: list[str], groups: list[list[str]], texts: list[str]) -> CallPlan:
    """The host :class:`CallPlan` of the pairs ``(hyps[i], groups[i][k])`` into ``texts``: every distinct
    text of the call, the distinct hypotheses first (in any order; see
    :func:`~torchmover.scorer.inputs.distinct_texts`)."""
    row = {t: i for i, t in enumerate(texts)}
    ref_texts = list(dict.fromkeys(itertools.chain.from_iterable(groups)))
    hyp_rows = {t: row[t] for t in dict.fromkeys(hyps)}
    index = pair_index(hyps, groups, hyp_rows, {t: i for i, t in enumerate(ref_texts)})
    ref_rows = [row[t] for t in ref_texts]
    if ref_rows == list(range(len(hyp_rows), len(hyp_rows) + len(ref_rows))):  # the rows after the hypotheses
        return CallPlan(len(hyp_rows), slice(len(hyp_rows), len(hyp_rows) + len(ref_rows)), index, len(hyps))
    return CallPlan(len(hyp_rows), ref_rows, index, len(hyps))


def length_batches(lengths: Sequence[int], batch_size: int, *, most: int | None = None,
                   squares: bool = False) -> list[list[int]]:
    """Batches of the positions of ``lengths`` under a token budget, the longest batch first (and
    within a batch the longest item first, equal lengths in input order).

    Cut in order of length from the shortest, a batch closes before its padded area — its items times
    its longest item's length, counted as at least 1 — would exceed the budget ``batch_size × 2 × the
    median length``, or holds its one item: its working memory (which grows with its padded area) is
    bounded by the budget whatever the lengths, and a few long items never pad one batch together.
    The last batch cut, the longest, is the one that may be part-filled.

    ``most``: a batch also holds at most ``most`` items (the encoder's batches: ``batch_size`` texts).
    ``squares`` (items whose cost is ``L × L``: a pair's transport problem, padded to its batch's
    longest text): a batch also closes before an item whose square is more than twice its shortest
    item's, so that padding at most doubles an item's square area."""
    if not lengths:
        return []
    budget = batch_size * 2 * max(sorted(lengths)[len(lengths) // 2], 1)
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (lengths[i], -i)):  # each item the longest of its batch so far
        if (not batches or (len(batches[-1]) + 1) * max(lengths[i], 1) > budget or len(batches[-1]) == most
                or (squares and lengths[i] ** 2 > 2 * lengths[batches[-1][0]] ** 2)):
            batches.append([])
        batches[-1].append(i)
    return [batch[::-1] for batch in batches[::-1]]
