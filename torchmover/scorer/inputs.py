"""The inputs every entry point accepts, checked once: lists of texts (any sequence of ``str``, or a
1-D array of them) and their references (one per hypothesis, or a list each). Errors name the
argument and the index."""
from __future__ import annotations

import itertools
from typing import Sequence

from torch import Tensor


def as_list(name: str, values, what: str, ndim: int = 1) -> list:
    """``values`` as a list: any sequence but a str, or an array with ``ndim`` dimensions or fewer
    that has ``tolist`` (a NumPy array of ``str`` or ``object``, a pandas Series; ``ndim`` 2 gives
    a list of rows)."""
    if isinstance(values, Sequence) and not isinstance(values, (str, bytes)):
        return list(values)
    if hasattr(values, "tolist") and isinstance(getattr(values, "ndim", None), int) and not isinstance(values, Tensor):
        if not 1 <= values.ndim <= ndim:
            raise ValueError(f"{name} must be a {'1-D' if ndim == 1 else f'1-D to {ndim}-D'} array of {what}, "
                             f"got shape {tuple(values.shape)}")
        return values.tolist()
    raise TypeError(f"{name} must be a list of {what}, got {type(values).__name__}")


def check_texts(name: str, texts) -> list[str]:
    """``texts`` (any sequence of str, or a 1-D array of them) as a list of str."""
    texts = as_list(name, texts, "strings")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(t).__name__}")
    return texts


def check_references(hyps: list[str], refs) -> list[list[str]]:
    """``refs`` as one list of references per hypothesis (a plain list = one reference each; a 2-D
    array = one row of references each)."""
    refs = as_list("refs", refs, "strings or of lists of strings", ndim=2)
    if len(refs) != len(hyps):
        raise ValueError(f"hyps and refs must have the same length, got {len(hyps)} and {len(refs)}")
    if all(map(isinstance, refs, itertools.repeat(str))):  # one reference each, checked without a loop
        return [[r] for r in refs]
    groups = []
    for i, group in enumerate(refs):
        group = [group] if isinstance(group, str) else check_texts(f"refs[{i}]", group)
        if not group:
            raise ValueError(f"refs[{i}] is an empty list: every hypothesis needs a reference")
        groups.append(group)
    return groups


def distinct_texts(hyps: list[str], groups: list[list[str]]) -> list[str]:
    """Every distinct text of a call, hypotheses first, in order of appearance."""
    return list(dict.fromkeys(hyps + [r for g in groups for r in g]))
