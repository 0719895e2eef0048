"""The inputs every entry point accepts, checked once: lists of texts (any sequence of ``str``, or a
1-D array of them) and their references (one per hypothesis, or a list each). Errors name the
argument and the index.

A text must be valid Unicode: a Python ``str`` may hold a lone surrogate (``"a\\ud800b"``, e.g. from
a JSON ``"\\ud800"`` escape or ``bytes.decode(errors="surrogateescape")``), which no UTF-8 tokenizer
can encode (a Hugging Face fast tokenizer raises a ``TypeError`` from deep inside). Such a text is a
``ValueError`` naming the argument, the index and the position; it is not replaced silently, because
a replaced text would be scored as a different text than the caller holds."""
from __future__ import annotations

import itertools
from typing import Sequence, Sized

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
    """``texts`` (any sequence of str, or a 1-D array of them) as a list of valid Unicode str, each
    stripped of its leading and trailing whitespace (:func:`stripped`)."""
    texts = as_list(name, texts, "strings")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(t).__name__}")
    check_unicode(name, texts)
    return stripped(texts)


def distinct_stripped(name: str, texts: Sequence[str]) -> list[str]:
    """The distinct texts of ``texts``, each stripped of its outer whitespace first (texts equal up to
    it are one text), in order of first appearance: the corpus that every statistic is fitted on.
    ``name`` names ``texts`` in the error a non-text raises."""
    return list(dict.fromkeys(check_texts(name, texts)))


def stripped(texts: list[str]) -> list[str]:
    """Each text without its leading and trailing whitespace: the text the encoder tokenizes (as
    bert_score does), and the one a call knows it by, so that ``"a b"`` and ``"a b "`` are one
    distinct text (encoded once, counted once in a batch mean). A text with nothing to strip is
    kept as the same object."""
    return [t.strip() for t in texts]


def check_unicode(name: str, texts: list[str]) -> None:
    """Raise a ``ValueError`` naming ``name[i]`` for the first text that is not valid Unicode (see the
    module docs). All texts are encoded as one string first: one C call where they are all valid."""
    try:
        "".join(texts).encode("utf-8")
    except UnicodeEncodeError:
        for i, text in enumerate(texts):
            check_text(f"{name}[{i}]", text)


def check_text(label: str, text: str) -> None:
    """Raise a ``ValueError`` naming ``label`` if ``text`` holds a surrogate code point."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"{label} is not valid Unicode: lone surrogate {text[error.start]!r} at position "
                         f"{error.start}") from None


def check_references(hyps: Sized, refs, names: tuple[str, str] = ("hyps", "refs")) -> list[list[str]]:
    """``refs`` as one list of references per hypothesis (a plain list = one reference each; a 2-D
    array = one row of references each), each reference :func:`stripped`. ``names``: the caller's names
    of the two arguments, for the errors."""
    hyps_name, refs_name = names
    refs = as_list(refs_name, refs, "strings or of lists of strings", ndim=2)
    if len(refs) != len(hyps):
        raise ValueError(f"{hyps_name} and {refs_name} must have the same length, got {len(hyps)} and {len(refs)}")
    if all(map(isinstance, refs, itertools.repeat(str))):  # one reference each, checked without a loop
        check_unicode(refs_name, refs)
        return [[r] for r in stripped(refs)]
    groups = []
    for i, group in enumerate(refs):
        if isinstance(group, str):
            check_text(f"{refs_name}[{i}]", group)
            group = [group.strip()]
        else:
            group = check_texts(f"{refs_name}[{i}]", group)
        if not group:
            raise ValueError(f"{refs_name}[{i}] is an empty list: every hypothesis needs a reference")
        groups.append(group)
    return groups


def distinct_texts(hyps: list[str], groups: list[list[str]]) -> list[str]:
    """Every distinct text of a call, hypotheses first, in order of appearance."""
    return list(dict.fromkeys(hyps + [r for g in groups for r in g]))
