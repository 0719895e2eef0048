"""Collectives for statistics over all processes of a ``torch.distributed`` job (the SyncBatchNorm idea).

:func:`all_reduce_sum` is a differentiable sum over ranks; batch centering builds on it
(:func:`torchmover.functional.centering.global_token_mean`). With data parallelism each rank holds a slice of
the global batch. Batch centering subtracts the mean of every real token of the batch,

    μ = (Σ_r Σ_{i,l} m^r_il x^r_il) / (Σ_r Σ_{i,l} m^r_il),

so every rank needs the global sum ``S = Σ_r S_r`` and count ``n = Σ_r n_r``. One all-reduce of the
``[D + 1]`` vector ``(S_r, n_r)`` gives both, and because the all-reduce is differentiable (its
backward is the all-reduce of the incoming gradients) the gradient of each rank's loss reaches every
rank's token vectors through μ:

    ∂/∂x^s (Σ_r L_r) = ∂L_s/∂x^s |_μ + (m^s / n) · Σ_r ∂L_r/∂μ.

Each rank sums the tokens of its own slice's texts, so μ is equal to one process's on the concatenated
batch where no text is on two ranks; a text on k ranks counts k times in the mean (one process encodes
each distinct text of its batch once). Where no text is on two ranks, one process on the concatenated
batch and ``W`` processes on its slices give the same μ and the same loss ``Σ_r L_r``, and the
parameter gradients summed over ranks equal the single-process gradient. (``DistributedDataParallel``
*averages* gradients over ranks: scale each rank's loss by ``W`` for the sum, or use a mean-reduced
loss ``Σ_r L_r / N_global`` throughout.)

Every rank must call the collective the same number of times, forward and backward, like
SyncBatchNorm: a rank that skips a step (e.g. an empty batch) stalls the others.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os

import torch
import torch.distributed as dist
from torch import Tensor



def is_distributed(group=None) -> bool:
    """Whether ``torch.distributed`` is initialised with more than one process in ``group``."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


class _AllReduceSum(torch.autograd.Function):
    """``y = Σ_r x_r`` on every rank; backward ``∂x_r = Σ_s ∂y_s`` (the same all-reduce)."""

    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        y = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=group)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _AllReduceSum.apply(grad, ctx.group), None


def all_reduce_sum(x: Tensor, group=None) -> Tensor:
    """Differentiable sum of ``x`` over the ranks of ``group`` (default: the world); ``x`` if not
    distributed. Never modifies ``x``."""
    if not is_distributed(group):
        return x
    return _AllReduceSum.apply(x, group)


# --- corpus statistics fitted by every rank on its share (fit_centering, fit_idf, MoverReward.fit) ----

def shard(texts: list[str], device: torch.device | str = "cpu", group=None) -> list[str]:
    """This rank's share ``texts[rank::world_size]`` of a corpus that every rank of ``group`` passes
    whole (``texts`` itself outside a distributed job).

    Strided rather than contiguous, so that each rank gets texts of every length of a sorted corpus.
    Collective: checks that every rank passed the same list (:func:`check_same_on_every_rank`), and
    raises ``ValueError`` on every rank if not.
    """
    if not is_distributed(group):
        return texts
    check_same_on_every_rank(texts, device, group, "under torch.distributed every rank must fit on the same texts "
                             "(each encodes its share texts[rank::world_size]); the ranks passed different lists. "
                             "Pass distributed=False to fit on this rank's texts alone")
    return texts[dist.get_rank(group)::dist.get_world_size(group)]


def check_same_on_every_rank(value, device: torch.device | str, group, message: str) -> None:
    """Raise ``ValueError(message)`` on every rank of ``group`` unless every rank passed the same
    JSON-serialisable ``value`` (:func:`differing_on_ranks`: one all-reduce)."""
    if differing_on_ranks({"value": value}, device, group):
        raise ValueError(message)


def differing_on_ranks(values: dict[str, object], device: torch.device | str, group) -> list[str]:
    """The names of ``values`` (JSON-serialisable; every rank of ``group`` passes the same names, in the
    same order) whose value is not the same on every rank: the same list on every rank, in the order of
    ``values``. One all-reduce of a 56-bit digest of each value and its negation (a tensor on
    ``device``: the CPU for gloo, the rank's GPU for NCCL)."""
    digests = [int.from_bytes(hashlib.sha256(json.dumps(v).encode()).digest()[:7], "big") for v in values.values()]
    extremes = torch.tensor([[d, -d] for d in digests], dtype=torch.long, device=device).reshape(len(digests), 2)
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=group)  # per value: (max digest, −min digest)
    return [name for name, d, (high, low) in zip(values, digests, extremes.tolist()) if high != d or low != -d]


def all_gather_shares(share: Tensor, sizes: list[int], group=None) -> Tensor:
    """Every rank's ``share`` (``[..., sizes[rank]]``, on any rank's device) concatenated along the last
    dimension in rank order, on every rank: shares padded to the largest, one ``all_gather``."""
    width = max(sizes)
    padded = torch.nn.functional.pad(share, (0, width - share.shape[-1]))
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([part[..., :size] for part, size in zip(parts, sizes)], dim=-1)


def broadcast_object(value=None, device: torch.device | str = "cpu", src: int = 0, group=None):
    """``value`` of rank ``src`` on every rank of ``group`` (any picklable object; the other ranks'
    ``value`` is ignored), or ``value`` itself outside a distributed job. ``device``: where the
    pickled bytes travel (the CPU for gloo, the rank's GPU for NCCL)."""
    if not is_distributed(group):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=src, group=group, device=torch.device(device))
    return box[0]


# --- a command launched by torchrun -------------------------------------------------------------------

def init_distributed_from_environment(device: str | torch.device = "auto") -> bool:
    """Join the process group a launcher describes (``torchrun`` sets ``WORLD_SIZE``, ``RANK``,
    ``MASTER_ADDR``, ...) when it has more than one process and none is joined yet: NCCL when this
    process scores on a GPU, gloo otherwise. Returns whether it joined (and should leave:
    :func:`destroy_distributed`)."""
    from .devices import resolve_device

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not dist.is_available() or dist.is_initialized():
        return False
    on_gpu = resolve_device(device).type == "cuda"
    if on_gpu:
        torch.cuda.set_device(resolve_device(device))
    dist.init_process_group("nccl" if on_gpu else "gloo", timeout=datetime.timedelta(minutes=30))
    return True


def destroy_distributed(barrier: bool = True) -> None:
    """Leave the process group, after a ``barrier`` (no rank tears it down while another still uses
    it; none after an error, which another rank may never reach)."""
    if dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()


def is_rank0(group=None) -> bool:
    """Whether this process is rank 0 of ``group`` (always outside a distributed job)."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank(group) == 0
