"""Host-to-device transfers that do not make the host wait.

A copy from ordinary (pageable) host memory to a CUDA device is synchronous: the host waits until the
copy is done, so until every kernel queued before it (e.g. the encoder) has run. From page-locked
(pinned) memory with ``non_blocking=True`` the copy is queued on the stream like a kernel and the
host goes on. :func:`send` does that on CUDA (a plain move elsewhere); :func:`to_device` sends many
index lists as one tensor.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor


def send(host: Tensor, device: torch.device | str | None) -> Tensor:
    """``host`` (a CPU tensor) on ``device``, asynchronously from pinned memory when it is CUDA."""
    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def to_device(lists: Sequence[Sequence[int] | np.ndarray | None],
              device: torch.device | str | None) -> list[Tensor | None]:
    """Long tensors of ``lists`` (of ints, or integer arrays; ``None`` stays ``None``) on ``device``,
    sent in one transfer (one host tensor, :func:`send`, then split into views on the device)."""
    present = [np.asarray(values, dtype=np.int64).reshape(-1) for values in lists if values is not None]
    host = torch.from_numpy(np.concatenate(present)) if present else torch.zeros(0, dtype=torch.long)
    sent = iter(send(host, device).split([len(values) for values in present]))
    return [None if values is None else next(sent) for values in lists]
