"""A module's submodules and tensors, walked once and re-walked only when some module's structure changes.

A reward call checks, every time, that the encoder's weights have not changed since its references
were cached (:func:`weights_fingerprint`), and switches the scorer to eval mode for the call
(:func:`eval_mode`). Both need every submodule and tensor of the scorer; walking the tree each time
(``modules()``, ``parameters()``) cost 0.2-0.9 ms per call on the CPU, more than the rest of a reward
call's host work. So the walk is cached, and the cache is dropped whenever *any* module in the
process registers a submodule, parameter or buffer (torch's global registration hooks bump one
counter): assigning ``model.layer = ...``, ``model.weight = nn.Parameter(...)`` or a buffer all
re-walk. What the cache cannot see is ``del module.child`` (no hook fires): the walk then still
lists the removed module and its tensors, which only makes the fingerprint stricter.
"""
from __future__ import annotations

import contextlib
import weakref

from torch import Tensor, nn
from torch.nn.modules.module import (register_module_buffer_registration_hook,
                                     register_module_module_registration_hook,
                                     register_module_parameter_registration_hook)

_generation = 0
_walks: "weakref.WeakKeyDictionary[nn.Module, tuple[int, list[nn.Module], list[Tensor]]]" = weakref.WeakKeyDictionary()


def _structure_changed(*_) -> None:
    global _generation
    _generation += 1


for _register in (register_module_module_registration_hook, register_module_parameter_registration_hook,
                  register_module_buffer_registration_hook):
    _register(_structure_changed)


def walk(module: nn.Module) -> tuple[list[nn.Module], list[Tensor]]:
    """Every submodule of ``module`` (itself included, each once) and every parameter and buffer they
    hold (a tensor shared by two modules listed twice), cached until a module registers anything."""
    cached = _walks.get(module)
    if cached is not None and cached[0] == _generation:
        return cached[1], cached[2]
    modules = list(module.modules())
    tensors = [t for m in modules for d in (m._parameters, m._buffers) for t in d.values() if t is not None]
    _walks[module] = (_generation, modules, tensors)
    return modules, tensors


def weights_fingerprint(module: nn.Module) -> tuple:
    """Changes whenever a parameter or buffer of ``module`` is replaced, moved, cast or updated in place
    (its identity, storage, version counter, dtype or device)."""
    return tuple((id(t), t.data_ptr(), t._version, t.dtype, t.device) for t in walk(module)[1])


@contextlib.contextmanager
def eval_mode(module: nn.Module):
    """Every submodule in eval mode for the body, then the ones that were training restored."""
    training = [m for m in walk(module)[0] if m.training]
    if training:  # nothing to switch when the module is already in eval mode
        module.eval()
    try:
        yield
    finally:
        for m in training:
            m.training = True
