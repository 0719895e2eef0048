"""Progress output: one rule for every entry point.

Every function that can show a progress bar takes ``progress``: ``True`` (show it), ``False`` (never)
or ``None`` (the default: :func:`show_progress` decides). ``None`` shows a bar only where someone
watches: standard error is a terminal, and this is rank 0 of a ``torch.distributed`` job (the other
ranks would print the same bar again). :func:`silenced` turns every bar off (the command line's
``--no-progress``), ``transformers``' own (``Loading weights``) included; a model is otherwise loaded
quietly wherever :func:`show_progress` says no (:func:`quiet_loading`).

A call shows one bar, in pairs (:class:`PairProgress`), never one bar per stage nested in another.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import torch.distributed as dist

_silenced = False


@contextlib.contextmanager
def silenced(enabled: bool = True) -> Iterator[None]:
    """Every progress bar of this process off inside the block (when ``enabled``), ``transformers``'
    included: the command line's ``--no-progress``. Restored on exit."""
    global _silenced
    if not enabled or _silenced:
        yield
        return
    from transformers.utils import logging

    was_enabled = logging.is_progress_bar_enabled()
    _silenced = True
    logging.disable_progress_bar()
    try:
        yield
    finally:
        _silenced = False
        if was_enabled:
            logging.enable_progress_bar()


def show_progress(progress: bool | None = None) -> bool:
    """Whether to show a bar: never inside :func:`silenced`; else ``progress`` if given; else (``None``)
    when standard error is a terminal and this process is rank 0 (or not distributed)."""
    if _silenced or progress is False:
        return False
    if progress is True:
        return True
    rank0 = not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
    return rank0 and _is_terminal(sys.stderr)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


@contextlib.contextmanager
def quiet_loading(progress: bool | None = None) -> Iterator[None]:
    """``transformers``' own bars (``Loading weights``) off inside the block unless
    :func:`show_progress` says yes; restored on exit."""
    if show_progress(progress):
        yield
        return
    from transformers.utils import logging

    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled and not _silenced:
            logging.enable_progress_bar()


class PairProgress:
    """The one bar of a scoring call, in pairs, moved by the share of the call's encoder work done.

    The encoder is nearly all of a call's time, so the bar advances as texts are encoded, weighted by
    their tokens: ``total_work`` is the call's encoder work (a call that encodes its texts twice, e.g.
    once for the ``batch`` centering mean, counts them twice), and :meth:`advance` credits it as
    texts are encoded. Pairs per second and the
    time left are then right from the first update, whatever pass the call is in; the bar shows
    ``pairs × work done / total_work``.
    """

    def __init__(self, pairs: int, progress: bool | None = None, desc: str = "scoring"):
        from tqdm.auto import tqdm

        self.pairs, self.total_work, self.work = pairs, 0.0, 0.0
        self.bar = tqdm(total=pairs, desc=desc, unit="pair", disable=not show_progress(progress), dynamic_ncols=True)

    def plan(self, work: float) -> None:
        """Add ``work`` (encoder work to do) to the call's total."""
        self.total_work += work

    def advance(self, work: float) -> None:
        """Credit ``work`` of encoder work done."""
        self.work = min(self.work + work, self.total_work)
        shown = int(self.pairs * self.work / self.total_work) if self.total_work else 0
        if shown > self.bar.n:
            self.bar.update(shown - self.bar.n)

    def close(self) -> None:
        """The bar at its total (the call is done), closed."""
        if self.bar.n < self.pairs:
            self.bar.update(self.pairs - self.bar.n)
        self.bar.close()

    def __enter__(self) -> "PairProgress":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.bar.close()
