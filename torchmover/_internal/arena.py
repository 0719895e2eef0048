"""Token units of many texts kept on the device in one block, gathered into padded batches by host-built indices.

:class:`TokenArena` keeps every field of :class:`~torchmover.scorer.Units` (vectors, mask, weights)
of many texts in one block of flat device tensors ``[rows, ...]``. Each text is known by its rows
``(first, width)``: its units, back to back, known on the host (e.g. from
:meth:`~torchmover.Scorer.embed_with_spans`), so a short text of a long batch is read back short.

- :meth:`TokenArena.append` copies the rows within each text's span of a padded batch ``[N, L, ...]``
  (its unmasked units) into the block, without the batch's padding, special-token columns and the rest
  of the encoder's output (``Scorer.score``, which encodes every distinct text of a chunk and then reads
  them back in pair batches: the encoder's working memory never outlives its batch).
- :meth:`TokenArena.add` copies a padded batch as it is, each text as ``L`` rows (the reward's cache
  of references, one copy of the batch as it came).

The block grows by doubling, or is made as large as ``capacity`` rows from the start. On the CPU each
block asks Linux for huge pages (:func:`~torchmover._internal.pages.advise_huge_pages`): it is memory
mapped anew and written once, so its first touches would otherwise cost as much as the copy into it.

A list of texts is read back as padded ``Units`` ``[R, W, ...]`` (``W`` the widest text) by one
``index_select`` per field, in any order; the row index ``[R, W]`` is built on the host
(:meth:`TokenArena.index`) and sent with the call's other indices in one transfer (:func:`to_device`).
So the number of device ops of a read does not grow with the number of texts, and nothing on the
device is read back to the host: rows are bookkept on the host from the tensors' shapes and the
given spans, never from their values. :meth:`TokenArena.transform_` rewrites the vectors of every
row in place once (e.g. centered and normalised), where many reads would otherwise each do it.

Removed texts, and the rows outside the spans of an added batch, are holes; :meth:`TokenArena.compact`
closes them (one gather, with indices sent from the host) once they outnumber the live rows.

A gather reads padding from row 0 and masks it. Units whose padding must hold zeros (a
:class:`~torchmover.functional.family.TokenCloud`: unit vectors and masses exactly 0 off the mask,
which the transport relies on) go into an arena made with ``zero_padding=True``, whose row 0 is
zero, its mask False: there the padding read is already masked, and a gather is one
``index_select`` per field.
"""
from __future__ import annotations

import math
from typing import Hashable, Iterable, Iterator, NamedTuple, Sequence, cast

import numpy as np
import torch
from torch import Tensor

from .pages import advise_huge_pages
from .transfer import to_device


class Gather(NamedTuple):
    """Where some texts lie in a :class:`TokenArena` (host side, from :meth:`TokenArena.index`):
    ``rows`` ``[n·W]`` their row numbers (padding: ``-1``, or the zero row 0 of a ``zero_padding``
    arena), ``width`` ``W`` the widest text, and ``n`` the texts."""

    rows: np.ndarray
    width: int
    n: int


def flat_rows(t: Tensor) -> tuple[Tensor, int]:
    """A padded batch ``t`` ``[N, W, ...]`` as flat rows ``[rows, ...]`` in which column ``j`` of text
    ``i`` is row ``i · pitch + j``, and ``pitch``. A view, without a copy, when the columns are evenly
    strided rows (a contiguous batch, or a slice of its columns: ``pitch`` is then the uncut width);
    otherwise a contiguous copy (``pitch = W``)."""
    n, w, *inner = t.shape
    row = math.prod(inner)
    if n and w and t.stride(1) == row and t.stride(0) % max(row, 1) == 0 and t[0, 0].is_contiguous():
        pitch = t.stride(0) // max(row, 1)
        return t.as_strided(((n - 1) * pitch + w, *inner), (row, *t.stride()[2:])), pitch
    return t.contiguous().view(n * w, *inner), w


def _shape(keys: Sequence[Hashable], units) -> tuple[int, int]:
    """``(N, L)`` of padded ``units`` whose rows are ``keys``."""
    n, width = units.mask.shape[:2]
    if len(keys) != n:
        raise ValueError(f"{len(keys)} keys for {n} rows of units")
    return n, width


def _check_spans(keys: Sequence[Hashable], spans: Sequence[tuple[int, int]], width: int) -> None:
    """Raise ``ValueError`` unless there is one span per key, each within ``width`` columns."""
    if len(keys) != len(spans):
        raise ValueError(f"{len(keys)} keys for {len(spans)} spans")
    for key, (first, stop) in zip(keys, spans):
        if not 0 <= first <= stop <= width:
            raise ValueError(f"span {(first, stop)} of {key!r} is not within its {width} columns")


def span_rows(starts: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """The rows ``starts[i], …, starts[i] + widths[i] − 1`` of every ``i``, in order, as one int64 array
    (built without a Python loop)."""
    widths = np.asarray(widths, dtype=np.int64)
    total = int(widths.sum())
    offsets = np.repeat(np.asarray(starts, dtype=np.int64) - (np.cumsum(widths) - widths), widths)
    return offsets + np.arange(total, dtype=np.int64)


def _block(like: Tensor, rows: int, inner: Sequence[int]) -> Tensor:
    """An uninitialised field of ``rows`` rows of shape ``inner``, of ``like``'s dtype and device: on the
    CPU, backed by huge pages where the system allows (:func:`~torchmover._internal.pages.advise_huge_pages`:
    a block is written once, row after row, and read many times, so its first touches are most of what
    writing it costs)."""
    return advise_huge_pages(like.new_empty((rows, *inner)))


class TokenArena:
    """Units of many texts (keys) in one block of flat device tensors; see the module docs.

    ``units_type`` is the ``NamedTuple`` the fields belong to (``Units``: ``vectors`` first, a boolean
    ``mask`` second); a field that is ``None`` in the first batch stored stays ``None``.
    ``zero_padding``: a gather's padding reads zeros (see the module docs). ``capacity``: the rows the
    block is made with (e.g. the units of every text to come, where they are known: it never grows).
    """

    def __init__(self, units_type, zero_padding: bool = False, capacity: int = 0):
        self.units_type, self.zero_padding, self.capacity = units_type, zero_padding, capacity
        self.fields: list[Tensor | None] | None = None  # the block: per field, its flat [rows, ...]
        self.spans: dict[Hashable, tuple[int, int]] = {}  # key -> (first row, width)
        self.written = 0  # rows written (live or holes)
        self.live = 0  # rows within the spans of the texts present

    def _field(self, k: int) -> Tensor:
        """Field ``k`` of the block, which must exist; ``0`` (vectors) and ``1`` (mask) are never None."""
        return cast(Tensor, cast(list[Tensor | None], self.fields)[k])

    def __contains__(self, key) -> bool:
        return key in self.spans

    def __len__(self) -> int:
        return len(self.spans)

    def add(self, keys: Sequence[Hashable], units, spans: Sequence[tuple[int, int]]) -> None:
        """Copy the texts ``keys`` (row ``i`` of padded ``units`` ``[N, L, ...]`` is ``keys[i]``, its
        unmasked units within the columns ``spans[i] = (first, stop)``) into the block, each as ``L``
        rows (the rows outside its span are holes). A key already present is replaced (its old rows
        become a hole)."""
        n, width = _shape(keys, units)
        _check_spans(keys, spans, width)
        fields, start = self._reserve(n * width, units), self.written
        for field, values in zip(fields, units):
            if field is not None:  # written through a view: the units may be a non-contiguous slice
                field[start:start + n * width].view(n, width, *field.shape[1:]).copy_(values)
        self._record(keys, [start + i * width + first for i, (first, _) in enumerate(spans)],
                     [stop - first for first, stop in spans])
        self.written += n * width

    def append(self, keys: Sequence[Hashable], units, spans: Sequence[tuple[int, int]]) -> None:
        """Copy the rows within the ``spans`` of the texts ``keys`` of padded ``units`` ``[N, L, ...]`` (as
        :meth:`add`) into the block, text after text, without their padding: one ``index_select`` per
        field, straight into the block, with a row index built on the host (no graph: the units must not
        require grad). A key already present is replaced (its old rows become a hole)."""
        n, width = _shape(keys, units)
        _check_spans(keys, spans, width)
        flat: list[tuple[Tensor, int] | None] = [None if t is None else flat_rows(t) for t in units]
        first_flat = cast(tuple[Tensor, int], flat[0])  # the vectors: never None
        pitch = first_flat[1]
        if any(f is not None and f[1] != pitch for f in flat):  # fields cut from batches of other widths
            flat = [None if t is None else (t.reshape(n * width, *t.shape[2:]), width) for t in units]
            pitch = width
            first_flat = cast(tuple[Tensor, int], flat[0])
        firsts = np.array([first for first, _ in spans], dtype=np.int64).reshape(-1)
        widths = np.array([stop - first for first, stop in spans], dtype=np.int64).reshape(-1)
        rows = span_rows(np.arange(n) * pitch + firsts, widths)
        fields, start = self._reserve(len(rows), units), self.written
        (index,) = to_device([rows], first_flat[0].device)
        for field, values in zip(fields, flat):
            if field is not None:  # then the batch has the field too (a field None in the first batch stays None)
                torch.index_select(cast(tuple[Tensor, int], values)[0], 0, index,
                                   out=field[start:start + len(rows)])
        self._record(keys, (start + np.cumsum(widths) - widths).tolist(), widths.tolist())
        self.written += len(rows)

    def _record(self, keys: Sequence[Hashable], firsts: Sequence[int], widths: Sequence[int]) -> None:
        """Record each text of ``keys`` as its ``width`` rows from row ``first`` on."""
        for key, first, width in zip(keys, firsts, widths):
            self.remove(key)
            self.spans[key] = (first, width)
            self.live += width

    def transform_(self, fn, step: int = 1 << 15) -> None:
        """Rewrite the vectors (the first field) of every row written by ``fn(vectors, mask)``
        (``[rows, D]``, ``[rows]``; ``fn`` writes its result into ``vectors``, in place), ``step`` rows
        at a time: a transformation of each unit on its own (e.g. centering on a given vector, then
        normalising), done once for every text held instead of once per read. Row 0 of a
        ``zero_padding`` arena (masked) is passed too: ``fn`` must leave a zero row off the mask zero."""
        if self.fields is None:
            return
        vectors, mask = self._field(0)[:self.written], self._field(1)[:self.written]
        for start in range(0, self.written, step):
            fn(vectors[start:start + step], mask[start:start + step])

    def flat(self, keys: Sequence[Hashable], step: int = 1 << 12) -> Iterator:
        """The units of ``keys`` without padding, as flat fields ``[rows, ...]`` of at most ``step`` rows
        each (one ``index_select`` per field and piece, the indices sent from the host in one transfer;
        a text longer than ``step`` rows is a piece of its own), e.g. to sum over many texts without
        padding them to one width or copying them all at once."""
        if not keys:
            return
        spans = np.array([self.spans[key] for key in keys], dtype=np.int64).reshape(-1, 2)
        ends = np.cumsum(spans[:, 1])
        cuts = [0]
        while cuts[-1] < len(spans):  # the texts of each piece: as many as fit in step rows, at least one
            first_row = ends[cuts[-1]] - spans[cuts[-1], 1]
            cuts.append(max(int(np.searchsorted(ends, first_row + step, side="right")), cuts[-1] + 1))
        pieces = [span_rows(spans[a:b, 0], spans[a:b, 1]) for a, b in zip(cuts[:-1], cuts[1:])]
        for index in to_device(pieces, self._field(0).device):  # keys are held: the block exists
            yield self.units_type(*(None if f is None else f.index_select(0, index)
                                    for f in cast(list[Tensor | None], self.fields)))

    def unit_counts(self, keys: Sequence[Hashable]) -> Tensor:
        """``[len(keys)]`` int64 on the block's device: each text's number of unmasked units (a span
        may hold masked ones: pooled subwords give a text its whole row), from one cumulative sum of
        the block's mask and two gathers with indices sent from the host."""
        device = self._field(1).device if self.fields else torch.device("cpu")
        if self.fields is None or not keys:  # nothing written: no text has a unit
            return torch.zeros(len(keys), dtype=torch.long, device=device)
        spans = np.array([self.spans[key] for key in keys], dtype=np.int64).reshape(-1, 2)
        before = torch.nn.functional.pad(self._field(1)[:self.written].long().cumsum(0), (1, 0))  # [written + 1]
        first, stop = to_device([spans[:, 0], spans[:, 0] + spans[:, 1]], device)
        return before.index_select(0, stop) - before.index_select(0, first)

    def widths(self) -> dict[Hashable, int]:
        """Each text's number of units: the rows of its span."""
        return {key: width for key, (_, width) in self.spans.items()}

    def gathered_spans(self, keys: Sequence[Hashable]) -> list[tuple[int, int]]:
        """The span of each text of ``keys`` in their :meth:`gather`: ``(0, width)``."""
        return [(0, self.spans[key][1]) for key in keys]

    def all_have_units(self, keys: Sequence[Hashable]) -> bool:
        """Whether every text of ``keys`` has a unit (a non-empty span), known on the host."""
        return all(self.spans[key][1] > 0 for key in keys)

    def in_storage_order(self, keys: Iterable[Hashable]) -> list[Hashable]:
        """``keys`` sorted by where their rows lie (a read of them then runs through the block in order)."""
        return sorted(keys, key=self.spans.__getitem__)

    def remove(self, key: Hashable) -> None:
        """Forget ``key`` (no-op if absent); its rows become a hole."""
        span = self.spans.pop(key, None)
        if span is not None:
            self.live -= span[1]

    def clear(self) -> None:
        self.fields, self.spans, self.written, self.live = None, {}, 0, 0

    @property
    def _first_row(self) -> int:
        """The first row that holds units (row 0 is zero with ``zero_padding``)."""
        return int(self.zero_padding)

    def compact(self) -> None:
        """Close the holes (rows of removed texts, and rows outside the spans) if they outnumber the live
        rows: the live rows gathered into a new block (one ``index_select`` per field, the indices sent
        from the host), in storage order."""
        if self.fields is None or self.written - self._first_row - self.live <= self.live:
            return
        if not self.spans:  # nothing live: nothing to keep
            self.clear()
            return
        keys = self.in_storage_order(self.spans)
        spans = np.array([self.spans[key] for key in keys], dtype=np.int64).reshape(-1, 2)
        rows = np.concatenate([np.arange(self._first_row), span_rows(spans[:, 0], spans[:, 1])])  # row 0 kept
        (index,) = to_device([rows], self._field(0).device)
        self.fields = [None if f is None else torch.index_select(f, 0, index, out=_block(f, len(rows), f.shape[1:]))
                       for f in self.fields]
        firsts = self._first_row + np.cumsum(spans[:, 1]) - spans[:, 1]
        self.spans = {key: (first, width) for key, first, width in zip(keys, firsts.tolist(), spans[:, 1].tolist())}
        self.written = len(rows)

    def _reserve(self, rows: int, like) -> list[Tensor | None]:
        """The block with room for ``rows`` more rows (its capacity doubles), made the first time with
        the dtypes and devices of the padded units ``like`` (``capacity`` rows, or as many as needed).
        Rows past ``written`` are never read: left uninitialised."""
        if self.fields is None:  # with zero_padding, its row 0: zeros
            capacity = max(self.capacity, self._first_row + rows)
            self.fields = [None if t is None else _block(t, capacity, t.shape[2:]) for t in like]
            for field in self.fields:
                if field is not None:
                    field[:self._first_row].zero_()
            self.written = self._first_row
        capacity, needed = self._field(0).shape[0], self.written + rows
        if needed > capacity:
            capacity = max(needed, 2 * capacity)
            for k, field in enumerate(self.fields):
                if field is not None:
                    new = _block(field, capacity, field.shape[1:])
                    new[:self.written] = field[:self.written]
                    self.fields[k] = new
        return self.fields

    def index(self, keys: Sequence[Hashable]) -> Gather:
        """The host side of a gather of ``keys`` (:class:`Gather`). Send its ``rows`` with
        :func:`to_device`, then :meth:`gather`."""
        found = [self.spans[k] for k in keys]
        spans = np.array(found, dtype=np.int64).reshape(-1, 2)
        width = max((w for _, w in found), default=0)  # in Python: a NumPy reduction costs more
        columns = np.arange(width)
        rows = np.where(columns < spans[:, 1:], spans[:, :1] + columns, 0 if self.zero_padding else -1).ravel()
        return Gather(rows, width, len(keys))

    def gather(self, rows: Tensor, where: Gather, select: Tensor | None = None):
        """Padded units ``[R, W, ...]`` of the ``R ≥ 1`` texts whose :meth:`index` is ``where`` (``rows``:
        its ``rows`` sent to the device): one ``index_select`` per field, padding masked (by reading
        the zero row, with ``zero_padding``).

        ``select`` ``[P]``: the rows ``select`` of that result, ``[P, W, ...]`` (e.g. a text per pair),
        read straight from the arena: the index of the rows is selected (one ``index_select`` of
        ``R·W`` integers), not every field of the result."""
        n, width = where.n, where.width
        if select is not None:
            rows = rows.view(n, width).index_select(0, select).view(-1)
            n = select.shape[0]
        index = rows if self.zero_padding else rows.clamp_min(0)
        units = self.units_type(*(None if f is None else f.index_select(0, index).view(n, width, *f.shape[1:])
                                  for f in cast(list[Tensor | None], self.fields)))  # R ≥ 1 texts: a block
        return units if self.zero_padding else units._replace(mask=units.mask & (rows >= 0).view(n, width))
