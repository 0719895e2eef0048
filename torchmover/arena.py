"""Token units of many texts kept on the device, gathered into padded batches by host-built indices.

:class:`TokenArena` keeps every field of :class:`~torchmover.scorer.Units` (vectors, mask, weights)
of many texts as flat device tensors ``[capacity, ...]``: a text added from a padded batch ``[N, L, ...]``
occupies ``L`` consecutive rows (its padded row, padding masked), appended without any index. A batch
of texts is read back as padded ``Units`` ``[R, W, ...]`` (``W`` the widest of them) by one gather
whose row index ``[R, W]`` is built on the host from the spans (:meth:`TokenArena.index`) and sent
with the call's other indices in one transfer (:func:`to_device`). So the number of device ops of a
read does not grow with the number of texts, and nothing on the device is read back to the host:
spans are bookkept on the host from the tensors' shapes, never from their values.

Removed texts leave holes; :meth:`TokenArena.compact` closes them (one gather with an index sent
from the host) once they outnumber the live rows.
"""
from __future__ import annotations

from typing import Hashable, Sequence

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
        self.live = 0  # rows of the texts present

    def __contains__(self, key) -> bool:
        return key in self.spans

    def __len__(self) -> int:
        return len(self.spans)

    @classmethod
    def of(cls, batches: Sequence[tuple[Sequence[Hashable], object]]) -> "TokenArena":
        """An arena of ``(keys, units)`` batches (as :meth:`add`), each field written by one ``cat``."""
        arena = cls(type(batches[0][1]))
        for keys, units in batches:
            arena._span(keys, units.mask.shape[1])
        arena.fields = [None if f is None else torch.cat([u[k].flatten(0, 1) for _, u in batches])
                        for k, f in enumerate(batches[0][1])]
        return arena

    def _span(self, keys: Sequence[Hashable], width: int) -> None:
        """Record ``keys`` as ``width`` rows each from row ``size`` on."""
        for i, key in enumerate(keys):
            self.remove(key)
            self.spans[key] = (self.size + i * width, width)
        self.size += len(keys) * width
        self.live += len(keys) * width

    def add(self, keys: Sequence[Hashable], units) -> None:
        """Append the texts ``keys`` (row ``i`` of padded ``units`` ``[N, L, ...]`` is ``keys[i]``), each
        as ``L`` rows. A key already present is replaced (its old rows become a hole)."""
        n, width = units.mask.shape[:2]
        if len(keys) != n:
            raise ValueError(f"{len(keys)} keys for {n} rows of units")
        flat = [None if t is None else t.reshape(n * width, *t.shape[2:]) for t in units]
        if self.fields is None:
            self.fields = [None if t is None else t.new_empty((0, *t.shape[1:])) for t in flat]
        self._reserve(self.size + n * width)
        for field, values in zip(self.fields, flat):
            if field is not None:
                field[self.size:self.size + n * width] = values
        self._span(keys, width)

    def remove(self, key: Hashable) -> None:
        """Forget ``key`` (no-op if absent); its rows become a hole."""
        span = self.spans.pop(key, None)
        if span is not None:
            self.live -= span[1]

    def clear(self) -> None:
        self.fields, self.spans, self.size, self.live = None, {}, 0, 0

    def compact(self) -> None:
        """Close the holes left by removed texts if they outnumber the live rows (one device gather,
        its index sent from the host)."""
        if self.fields is None or self.size - self.live <= self.live:
            return
        order, spans = [], {}
        for key, (start, width) in self.spans.items():
            spans[key] = (len(order), width)
            order.extend(range(start, start + width))
        (rows,) = to_device([order], self.fields[0].device)
        self.fields = [None if f is None else f.index_select(0, rows) for f in self.fields]
        self.spans, self.size = spans, len(order)

    def _reserve(self, rows: int) -> None:
        """Grow every field to at least ``rows`` rows (capacity doubles)."""
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

    def index(self, keys: Sequence[Hashable]) -> tuple[list[int], int]:
        """The host-side gather index of ``keys``: ``R·W`` row numbers (``-1`` = padding) and ``W``, the
        widest span. Send it with :func:`to_device`, then :meth:`gather`."""
        spans = [self.spans[k] for k in keys]
        width = max((w for _, w in spans), default=0)
        index = []
        for start, w in spans:
            index.extend(range(start, start + w))
            index.extend([-1] * (width - w))
        return index, width

    def gather(self, index: Tensor, n: int, width: int):
        """Padded units ``[n, W, ...]`` of the ``n`` texts whose :meth:`index` (sent to the device) is
        ``index``: one ``index_select`` per field, padding masked."""
        rows = index.clamp_min(0)
        units = self.units_type(*(None if f is None else f.index_select(0, rows).reshape(n, width, *f.shape[1:])
                                  for f in self.fields))
        return units._replace(mask=units.mask & (index >= 0).reshape(n, width))
