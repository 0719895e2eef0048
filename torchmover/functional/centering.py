"""Centering of contextual token vectors before cosine similarity.

Contextual embeddings share a large common direction, so the cosine of two random words is far from
0. Subtracting an estimate of the corpus mean fixes that: after centering and L2-normalisation a
random pair of words has ~0 similarity. Modes:

- ``none``: no centering.
- ``dimension``: each token vector minus the mean of its own coordinates.
- ``sentence``: each text's tokens minus that text's mean token.
- ``batch``: every token minus the mean of all real tokens in the call (hypotheses and references
  together) — the paper's choice. Scores then depend on what else is in the batch.
- ``fixed``: a given mean vector (e.g. estimated once on a corpus) — the reproducible choice.

The :class:`Centering` module adds ``running`` (BatchNorm style) and keeps the mean in a buffer, so it
is saved with ``state_dict``.
"""
from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from ..runtime.distributed import all_reduce_sum, is_distributed
from .family import check_mask, check_vectors

CENTERING_MODES = ("none", "dimension", "sentence", "batch", "fixed")
MODULE_MODES = CENTERING_MODES + ("running",)


def masked_mean(x: Tensor, mask: Tensor, dim: tuple[int, ...]) -> Tensor:
    """Mean of ``x`` (``[..., L, D]``) over the real tokens (``mask``: ``[..., L]``) along ``dim``."""
    weights = mask.unsqueeze(-1).to(x.dtype)
    total = torch.where(mask.unsqueeze(-1), x, 0.0).sum(dim, keepdim=True)
    return total / weights.sum(dim, keepdim=True).clamp_min(1.0)


def token_sum(x: Tensor, mask: Tensor, dtype: torch.dtype) -> Tensor:
    """``[D]`` sum of the real token vectors of ``x`` (``[B, L, D]``, ``mask``: ``[B, L]``), accumulated
    in ``dtype``: the ``Σ x`` of every corpus mean ``Σ x / n``."""
    return torch.where(mask.unsqueeze(-1), x, 0.0).to(dtype).sum((0, 1))


def token_mean(x: Tensor, mask: Tensor) -> Tensor:
    """``[D]`` mean of all real token vectors of ``x`` (``[B, L, D]``); zeros if there are none."""
    return masked_mean(x, mask, dim=(0, 1)).reshape(x.shape[-1])


def global_token_mean(x: Tensor, mask: Tensor, *, group=None, return_count: bool = False):
    """``[D]`` mean of the real token vectors of ``x`` (``[B, L, D]``, ``mask``: ``[B, L]``) over all
    ranks of ``group`` — ``μ = Σ_r S_r / Σ_r n_r`` through one differentiable all-reduce of
    ``(S_r, n_r)`` (:mod:`torchmover.runtime.distributed`) — zeros if no rank has a token. Outside a
    distributed job (or with one process) this is :func:`token_mean`, bit for bit.

    With ``return_count=True`` also returns the global number of real tokens ``n`` (a Python int).

    Collective: every rank of ``group`` must call it (and backpropagate through it) in step.
    """
    if not is_distributed(group):
        mean = token_mean(x, mask)
        return (mean, int(mask.sum())) if return_count else mean
    acc = torch.promote_types(x.dtype, torch.float32)  # reduce in float32 or wider
    s = token_sum(x, mask, acc)  # [D]  S_r
    n = mask.sum().to(acc).reshape(1)  # [1]  n_r
    stats = all_reduce_sum(torch.cat([s, n]), group)  # [D + 1]  (S, n)
    total, count = stats[:-1], stats[-1]
    mean = (total / count.clamp_min(1.0)).to(x.dtype)  # [D]
    return (mean, int(count.item())) if return_count else mean


def center(x: Tensor, mask: Tensor, mode: str = "batch", mean: Tensor | None = None) -> Tensor:
    """Center token vectors ``x`` (``[B, L, D]``, ``mask``: ``[B, L]``) by ``mode`` (module docs).

    ``batch`` uses the mean of every real token in ``x``: to center hypotheses and references
    together, pass them stacked, or compute ``token_mean`` over both and use ``mode="fixed"``.
    Padding positions are returned as zeros. Never modifies ``x`` in place. Works in float32 or
    wider: bf16/fp16 vectors are upcast first (their mean, and ``mean``, are never rounded to them).
    ``mask`` must have ``x``'s shape ``[B, L]`` exactly (it is not broadcast).
    """
    check_vectors("x", x)
    check_mask("mask", mask, x)
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    if mode not in CENTERING_MODES:
        raise ValueError(f"mode must be one of {CENTERING_MODES}, got {mode!r}")
    if (mode == "fixed") != (mean is not None):
        raise ValueError("mean must be given exactly when mode='fixed'")
    if mode == "dimension":
        x = x - x.mean(-1, keepdim=True)
    elif mode == "sentence":
        x = x - masked_mean(x, mask, dim=(1,))
    elif mode == "batch":
        x = x - token_mean(x, mask)
    elif mode == "fixed":
        mean = cast(Tensor, mean)  # not None: checked above ("fixed" exactly when a mean is given)
        if mean.shape != x.shape[-1:]:
            raise ValueError(f"mean must have shape {tuple(x.shape[-1:])}, got {tuple(mean.shape)}")
        x = x - mean.to(x)  # x is float32 or wider here: the mean is never rounded to bf16
    return torch.where(mask.unsqueeze(-1), x, 0.0)


class Centering(nn.Module):
    """Centering as a module, with the mean kept in the ``mean`` buffer (saved with ``state_dict``).

    Modes are those of :func:`center` plus ``running``: the batch mean in training mode (and an
    exponential moving average ``mean ← (1 − momentum)·mean + momentum·batch_mean`` of it), the
    running mean in eval mode. ``fixed`` needs :meth:`fit` first: the mean of every real token of a
    corpus, which makes a text's score independent of the rest of the batch — the choice for rewards
    and reproducible evaluation.

    ``sync`` (default True): in training mode, inside a ``torch.distributed`` job with more than one
    process, the batch mean of ``batch`` and ``running`` is the mean of the real tokens of *all*
    ranks, through a differentiable all-reduce (:mod:`torchmover.runtime.distributed`), so W processes on
    slices of a batch center, score and backpropagate like one process on the whole batch. Every rank
    must then run forward and backward in step, as with SyncBatchNorm. Eval mode (the default of a
    :class:`~torchmover.Scorer`, and always inside ``Scorer.score``) centers each process's batch
    locally, so evaluating on one rank never waits for the others (``Scorer.score(...,
    centering_group=...)``, as ``MoverMetric.compute`` uses it, centers on every rank's texts instead).
    """

    mean: Tensor  # buffers (register_buffer in __init__)
    num_tokens: Tensor

    def __init__(self, mode: str = "batch", dim: int | None = None, momentum: float = 0.1,
                 sync: bool = True):
        super().__init__()
        if mode not in MODULE_MODES:
            raise ValueError(f"mode must be one of {MODULE_MODES}, got {mode!r}")
        if not 0 < momentum <= 1:
            raise ValueError(f"momentum must be in (0, 1], got {momentum!r}")
        self.mode, self.momentum, self.sync = mode, momentum, bool(sync)
        self.register_buffer("mean", torch.zeros(dim or 0))
        self.register_buffer("num_tokens", torch.zeros((), dtype=torch.long))
        self._fitted = False  # num_tokens > 0, mirrored on the host so that checking it reads no device data

    @property
    def fitted(self) -> bool:
        """Whether the buffer holds a mean (from :meth:`fit`, a running estimate, or a state dict).
        Kept on the host: reading it never waits for the device."""
        return self._fitted

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}, dim={self.mean.numel()}, momentum={self.momentum}"

    def forward(self, x: Tensor, mask: Tensor, mean: Tensor | None = None) -> Tensor:
        """Center ``x`` (``[B, L, D]``, ``mask``: ``[B, L]``) by the module's mode.

        ``mean`` (``batch`` mode only): subtract this ``[D]`` vector instead of the batch's own mean —
        the mean of a larger set of texts that ``x`` is part of (``Scorer.score`` passes the mean of
        every text of the call, so that scores do not depend on how the call is batched).
        """
        if mean is not None:
            if self.mode != "batch":
                raise ValueError(f"an explicit mean is only defined for mode='batch', this module uses {self.mode!r}")
            return center(x, mask, "fixed", mean)
        sync = self._syncs()  # batch mean over all ranks
        x = x.to(torch.promote_types(x.dtype, torch.float32))  # bf16/fp16 encoders: means in float32
        if self.mode in ("none", "dimension", "sentence") or (self.mode == "batch" and not sync):
            return center(x, mask, self.mode)
        if self.mode == "batch":
            return center(x, mask, "fixed", global_token_mean(x, mask))
        if self.mode == "running" and self.training:
            if sync:
                batch_mean, n_tokens = global_token_mean(x, mask, return_count=True)
            else:
                batch_mean, n_tokens = token_mean(x, mask), int(mask.sum())
            self._update_running_mean(batch_mean.detach(), n_tokens)
            return center(x, mask, "fixed", batch_mean)
        self._check_fitted()
        return center(x, mask, "fixed", self.mean)

    def _check_fitted(self) -> None:
        if not self.fitted:
            raise RuntimeError(
                f"Centering(mode={self.mode!r}) has no mean yet: call fit(...) on a corpus first"
                + (" or run it in training mode" if self.mode == "running" else "")
            )

    def shift(self, mean: Tensor | None = None) -> Tensor | None:
        """The ``[D]`` vector that :meth:`forward` subtracts from every real token in eval mode, where it
        subtracts one vector whatever the other tokens: ``None`` for ``none``, the fitted mean for
        ``fixed`` and ``running``, the explicit ``mean`` for ``batch``. So a store of token vectors can
        be centered once, row by row (``x - shift``, the same values as :meth:`forward`'s). Raises
        ``ValueError`` where the vector depends on the tokens (``sentence``, ``dimension``, ``batch``
        without ``mean``, training mode), and as :meth:`forward` does without a fitted mean."""
        if mean is not None and self.mode != "batch":
            raise ValueError(f"an explicit mean is only defined for mode='batch', this module uses {self.mode!r}")
        if not self.subtracts_one_vector(given_mean=mean is not None):
            raise ValueError(f"Centering(mode={self.mode!r}{', training' if self.training else ''}) does not "
                             "subtract one vector from every token")
        if self.mode in ("fixed", "running"):
            self._check_fitted()
        return None if self.mode == "none" else mean if mean is not None else self.mean

    def subtracts_one_vector(self, given_mean: bool = False) -> bool:
        """Whether :meth:`shift` is defined: in eval mode, ``none``, ``fixed``, ``running``, and ``batch``
        given its mean (``given_mean``); not ``sentence`` nor ``dimension`` (a vector per text or token)."""
        return not self.training and (self.mode in ("none", "fixed", "running") or (self.mode == "batch" and given_mean))

    def batch_mean(self, x: Tensor, mask: Tensor) -> Tensor:
        """``[D]`` the mean that ``batch`` mode subtracts from ``x`` (``[B, L, D]``, ``mask``: ``[B, L]``):
        of its real tokens, over every rank in training under ``torch.distributed`` (as :meth:`forward`);
        in float32 or wider. For a caller that centers other vectors on it (``forward(y, m, mean=...)``)."""
        x = x.to(torch.promote_types(x.dtype, torch.float32))
        return global_token_mean(x, mask) if self._syncs() else token_mean(x, mask)

    def _syncs(self) -> bool:
        """Whether a batch mean is taken over all ranks (``sync``, in training, in a distributed job)."""
        return self.sync and self.training and is_distributed()

    @torch.no_grad()
    def _update_running_mean(self, batch_mean: Tensor, n_tokens: int) -> None:
        if n_tokens == 0:
            return
        self._resize(batch_mean)
        if self.fitted:
            self.mean.lerp_(batch_mean.to(self.mean), self.momentum)
        else:
            self.mean.copy_(batch_mean)
        self.num_tokens += n_tokens
        self._fitted = True

    @torch.no_grad()
    def fit(self, embeddings, mask: Tensor | None = None, *, distributed: bool = False) -> "Centering":
        """Set ``mean`` to the exact mean of every real token vector of a corpus.

        ``embeddings`` is a ``[B, L, D]`` tensor with its ``mask``, or an iterable of
        ``(embeddings, mask)`` batches (streamed, accumulated in float64). To fit on texts, use
        :meth:`torchmover.Scorer.fit_centering`, which encodes them first.

        ``distributed=True`` inside a ``torch.distributed`` job: the batches are this rank's share of
        the corpus, and the float64 ``(Σ x, count)`` of every rank are all-reduced, so every rank sets
        the same mean, that of the whole corpus (a collective: every rank must call it; a rank may
        have no batch at all when the mean's dimension is known).
        """
        batches = [(embeddings, mask)] if isinstance(embeddings, Tensor) else embeddings
        total, count = None, 0
        for x, m in batches:
            m = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if m is None else m.bool()
            s = token_sum(x, m, torch.float64)
            total = s if total is None else total + s
            count += int(m.sum())
        if distributed:
            if total is None:
                if not self.mean.numel():
                    raise ValueError("fit(distributed=True) on a rank without batches needs Centering(dim=...)")
                total = torch.zeros_like(self.mean, dtype=torch.float64)
            stats = all_reduce_sum(torch.cat([total, total.new_tensor([count])]))  # [D + 1]  (Σ x, count)
            total, count = stats[:-1], int(stats[-1])
        # total is None only without a batch, when count == 0, which fit_sums rejects before reading it
        return self.fit_sums(cast(Tensor, total), count)

    @torch.no_grad()
    def fit_sums(self, total: Tensor, count: int) -> "Centering":
        """Set ``mean`` to ``total / count``: the sum ``[D]`` (float64) of every real token vector of a
        corpus and their number, accumulated elsewhere (e.g. over a corpus streamed in chunks)."""
        if count == 0:
            raise ValueError("fit() needs at least one real token")
        self._resize(total)
        self.mean.copy_((total / count).to(self.mean))
        self.num_tokens.fill_(count)
        self._fitted = True
        return self

    def _resize(self, like: Tensor) -> None:
        if self.mean.numel() != like.numel():
            self.mean = torch.zeros(like.numel(), dtype=self.mean.dtype, device=self.mean.device)

    def _apply(self, fn, recurse=True):
        """``.to(...)`` / ``.cuda()`` / ``.half()`` move the mean but keep it float32 or wider: a
        ``Scorer.to(torch.bfloat16)`` runs the encoder in bf16 and still centers with the exact mean
        (converted from the original, never via bf16)."""
        mean = self.mean
        super()._apply(fn, recurse)
        if self.mean.dtype != mean.dtype:
            self.mean = mean.to(device=self.mean.device, dtype=torch.promote_types(self.mean.dtype, torch.float32))
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        saved = state_dict.get(prefix + "mean")
        if saved is not None:
            self._resize(saved)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._fitted = bool(self.num_tokens > 0)  # once, when loading
