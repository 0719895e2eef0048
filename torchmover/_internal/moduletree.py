"""What the rewards and the metric check about a module on every call: its weights' fingerprint,
and eval mode for the length of a call."""
from __future__ import annotations

import contextlib
from typing import Iterable, Sequence

from torch import Tensor, nn


def submodules(module: nn.Module) -> list[nn.Module]:
    """Every module of the tree of ``module``, each once, breadth first (the set ``module.modules()``
    gives, in another order), without building their names (which ``modules()`` does, at several
    times the cost; this runs on every reward call): the list grows while it is read, each module's
    children appended after it, cheaper than a depth-first walk with a stack."""
    found, seen = [module], {id(module)}
    for m in found:  # reaches the modules appended while it runs
        if m._modules:
            for child in m._modules.values():
                if child is not None and id(child) not in seen:
                    seen.add(id(child))
                    found.append(child)
    return found


def first_parameter(module: nn.Module) -> Tensor | None:
    """``next(module.parameters(), None)``: the first parameter of the tree of ``module`` in the same
    depth-first order, found without the four nested generators of ``parameters()`` (it is read for
    the device on every call)."""
    stack = [module]
    while stack:
        m = stack.pop()
        for p in m._parameters.values():
            if p is not None:
                return p
        stack.extend(reversed([child for child in m._modules.values() if child is not None]))
    return None


def weights_fingerprint(modules: Iterable[nn.Module]) -> tuple:
    """Changes whenever a parameter or buffer of ``modules`` is replaced, moved, cast or updated in place
    (its identity, storage address, version counter or dtype).

    The address also tells devices apart, so the device is not read (``Tensor.device`` makes a new
    object per tensor, on every call): a move or cast allocates the new storage while the old one is alive, at another
    address; CUDA's unified virtual addressing gives every device's memory its own addresses; a
    tensor on ``meta`` has address 0 (the dtype tells ``meta`` casts apart).

    ``modules`` is the tree to watch, walked by the caller on every call (:func:`submodules`, once
    for both this and :func:`eval_mode`), each submodule's ``_parameters`` and ``_buffers`` read
    directly and skipped when empty (``parameters()`` and ``buffers()`` walk the tree twice through
    de-duplicating generators, twice as slow). A walk cached until torch's global registration hooks
    fire would be stale after ``module.to("meta")``, or with
    ``torch.__future__.set_overwrite_module_params_on_conversion``: ``Module._apply`` then puts new
    parameters straight into ``_parameters``, and no hook fires.
    """
    return tuple((id(t), t.data_ptr(), t._version, t.dtype) for m in modules
                 for tensors in (m._parameters, m._buffers) if tensors for t in tensors.values() if t is not None)


@contextlib.contextmanager
def eval_mode(module: nn.Module, modules: Sequence[nn.Module] | None = None):
    """Every submodule in eval mode for the body, then the ones that were training restored.
    ``modules``: :func:`submodules` of ``module``, if the caller has walked it already."""
    training = [m for m in (submodules(module) if modules is None else modules) if m.training]
    if training:  # nothing to switch when the module is already in eval mode
        module.eval()
    try:
        yield
    finally:
        for m in training:
            m.training = True
