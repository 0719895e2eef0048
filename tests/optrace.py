"""Record the aten ops that torchmover issues, and find those that would synchronise host and device.

On CUDA a kernel launch returns at once and the host runs ahead of the GPU, unless an op needs a
value on the host: a scalar read (``.item()``, ``int(t)``, ``bool(t)``: ``aten::_local_scalar_dense``),
an output whose size depends on the data (``nonzero``, ``masked_select``, ``unique``, indexing with a
boolean mask, ``repeat_interleave`` without ``output_size``), a comparison returned as a Python bool
(``equal``, ``is_nonzero``) or an asynchronous assert. Each of these waits for every kernel queued
before it. :class:`OpTrace` records every aten op dispatched while it is active (a
``TorchDispatchMode``, so it works on the CPU: the ops are the same on every device) and keeps those
*issued by torchmover*: the innermost Python frame outside ``torch`` that called the op is in the
torchmover package. Ops issued by the tokenizer or inside the encoder (``transformers`` frames) are
outside torchmover's control and are not recorded.

It also notes the blocking host-to-device transfers torchmover asks for: copies between devices and
every ``Tensor.to(device)`` / ``torch.tensor(..., device=...)`` call that is not asynchronous (seen
through a ``TorchFunctionMode``: on a CPU-only machine moving a tensor to ``cpu`` dispatches no op at
all, but on a GPU the same call is a blocking copy). After the encoder has started
(:meth:`OpTrace.mark`) each of these would make the host wait for the whole encoder.

Not visible on the CPU: ``tolist()`` / ``numpy()`` of a device tensor (a copy back to the host that
dispatches no op on a CPU tensor). torchmover calls ``tolist()`` only in the token policy, on the
tokenizer's host tensors, before anything is sent.

Used by ``tests/test_hotpath.py`` (no sync in the hot paths) and ``bench/bench_ops.py`` (op counts).
"""
from __future__ import annotations

import os
import sys
from typing import NamedTuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import torchmover

_PACKAGE = os.path.dirname(os.path.abspath(torchmover.__file__))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))
_THIS = os.path.abspath(__file__)

# ops that make the host wait for the device on CUDA, whatever their arguments
SYNCING_OPS = frozenset({
    "aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::argwhere", "aten::masked_select",
    "aten::is_nonzero", "aten::equal", "aten::allclose", "aten::_assert_async", "aten::_unique",
    "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive", "aten::unique_dim_consecutive",
    "aten::_assert_async.msg", "aten::bincount", "aten::histc",
})


class Op(NamedTuple):
    """One recorded op: its name, why it syncs (``""`` if it does not), the torchmover frame that
    issued it (``file:line in function``) and a short stack of torchmover frames, innermost first."""

    name: str
    sync: str
    frame: str
    stack: tuple[str, ...]
    after_mark: bool

    def __str__(self) -> str:
        return f"{self.name} ({self.sync}) issued at {self.frame}; stack: {' <- '.join(self.stack)}"


def _sync_reason(name: str, args, kwargs) -> str:
    """Why the op ``name`` on ``(args, kwargs)`` would block the host on CUDA, or ``""``."""
    base = name.split(".")[0]
    if name in SYNCING_OPS or base in SYNCING_OPS:
        return "reads device data on the host"
    if base in ("aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ()):
            return "boolean-mask indexing (output size depends on the data)"
    if base == "aten::repeat_interleave" and kwargs.get("output_size") is None and \
            not (len(args) > 3 and args[3] is not None):
        return "repeat_interleave without output_size"
    non_blocking = kwargs.get("non_blocking", False) or (base == "aten::copy_" and len(args) > 2 and args[2] is True)
    if base in ("aten::_to_copy", "aten::copy_") and not non_blocking:
        devices = {a.device for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)}
        target = kwargs.get("device")
        if target is not None:
            devices.add(torch.device(target))
        if len({d.type for d in devices}) > 1:
            return "copy between devices"
    return ""


def _issuer() -> tuple[str, tuple[str, ...]] | None:
    """The torchmover frame that issued the current op and the torchmover frames above it, or None if
    the innermost non-torch frame is not torchmover's (the tokenizer, the encoder's own code)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not (path.startswith(_TORCH) or path == _THIS or "<frozen" in path):
            break
        frame = frame.f_back
    if frame is None or not os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        return None
    stack = []
    while frame is not None and len(stack) < 6:
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(_PACKAGE):
            stack.append(f"{os.path.relpath(path, os.path.dirname(_PACKAGE))}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return stack[0], tuple(stack)


def _blocking_move(func, args, kwargs) -> bool:
    """Whether a call moves host data to a device and makes the host wait for it: ``torch.tensor`` /
    ``torch.as_tensor`` given a device, ``Tensor.to(device)`` / ``.cuda()`` without ``non_blocking=True``
    (torchmover's :func:`~torchmover._internal.transfer.send` pins the memory first, so its moves are asynchronous)."""
    if func in (torch.as_tensor, torch.tensor):  # device="cpu": a host tensor built on the host, no move
        return kwargs.get("device") is not None and torch.device(kwargs["device"]).type != "cpu"
    if func in (torch.Tensor.to, torch.Tensor.cuda):
        names_device = func is torch.Tensor.cuda or "device" in kwargs or \
            any(isinstance(a, (str, torch.device)) for a in args[1:3])
        return names_device and not kwargs.get("non_blocking", False)
    return False


class _HostMoves(TorchFunctionMode):
    """Reports the device moves torchmover asks for to ``trace`` (see :class:`OpTrace`)."""

    def __init__(self, trace: "OpTrace"):
        super().__init__()
        self.trace = trace

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _blocking_move(func, args, kwargs):
            issuer = _issuer()
            if issuer is not None:
                self.trace.ops.append(Op(f"torch.{getattr(func, '__name__', func)} (device move)", "",
                                         issuer[0], issuer[1], self.trace.marked))
        return func(*args, **kwargs)


class OpTrace(TorchDispatchMode):
    """``with OpTrace() as trace: ...`` records every aten op torchmover issues (module docs).

    ``trace.ops`` lists them (:class:`Op`); :attr:`syncs` those that would block the host on CUDA;
    :attr:`late_host_data` the tensors built from host data or copied across devices after
    :meth:`mark` (call it, e.g. from a forward pre-hook, when the encoder starts).
    """

    def __init__(self):
        super().__init__()
        self.ops: list[Op] = []
        self.marked = False

    def __enter__(self):
        self._moves = _HostMoves(self)
        self._moves.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._moves.__exit__(*exc)

    def mark(self) -> None:
        """Note that the encoder starts now: later host-data tensors are reported as late."""
        self.marked = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        issuer = _issuer()
        if issuer is not None:
            name = f"aten::{func._overloadpacket.__name__}"
            if func._overloadname != "default":
                name += f".{func._overloadname}"
            self.ops.append(Op(name, _sync_reason(name, args, kwargs), issuer[0], issuer[1], self.marked))
        return func(*args, **kwargs)

    @property
    def syncs(self) -> list[Op]:
        """The ops that would block the host on CUDA."""
        return [op for op in self.ops if op.sync and op.sync != "copy between devices"]

    @property
    def kernel_ops(self) -> list[Op]:
        """The aten ops (device moves asked through ``torch`` functions left out)."""
        return [op for op in self.ops if op.name.startswith("aten::")]

    @property
    def late_host_data(self) -> list[Op]:
        """Host data sent to the device after :meth:`mark` (the encoder's start)."""
        return [op for op in self.ops if op.after_mark and
                (op.sync == "copy between devices" or op.name.endswith("(device move)"))]
