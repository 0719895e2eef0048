"""Token units of many texts kept on the device, gathered into padded batches by host-built indices.

:class:`TokenArena` keeps every field of :class:`~torchmover.scorer.Units` (vectors, mask, weights)
of many texts in blocks of flat device tensors ``[rows, ...]``. A text of a padded batch
``[N, L, ...]`` occupies ``L`` consecutive rows of a block (its padded row, padding masked) and is
known by its span: the columns ``(first, stop)`` that hold its unmasked units (host-known, e.g. from
:meth:`~torchmover.Scorer.embed_with_spans`), so that a short text of a long batch is read back short.

- :meth:`TokenArena.of` packs each batch into a block of its own: the rows within its texts' spans,
  back to back (one ``index_select`` per field), so the batch's padding, special-token columns and
  the rest of the encoder's output are freed at once (``Scorer.score``, which encodes every distinct
  text of a chunk and then reads them back in pair batches: a block holds only what is read back,
  and nothing of the encoder's working memory outlives its batch).
- :meth:`TokenArena.keep` keeps a batch as it came, a block of flat views (no copy): for a batch of
  texts of similar length, whose padding is little, a copy would cost more than it frees.
- :meth:`TokenArena.add` copies a batch into the arena's one growable block (the reward's cache of
  references, which outlives the encoder's outputs).

A list of texts is read back as padded ``Units`` ``[R, W, ...]`` (``W`` the widest span) by one
``index_select`` per field and per run of consecutive texts that lie in the same block
(:meth:`TokenArena.in_storage_order` sorts texts so that the runs are as few as the blocks they come
from); the row index ``[R, W]`` is built on the host from the spans (:meth:`TokenArena.index`) and sent
with the call's other indices in one transfer (:func:`to_device`). So the number of device ops of a
read does not grow with the number of texts, and nothing on the device is read back to the host:
rows are bookkept on the host from the tensors' shapes and the given spans, never from their values.

Removed texts, and the rows outside the spans, are holes; :meth:`TokenArena.compact` closes them
(one gather per block, with indices sent from the host) once they outnumber the live rows.

A gather reads padding from row 0 of a block and masks it. Units whose padding must hold zeros (a
:class:`~torchmover.functional.family.TokenCloud`: unit vectors and masses exactly 0 off the mask, which the
transport relies on) go into an arena made with ``zero_padding=True``, whose growable block keeps
row 0 zero, its mask False (:meth:`add` only: the packed blocks of :meth:`TokenArena.of` hold no
padding row): there the padding read is already masked, and a gather is one ``index_select`` per field.
"""
from __future__ import annotations

import itertools
import math
from typing import Hashable, Iterator, NamedTuple, Sequence

import numpy as np
import torch
from torch import Tensor

from .transfer import to_device


class Gather(NamedTuple):
    """Where some texts lie in a :class:`TokenArena` (host side, from :meth:`TokenArena.index`):
    ``rows`` ``[R·W]`` their row numbers within their blocks (padding: ``-1``, or the zero row 0 of a
    ``zero_padding`` arena), ``width`` ``W`` the
    widest span, and ``runs`` the ``(block, count)`` runs of consecutive texts that lie in one block."""

    rows: np.ndarray
    width: int
    runs: tuple[tuple[int, int], ...]

    @property
    def n(self) -> int:
        return sum(count for _, count in self.runs)


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


class TokenArena:
    """Units of many texts (keys) in blocks of flat device tensors; see the module docs.

    ``units_type`` is the ``NamedTuple`` the fields belong to (``Units``: ``vectors`` first, a boolean
    ``mask``); a field that is ``None`` in the first batch stored stays ``None``. ``zero_padding``: a
    gather's padding reads zeros (see the module docs).
    """

    def __init__(self, units_type, zero_padding: bool = False):
        self.units_type, self.zero_padding = units_type, zero_padding
        self.blocks: list[list[Tensor | None]] = []  # per block, its flat [rows, ...] per field
        self.spans: dict[Hashable, tuple[int, int, int]] = {}  # key -> (block, first row, width)
        self.growable: int | None = None  # the block that add() writes into
        self.written = 0  # rows written into that block
        self.size = 0  # rows held in all blocks (live or holes)
        self.live = 0  # rows within the spans of the texts present

    def __contains__(self, key) -> bool:
        return key in self.spans

    def __len__(self) -> int:
        return len(self.spans)

    @classmethod
    def of(cls, batches: Sequence[tuple[Sequence[Hashable], object, Sequence[tuple[int, int]]]]) -> "TokenArena":
        """An arena of ``(keys, units, spans)`` batches (as :meth:`add`), each packed into a block of its
        own (:meth:`pack`)."""
        arena = cls(type(batches[0][1]))
        for keys, units, spans in batches:
            arena.pack(keys, units, spans)
        return arena

    def keep(self, keys: Sequence[Hashable], units, spans: Sequence[tuple[int, int]]) -> None:
        """Keep the padded batch ``units`` ``[N, L, ...]`` of the texts ``keys`` (as :meth:`add`) as a block
        of its own: flat views of its fields (:func:`flat_rows`), no copy. The whole batch stays
        alive, padding included: for a batch that is mostly its texts' units (:meth:`pack` frees the
        rest of a sparse one)."""
        n, width = _shape(keys, units)
        flat = [None if t is None else flat_rows(t) for t in units]
        if any(f is not None and f[1] != flat[0][1] for f in flat):  # fields cut from batches of other widths
            flat = [None if t is None else (t.reshape(n * width, *t.shape[2:]), width) for t in units]
        self._span(keys, len(self.blocks), 0, flat[0][1], width, spans)
        self.blocks.append([None if f is None else f[0] for f in flat])
        self.size += flat[0][0].shape[0]

    def pack(self, keys: Sequence[Hashable], units, spans: Sequence[tuple[int, int]]) -> None:
        """Copy the texts ``keys`` of padded ``units`` ``[N, L, ...]`` (as :meth:`add`) into a new block
        that holds only the rows within their ``spans``, text after text: one ``index_select`` per
        field with a row index built on the host. A key already present is replaced."""
        n, width = _shape(keys, units)
        _check_spans(keys, spans, width)
        flat = [None if t is None else flat_rows(t) for t in units]
        pitch = flat[0][1]
        if any(f is not None and f[1] != pitch for f in flat):  # fields cut from batches of other widths
            flat = [None if t is None else (t.reshape(n * width, *t.shape[2:]), width) for t in units]
            pitch = width
        firsts = np.array([first for first, _ in spans], dtype=np.int64).reshape(-1)
        widths = np.array([stop - first for first, stop in spans], dtype=np.int64).reshape(-1)
        starts = np.cumsum(widths) - widths  # each text's first row in the block
        rows = span_rows(np.arange(n) * pitch + firsts, widths)
        (index,) = to_device([rows], flat[0][0].device)
        block = len(self.blocks)
        self.blocks.append([None if f is None else f[0].index_select(0, index) for f in flat])
        for key, start, w in zip(keys, starts.tolist(), widths.tolist()):
            self.remove(key)
            self.spans[key] = (block, start, w)
            self.live += w
        self.size += len(rows)

    def flat(self, keys: Sequence[Hashable]) -> Iterator:
        """The units of ``keys`` without padding: per block they lie in, its rows within their spans as
        flat fields ``[rows, ...]`` (one ``index_select`` per field and block, indices sent from the
        host in one transfer), e.g. to sum over many texts without padding them to one width."""
        by_block: dict[int, list[tuple[int, int]]] = {}
        for key in keys:
            block, first, width = self.spans[key]
            by_block.setdefault(block, []).append((first, width))
        if not by_block:
            return
        rows = [span_rows(*np.array(spans, dtype=np.int64).reshape(-1, 2).T) for spans in by_block.values()]
        for block, index in zip(by_block, to_device(rows, self.blocks[0][0].device)):
            yield self.units_type(*(None if f is None else f.index_select(0, index) for f in self.blocks[block]))

    def _span(self, keys: Sequence[Hashable], block: int, start: int, pitch: int, width: int,
              spans: Sequence[tuple[int, int]]) -> None:
        """Record ``keys`` as the padded rows of ``width`` columns in ``block``, text ``i`` from row
        ``start + i · pitch`` on, each by its span."""
        _check_spans(keys, spans, width)
        for i, (key, (first, stop)) in enumerate(zip(keys, spans)):
            self.remove(key)
            self.spans[key] = (block, start + i * pitch + first, stop - first)
            self.live += stop - first

    def add(self, keys: Sequence[Hashable], units, spans: Sequence[tuple[int, int]]) -> None:
        """Copy the texts ``keys`` (row ``i`` of padded ``units`` ``[N, L, ...]`` is ``keys[i]``, its
        unmasked units within the columns ``spans[i] = (first, stop)``) into the growable block, each
        as ``L`` rows. A key already present is replaced (its old rows become a hole)."""
        n, width = _shape(keys, units)
        block = self._reserve(n * width, units)
        start = self.written
        self._span(keys, self.growable, start, width, width, spans)
        self.written += n * width
        self.size += n * width
        for field, values in zip(block, units):
            if field is not None:  # written through a view: the units may be a non-contiguous slice
                field[start:self.written].view(n, width, *field.shape[1:]).copy_(values)

    def widths(self) -> dict[Hashable, int]:
        """Each text's number of units: the columns of its span."""
        return {key: width for key, (_, _, width) in self.spans.items()}

    def gathered_spans(self, keys: Sequence[Hashable]) -> list[tuple[int, int]]:
        """The span of each text of ``keys`` in their :meth:`gather`: ``(0, width)``."""
        return [(0, self.spans[key][2]) for key in keys]

    def all_have_units(self, keys: Sequence[Hashable]) -> bool:
        """Whether every text of ``keys`` has a unit (a non-empty span), known on the host."""
        return all(self.spans[key][2] > 0 for key in keys)

    def in_storage_order(self, keys: Sequence[Hashable]) -> list[Hashable]:
        """``keys`` sorted by where they are stored: a gather of them makes one ``index_select`` per
        field and per block they come from."""
        return sorted(keys, key=self.spans.__getitem__)

    def remove(self, key: Hashable) -> None:
        """Forget ``key`` (no-op if absent); its rows become a hole."""
        span = self.spans.pop(key, None)
        if span is not None:
            self.live -= span[2]

    def clear(self) -> None:
        self.blocks, self.spans, self.growable, self.written, self.size, self.live = [], {}, None, 0, 0, 0

    @property
    def _first_row(self) -> int:
        """The first row of the growable block that holds units (row 0 is zero with ``zero_padding``)."""
        return int(self.zero_padding)

    def compact(self) -> None:
        """Close the holes (rows of removed texts, and rows outside the spans) if they outnumber the live
        rows: the live rows of every block gathered into one growable block (one ``index_select``
        per block and field, the indices sent from the host in one transfer)."""
        if not self.blocks or self.size - self.live <= self.live:
            return
        if not self.spans:  # nothing live: nothing to keep
            self.clear()
            return
        keys = self.in_storage_order(self.spans)
        rows: dict[int, list[int]] = {}
        spans, written = {}, self._first_row
        for key in keys:
            block, first, width = self.spans[key]
            rows.setdefault(block, []).extend(range(first, first + width))
            spans[key], written = (0, written, width), written + width
        sent = to_device(list(rows.values()), self.blocks[0][0].device)
        fields = zip(*([None if f is None else f.index_select(0, index) for f in self.blocks[block]]
                       for block, index in zip(rows, sent)))
        if self.zero_padding:  # row 0 of the new block: zeros
            fields = ([None if parts[0] is None else parts[0].new_zeros((1, *parts[0].shape[1:])), *parts]
                      for parts in fields)
        self.blocks = [[None if parts[0] is None else parts[0] if len(parts) == 1 else torch.cat(parts)
                        for parts in fields]]
        self.spans, self.growable, self.written, self.size = spans, 0, written, written

    def _reserve(self, rows: int, like) -> list[Tensor | None]:
        """The growable block with room for ``rows`` more rows (its capacity doubles), created the first
        time with the dtypes and devices of the padded units ``like``."""
        if self.growable is None:  # with zero_padding, its row 0: zeros
            self.blocks.append([None if t is None else t.new_zeros((self._first_row, *t.shape[2:])) for t in like])
            self.growable, self.written = len(self.blocks) - 1, self._first_row
            self.size += self._first_row
        block = self.blocks[self.growable]
        capacity, rows = block[0].shape[0], self.written + rows
        if rows > capacity:
            capacity = max(rows, 2 * capacity)
            for k, field in enumerate(block):
                if field is not None:  # rows past ``written`` are never read: left uninitialised
                    new = field.new_empty((capacity, *field.shape[1:]))
                    new[:self.written] = field[:self.written]
                    block[k] = new
        return block

    def index(self, keys: Sequence[Hashable]) -> Gather:
        """The host side of a gather of ``keys`` (:class:`Gather`). Send its ``rows`` with
        :func:`to_device`, then :meth:`gather`."""
        found = [self.spans[k] for k in keys]
        spans = np.array(found, dtype=np.int64).reshape(-1, 3)
        width = max((w for _, _, w in found), default=0)  # in Python: a NumPy reduction costs more
        columns = np.arange(width)
        rows = np.where(columns < spans[:, 2:], spans[:, 1:2] + columns, 0 if self.zero_padding else -1).ravel()
        in_blocks = {block for block, _, _ in found}
        if len(in_blocks) == 1:  # e.g. the reward's cache, one growable block: one run
            return Gather(rows, width, ((in_blocks.pop(), len(keys)),))
        blocks, widths = spans[:, 0].tolist(), spans[:, 2].tolist()
        block = next((b for b, w in zip(blocks, widths) if w), 0)
        for i, w in enumerate(widths):  # an empty text (all padding) joins the run of the text before it
            if w:
                block = blocks[i]
            blocks[i] = block
        return Gather(rows, width, tuple((block, len(list(run))) for block, run in itertools.groupby(blocks)))

    def gather(self, rows: Tensor, where: Gather, select: Tensor | None = None):
        """Padded units ``[R, W, ...]`` of the ``R ≥ 1`` texts whose :meth:`index` is ``where`` (``rows``:
        its ``rows`` sent to the device): one ``index_select`` per field and run, padding masked (by
        reading the zero row, with ``zero_padding``).

        ``select`` ``[P]`` (texts in one block only): the rows ``select`` of that result, ``[P, W, ...]``
        (e.g. a text per pair), read straight from the arena: the index of the rows is selected
        (one ``index_select`` of ``R·W`` integers), not every field of the result."""
        n, width, runs = where.n, where.width, where.runs
        if select is not None:
            if len(runs) > 1:
                raise ValueError(f"select needs texts of one block, these lie in {len(runs)} runs")
            n = select.shape[0]
            rows, runs = rows.view(-1, width).index_select(0, select).view(-1), ((runs[0][0], n),)
        index = rows if self.zero_padding else rows.clamp_min(0)
        fields = []
        for k, field in enumerate(self.blocks[runs[0][0]]):
            if field is not None and len(runs) > 1:  # each run's rows straight into its slice of the result
                out, start = field.new_empty((n * width, *field.shape[1:])), 0
                for block, count in runs:
                    stop = start + count * width
                    torch.index_select(self.blocks[block][k], 0, index[start:stop], out=out[start:stop])
                    start = stop
                field = out
            elif field is not None:
                field = field.index_select(0, index)
            fields.append(None if field is None else field.view(n, width, *field.shape[1:]))
        units = self.units_type(*fields)
        return units if self.zero_padding else units._replace(mask=units.mask & (rows >= 0).view(n, width))
