"""A micro-batcher for rewards: concurrent small calls coalesced into one batched call.

Frameworks such as verl (``compute_score`` once per sample, from a thread pool) and OpenRLHF (one
HTTP request, or one ``asyncio.to_thread`` call, per sample) call a reward one sample at a time, which
wastes what makes the encoder fast: a batch. :class:`BatchedReward` puts each call in a queue; one
worker thread takes the first waiting call, keeps collecting calls until ``max_batch_size`` pairs are
gathered or ``max_wait_ms`` milliseconds have passed since that first call, scores all of them in one
:meth:`MoverReward.score <torchmover.reward.MoverReward.score>` call, and hands each caller its own
rewards.

Each call's inputs are validated in the caller's thread before it is queued, so a malformed call
raises there and never reaches a batch. If scoring a batch still fails, every call of the batch is
retried on its own, so that an error reaches only the call that caused it.

A text's reward does not depend on the other texts of its batch (a reward's centering is independent
of the batch, see :mod:`torchmover.reward`), so coalescing changes no reward beyond float32 rounding;
a ``shaping`` function of the reward is applied to the whole batch and must therefore act per sample.
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from concurrent.futures import Future
from typing import NamedTuple, Sequence

from torch import Tensor

from .rewards import MoverReward
from ..scorer.inputs import check_references, check_texts

__all__ = ["BatchedReward"]


class _Request(NamedTuple):
    hyps: list[str]
    refs: list[list[str]]
    future: Future


_STOP = object()  # queued by close(): the worker finishes the calls before it, then exits


class BatchedReward:
    """Collects concurrent calls for up to ``max_wait_ms`` or ``max_batch_size`` pairs, scores them in
    one ``reward.score`` call, and hands each caller its own rewards.

    Args:
        reward: the :class:`~torchmover.reward.MoverReward` (or subclass) whose ``score`` is batched.
        max_batch_size: the most (hypothesis, references) pairs per batched call; a single call with
            more pairs is scored on its own, never split.
        max_wait_ms: how long the worker waits for more calls after the first one of a batch arrived
            (0: take only what is already queued).

    ``score`` blocks and is safe to call from any number of threads; :meth:`submit` returns a
    :class:`concurrent.futures.Future` and :meth:`ascore` awaits the result in an ``asyncio`` loop.
    One worker thread (a daemon) runs from construction until :meth:`close` (or the end of a
    ``with`` block), which scores every call already queued before it returns. A ``BatchedReward``
    pickles as its reward and settings; the copy starts its own worker.

    Example:
        >>> from torchmover import MoverReward, Scorer
        >>> with BatchedReward(MoverReward(Scorer(device="cpu"))) as batched:
        ...     r = batched.score_one("a cat sat", "the cat sat on the mat")  # from many threads
        >>> round(r, 4)
        0.6632
    """

    def __init__(self, reward: MoverReward, *, max_batch_size: int = 256, max_wait_ms: float = 5.0):
        if not isinstance(reward, MoverReward):
            raise TypeError(f"reward must be a torchmover MoverReward, got {type(reward).__name__}")
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be a positive int, got {max_batch_size!r}")
        if isinstance(max_wait_ms, bool) or not isinstance(max_wait_ms, (int, float)) or not 0 <= max_wait_ms < float("inf"):
            raise ValueError(f"max_wait_ms must be a non-negative finite number, got {max_wait_ms!r}")
        self.reward, self.max_batch_size, self.max_wait_ms = reward, max_batch_size, float(max_wait_ms)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._close_lock = threading.Lock()  # makes "not closed, then queued" atomic with close()
        self._batches = self._pairs = 0
        self._worker = threading.Thread(target=self._run, name="torchmover-BatchedReward", daemon=True)
        self._worker.start()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running"
        return (f"BatchedReward({self.reward!r}, max_batch_size={self.max_batch_size}, "
                f"max_wait_ms={self.max_wait_ms}, {state})")

    # --- calls -------------------------------------------------------------------------------------

    def submit(self, hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]]) -> Future:
        """Validate the call now (raising ``TypeError`` / ``ValueError`` here), queue it, and return a
        future of its rewards ``[len(hyps)]`` (as ``reward.score`` would return them)."""
        hyps = check_texts("hyps", hyps)
        groups = check_references(hyps, refs)
        self.reward.centering  # raises here if the reward's centering would depend on the batch
        future: Future = Future()
        if not hyps:
            future.set_result(self.reward.score([], []))
            return future
        with self._close_lock:
            if self._closed:
                raise RuntimeError("this BatchedReward is closed")
            self._queue.put(_Request(hyps, groups, future))
        return future

    def score(self, hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]]) -> Tensor:
        """Rewards ``[len(hyps)]`` of ``hyps`` against ``refs``, as :meth:`MoverReward.score` (blocks
        until the batch holding this call is scored)."""
        return self.submit(hyps, refs).result()

    __call__ = score

    def score_one(self, hyp: str, refs: str | Sequence[str]) -> float:
        """The reward of one hypothesis against its reference(s) (a str or a list of str)."""
        if not isinstance(hyp, str):
            raise TypeError(f"hyp must be a str, got {type(hyp).__name__}")
        return float(self.score([hyp], [refs])[0])

    async def ascore(self, hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]]) -> Tensor:
        """:meth:`score` for ``asyncio`` code: awaits the batch without blocking the event loop."""
        return await asyncio.wrap_future(self.submit(hyps, refs))

    def stats(self) -> dict[str, float]:
        """How many batches were scored, how many pairs, and the mean pairs per batch."""
        batches, pairs = self._batches, self._pairs
        return {"batches": batches, "pairs": pairs, "mean_batch_size": pairs / batches if batches else 0.0}

    # --- lifetime ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Score the calls already queued, then stop the worker; later calls raise ``RuntimeError``.
        Idempotent."""
        with self._close_lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_STOP)
        if self._worker is not threading.current_thread():
            self._worker.join()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "BatchedReward":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict:
        return {"reward": self.reward, "max_batch_size": self.max_batch_size, "max_wait_ms": self.max_wait_ms}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, state["reward"], max_batch_size=state["max_batch_size"],
                            max_wait_ms=state["max_wait_ms"])

    # --- worker ------------------------------------------------------------------------------------

    def _run(self) -> None:
        pending = None  # what ended the previous batch: a call that did not fit, or _STOP
        while True:
            first = pending if pending is not None else self._queue.get()
            pending = None
            if first is _STOP:
                return
            batch, size = [first], len(first.hyps)
            deadline = time.monotonic() + self.max_wait_ms / 1000
            while size < self.max_batch_size:
                try:
                    timeout = deadline - time.monotonic()
                    item = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP or size + len(item.hyps) > self.max_batch_size:
                    pending = item
                    break
                batch.append(item)
                size += len(item.hyps)
            running = [r for r in batch if r.future.set_running_or_notify_cancel()]  # not cancelled
            if running:
                self._score_batch(running)

    def _score_batch(self, batch: list[_Request]) -> None:
        """Score the calls of ``batch`` (futures already running) in one call, or each on its own if
        that fails, and resolve their futures."""
        try:
            rewards = self.reward.score([h for r in batch for h in r.hyps], [g for r in batch for g in r.refs])
            parts = rewards.split([len(r.hyps) for r in batch])
        except BaseException as error:  # find the call that failed: each on its own
            if len(batch) == 1:
                batch[0].future.set_exception(error)
            else:
                for r in batch:
                    self._score_batch([r])
            return
        self._batches += 1
        self._pairs += len(rewards)
        for r, part in zip(batch, parts):
            r.future.set_result(part)
