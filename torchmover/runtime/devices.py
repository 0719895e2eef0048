"""Where and in which precision a scorer runs: the ``device`` and ``dtype`` arguments, resolved once.

``device``:

- ``"auto"`` (the default of :class:`~torchmover.Scorer`): a CUDA GPU when one is available, else the
  CPU. Under ``torchrun`` / ``accelerate`` (the launcher sets ``LOCAL_RANK``) it is the local rank's
  GPU, ``cuda:{LOCAL_RANK}`` (``cuda:0`` when the launcher makes one GPU visible per process).
- ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, ... or a ``torch.device``: used as given, after a check
  that it exists here (``device="cuda"`` without CUDA is a ``ValueError`` naming the argument, not
  torch's ``AssertionError`` at the first tensor).

``dtype`` (the encoder's precision; scores and the centering mean stay float32 or wider):
``None`` keeps the loaded weights' dtype; a floating ``torch.dtype``; or one of the strings
``float32``/``fp32``/``float``, ``bfloat16``/``bf16``, ``float16``/``fp16``/``half``,
``float64``/``fp64``/``double``.
"""
from __future__ import annotations

import contextlib
import os

import torch

DTYPE_NAMES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
}


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """The ``torch.device`` that ``device`` names (module docs); ``None`` means ``"auto"``.

    Raises ``ValueError`` naming the argument for an unknown name, a CUDA device on a machine without
    CUDA, or a GPU index that does not exist.
    """
    if device is None or device == "auto":
        return _auto_device()
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be 'auto', a device name such as 'cpu' or 'cuda:1', or a torch.device, "
                        f"got {type(device).__name__}")
    try:
        resolved = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N', ... or a torch.device, got {device!r} "
                         f"({error})") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r} but CUDA is not available on this machine (torch "
                             f"{torch.__version__}, CUDA build: {torch.version.cuda or 'none'}); "
                             "use device='cpu' or device='auto'")
        count = torch.cuda.device_count()
        if resolved.index is not None and resolved.index >= count:
            raise ValueError(f"device={str(device)!r} but this machine has {count} CUDA device(s) "
                             f"(cuda:0 ... cuda:{count - 1})")
    elif resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={str(device)!r} but MPS is not available on this machine; use device='cpu'")
    return resolved


def _auto_device() -> torch.device:
    """CUDA when available (the local rank's GPU under a launcher that sets ``LOCAL_RANK``), else CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is None:
        return torch.device("cuda", torch.cuda.current_device())
    try:
        rank = int(local_rank)
    except ValueError:
        raise ValueError(f"device='auto' reads the environment variable LOCAL_RANK, which is not an int: "
                         f"{local_rank!r}") from None
    count = torch.cuda.device_count()
    if count == 1:  # the launcher made one GPU visible per process (CUDA_VISIBLE_DEVICES)
        return torch.device("cuda", 0)
    if not 0 <= rank < count:
        raise ValueError(f"device='auto' with LOCAL_RANK={rank} but this machine has {count} CUDA devices: "
                         "pass device='cuda:N' explicitly")
    return torch.device("cuda", rank)


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """The floating ``torch.dtype`` that ``dtype`` names (module docs); ``None`` stays ``None`` (keep the
    weights' dtype). Raises ``ValueError`` naming the argument otherwise."""
    if dtype is None or isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    if isinstance(dtype, str) and dtype.lower().removeprefix("torch.") in DTYPE_NAMES:
        return DTYPE_NAMES[dtype.lower().removeprefix("torch.")]
    raise ValueError(f"dtype must be None, a floating torch.dtype or one of {tuple(DTYPE_NAMES)}, got {dtype!r}")


def autocast_off(device: torch.device):
    """A context with autocast off on ``device``'s type; nothing to switch off where torch has no
    autocast (the ``meta`` device, on which the hot paths are traced without computing) or where it
    is off already, as it is outside a caller's ``torch.autocast`` (the check costs a fraction of
    entering and leaving a context, which the hot path would otherwise do on every call)."""
    if not torch.amp.is_autocast_available(device.type) or not torch.is_autocast_enabled(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, enabled=False)
