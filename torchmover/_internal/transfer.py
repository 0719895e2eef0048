"""Host-to-device transfers that do not make the host wait.

A copy from ordinary (pageable) host memory to a CUDA device is synchronous: the host waits until the
copy is done, so until every kernel queued before it (e.g. the encoder) has run. From page-locked
(pinned) memory with ``non_blocking=True`` the copy is queued on the stream like a kernel and the
host goes on. :func:`send` does that on CUDA (a plain move elsewhere); :func:`to_device` sends many
index lists as one tensor, and :func:`send_plans` the index fields of many host plans (the
``NamedTuple`` s of indices that a call builds on the host before its encoder runs) at once.
"""
from __future__ import annotations

from typing import Iterator, Sequence, TypeVar, overload

import numpy as np
import torch
from torch import Tensor

P = TypeVar("P")  # a host plan


def send(host: Tensor, device: torch.device | str | None) -> Tensor:
    """``host`` (a CPU tensor) on ``device``, asynchronously from pinned memory when it is CUDA."""
    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


@overload
def to_device(lists: Sequence[Sequence[int] | np.ndarray], device: torch.device | str | None) -> list[Tensor]: ...


@overload
def to_device(lists: Sequence[Sequence[int] | np.ndarray | None],
              device: torch.device | str | None) -> list[Tensor | None]: ...


def to_device(lists: Sequence[Sequence[int] | np.ndarray | None],
              device: torch.device | str | None) -> list[Tensor | None] | list[Tensor]:
    """Long tensors of ``lists`` (of ints, or integer arrays; ``None`` stays ``None``) on ``device``,
    sent in one transfer (one host tensor, :func:`send`, then split into views on the device)."""
    present = [np.asarray(values, dtype=np.int64).reshape(-1) for values in lists if values is not None]
    host = torch.from_numpy(np.concatenate(present)) if present else torch.zeros(0, dtype=torch.long)
    sent = iter(send(host, device).split([len(values) for values in present]))
    return [None if values is None else next(sent) for values in lists]


def is_plan(value) -> bool:
    """A host plan: a ``NamedTuple`` with a ``to_device`` method (:func:`send_plans`)."""
    return isinstance(value, tuple) and hasattr(value, "_fields") and hasattr(value, "to_device")


def _index_fields(plan) -> Iterator[Sequence[int] | np.ndarray]:
    for value in plan:
        if isinstance(value, (list, np.ndarray)):
            yield value
        elif is_plan(value):
            yield from _index_fields(value)


def _with_sent(plan, sent: Iterator[Tensor]):
    return type(plan)(*(next(sent) if isinstance(value, (list, np.ndarray)) else
                        _with_sent(value, sent) if is_plan(value) else value for value in plan))


def send_plans(plans: Sequence[P], device: torch.device | str | None) -> list[P]:
    """Host plans (``NamedTuple`` s with a ``to_device`` method) as the same plans with every index
    field — a list of ints or an integer array, also within a nested plan — a long tensor on
    ``device``, all sent in one transfer (:func:`to_device`). Other fields (counts, flags, ``None``,
    tuples, host-side records) are kept as they are."""
    sent = iter(to_device([values for plan in plans for values in _index_fields(plan)], device))
    return [_with_sent(plan, sent) for plan in plans]


def plan_to_device(plan: P, device: torch.device | str | None) -> P:
    """The ``to_device`` method of a host plan: :func:`send_plans` of the one plan."""
    return send_plans([plan], device)[0]
