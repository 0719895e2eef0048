"""Token units of many texts kept on the device, gathered into padded batches by host-built indices.

:class:`TokenArena` keeps every field of :class:`~torchmover.scorer.Units` (vectors, mask, weights)
of many texts as flat device tensors ``[capacity, ...]``: a text added from a padded batch ``[N, L, ...]``
occupies ``L`` consecutive rows (its padded row, padding masked), appended without any index, and is
known by its span: the columns ``(first, stop)`` that hold its unmasked units (host-known, e.g. from
:meth:`~torchmover.Scorer.embed_with_spans`), so that a short text of a long batch is read back short.
A batch of texts is read back as padded ``Units`` ``[R, W, ...]`` (``W`` the widest span) by one gather
whose row index ``[R, W]`` is built on the host from the spans (:meth:`TokenArena.index`) and sent
with the call's other indices in one transfer (:func:`to_device`). So the number of device ops of a
read does not grow with the number of texts, and nothing on the device is read back to the host:
rows are bookkept on the host from the tensors' shapes and the given spans, never from their values.

Removed texts, and the rows outside the spans, are holes; :meth:`TokenArena.compact` closes them
(one gather with an index sent from the host) once they outnumber the live rows.
"""
from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np
import torch
from torch import Tensor

from .transfer import to_device


class TokenArena:
    """Units of many texts (keys) in flat device tensors; see the module docs.

    ``units_type`` is the ``NamedTuple`` the fields belong to (``Units``: ``vectors`` first, a boolean
    ``mask``); a field that is ``None`` in the first batch added stays ``None``.
    """

    def __init__(self, units_type):
        self.units_type = units_type
        self.fields: list[Tensor | None] | None = None  # flat [capacity, ...] per field
        self.spans: dict[Hashable, tuple[int, int]] = {}  # key -> (first row, width)
        self.size = 0  # rows written (live or removed)
        self.live = 0  # rows within the spans of the texts present

    def __contains__(self, key) -> bool:
        return key in self.spans

    def __len__(self) -> int:
        return len(self.spans)

    @classmethod
    def of(cls, batches: Sequence[tuple[Sequence[Hashable], object, Sequence[tuple[int, int]]]]) -> "TokenArena":
        """An arena of ``(keys, units, spans)`` batches (as :meth:`add`), allocated once."""
        arena = cls(type(batches[0][1]))
        arena._reserve(sum(units.mask.numel() for _, units, _ in batches), batches[0][1])
        for batch in batches:
            arena.add(*batch)
        return arena

    def _span(self, keys: Sequence[Hashable], width: int, spans: Sequence[tuple[int, int]]) -> None:
        """Record ``keys`` as the padded rows of ``width`` columns from row ``size`` on, each by its span."""
        if len(keys) != len(spans):
            raise ValueError(f"{len(keys)} keys for {len(spans)} spans")
        for key, (first, stop) in zip(keys, spans):
            if not 0 <= first <= stop <= width:
                raise ValueError(f"span {(first, stop)} of {key!r} is not within its {width} columns")
        for i, (key, (first, stop)) in enumerate(zip(keys, spans)):
            self.remove(key)
            self.spans[key] = (self.size + i * width + first, stop - first)
            self.live += stop - first
        self.size += len(keys) * width

    def add(self, keys: Sequence[Hashable], units, spans: Sequence[tuple[int, int]]) -> None:
        """Append the texts ``keys`` (row ``i`` of padded ``units`` ``[N, L, ...]`` is ``keys[i]``, its
        unmasked units within the columns ``spans[i] = (first, stop)``), each as ``L`` rows. A key
        already present is replaced (its old rows become a hole)."""
        n, width = units.mask.shape[:2]
        if len(keys) != n:
            raise ValueError(f"{len(keys)} keys for {n} rows of units")
        start = self.size
        self._reserve(start + n * width, units)
        self._span(keys, width, spans)
        for field, values in zip(self.fields, units):
            if field is not None:  # written through a view: the units may be a non-contiguous slice
                field[start:self.size].view(n, width, *field.shape[1:]).copy_(values)

    def widths(self) -> dict[Hashable, int]:
        """Each text's number of units: the columns of its span."""
        return {key: width for key, (_, width) in self.spans.items()}

    def remove(self, key: Hashable) -> None:
        """Forget ``key`` (no-op if absent); its rows become a hole."""
        span = self.spans.pop(key, None)
        if span is not None:
            self.live -= span[1]

    def clear(self) -> None:
        self.fields, self.spans, self.size, self.live = None, {}, 0, 0

    def compact(self) -> None:
        """Close the holes (rows of removed texts, and rows outside the spans) if they outnumber the live
        rows (one device gather, its index sent from the host)."""
        if self.fields is None or self.size - self.live <= self.live:
            return
        order, spans = [], {}
        for key, (start, width) in self.spans.items():
            spans[key] = (len(order), width)
            order.extend(range(start, start + width))
        (rows,) = to_device([order], self.fields[0].device)
        self.fields = [None if f is None else f.index_select(0, rows) for f in self.fields]
        self.spans, self.size = spans, len(order)

    def _reserve(self, rows: int, like) -> None:
        """Grow every field to at least ``rows`` rows (capacity doubles), the first time with the
        dtypes and devices of the padded units ``like``."""
        if self.fields is None:
            self.fields = [None if t is None else t.new_empty((0, *t.shape[2:])) for t in like]
        capacity = self.fields[0].shape[0]
        if rows <= capacity:
            return
        capacity = max(rows, 2 * capacity)
        grown = []
        for field in self.fields:
            if field is not None:  # rows past ``size`` are never read: left uninitialised
                new = field.new_empty((capacity, *field.shape[1:]))
                new[:self.size] = field[:self.size]
                field = new
            grown.append(field)
        self.fields = grown

    def index(self, keys: Sequence[Hashable]) -> tuple[np.ndarray, int]:
        """The host-side gather index of ``keys``: ``R·W`` row numbers (``-1`` = padding) and ``W``, the
        widest span. Send it with :func:`to_device`, then :meth:`gather`."""
        spans = np.array([self.spans[k] for k in keys], dtype=np.int64).reshape(-1, 2)
        width = int(spans[:, 1].max(initial=0))
        columns = np.arange(width)
        return np.where(columns < spans[:, 1:], spans[:, :1] + columns, -1).ravel(), width

    def gather(self, index: Tensor, n: int, width: int):
        """Padded units ``[n, W, ...]`` of the ``n`` texts whose :meth:`index` (sent to the device) is
        ``index``: one ``index_select`` per field, padding masked."""
        rows = index.clamp_min(0)
        units = self.units_type(*(None if f is None else f.index_select(0, rows).reshape(n, width, *f.shape[1:])
                                  for f in self.fields))
        return units._replace(mask=units.mask & (index >= 0).reshape(n, width))
