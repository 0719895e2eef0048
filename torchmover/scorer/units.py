"""What the scorer moves and what it returns: :class:`Units` (token vectors, mask and weights of
many texts) and :class:`PRF` (precision, recall and F1)."""
from __future__ import annotations

from typing import NamedTuple, Sequence, cast

import torch
from torch import Tensor, nn

from ..functional.centering import Centering


class Units(NamedTuple):
    """What is moved: padded unit vectors ``[N, L, D]``, ``mask`` ``[N, L]``, each unit's IDF weight
    under the hypothesis and the reference dictionaries (``None`` without IDF), and for the sentence
    movers the sentence each token belongs to (``[N, L]``, ``None`` otherwise)."""

    vectors: Tensor
    mask: Tensor
    hyp_weights: Tensor | None = None
    ref_weights: Tensor | None = None
    sentence_ids: Tensor | None = None

    def select(self, index: Tensor | slice) -> "Units":
        """The rows ``index``: views for a slice, else one ``index_select`` per field (on the CPU
        cheaper than ``t[index]``, which goes through advanced indexing)."""
        if isinstance(index, slice):
            return Units._make(None if t is None else t[index] for t in self)
        return Units._make(None if t is None else t.index_select(0, index) for t in self)

    def narrow(self, width: int) -> "Units":
        """The first ``width`` columns of every field (views)."""
        return Units._make(None if t is None else t[:, :width] for t in self)

    def unpad(self) -> list["Units"]:
        """Per-text units with their padding removed (each field ``[n_i, ...]``)."""
        keep = self.mask
        return [Units._make(None if t is None else t[i][keep[i]] for t in self) for i in range(keep.shape[0])]

    @staticmethod
    def pad(rows: Sequence["Units"]) -> "Units":
        """Stack per-text units (``[n_i, ...]``, non-empty list) into padded ``Units`` (``L = max n_i``,
        padding masked)."""
        return Units._make(None if rows[0][k] is None
                           # every row has field k where the first has it
                           else nn.utils.rnn.pad_sequence([cast(Tensor, r[k]) for r in rows], batch_first=True)
                           for k in range(len(Units._fields)))

    def centered(self, centering: Centering, mean: Tensor | None = None) -> "Units":
        """The units with their vectors centered by a :class:`~torchmover.Centering` module (``none``:
        the units as they are, padding included: the family masks it; ``mean``: an explicit batch
        mean, see :meth:`Centering.forward <torchmover.Centering.forward>`)."""
        if centering.mode == "none":
            return self
        return self._replace(vectors=centering(self.vectors, self.mask, mean))

    def concat(self, other: "Units") -> "Units":
        """The rows of ``self`` then ``other``, padded to the wider of the two."""
        width = max(self.mask.shape[1], other.mask.shape[1])

        def widen(t: Tensor) -> Tensor:
            return nn.functional.pad(t, [0, 0] * (t.dim() - 2) + [0, width - t.shape[1]])
        # both units have the same fields set: y is a tensor wherever x is
        return Units._make(None if x is None else torch.cat([widen(x), widen(cast(Tensor, y))])
                           for x, y in zip(self, other))


class BatchMeans(NamedTuple):
    """The means that ``batch`` centering subtracts in a call (one, joint; or the hypotheses' and the
    references'), each ``[D]``, and ``lone`` ``[len(vectors)]`` bool: whether the mean is one text's own
    (the only text of its set with a unit), whose centered units then sum to 0
    (:func:`~torchmover.text.weights.ngrams`' ``balanced``)."""

    vectors: tuple[Tensor, ...]
    lone: Tensor


class PRF(NamedTuple):
    """Precision, recall and F1 (each ``Tensor[B]``, or a float for a :attr:`Scorer.baseline
    <torchmover.Scorer.baseline>`), in BERTScore's order and sense (recall: every reference token
    ships exactly its mass)."""

    precision: Tensor
    recall: Tensor
    f1: Tensor
