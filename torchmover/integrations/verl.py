"""verl adapter: point ``custom_reward_function.path`` at this file.

verl loads the function named by ``custom_reward_function.name`` (default ``compute_score``) from the
file given as ``custom_reward_function.path`` (``verl/trainer/ppo/reward.py``, ``get_custom_reward_fn``;
since verl 0.7 ``pkg://torchmover.integrations.verl`` works too) and calls it

- once per sample with keywords ``compute_score(data_source=..., solution_str=..., ground_truth=...,
  extra_info=...)`` from the ``naive`` and ``dapo`` reward managers
  (``verl/workers/reward_manager/naive.py``, ``dapo.py``), and from an executor thread pool in the
  asynchronous reward loop (``verl/experimental/reward_loop/reward_manager/naive.py``), which may add
  ``reward_router_address`` / ``reward_model_tokenizer``; ``custom_reward_function.reward_kwargs`` are
  merged into every call. It expects a float, or a dict with ``"score"``.
- once per batch from the ``batch`` reward manager (``verl/workers/reward_manager/batch.py``):
  ``compute_score_batch(data_sources=..., solution_strs=..., ground_truths=..., extra_infos=...)``
  expecting one score per sample (set ``custom_reward_function.name=compute_score_batch``).

``solution_str`` is the decoded response (special tokens skipped); ``ground_truth`` is the dataset's
``reward_model.ground_truth``, which after the parquet round trip may be a str, a NumPy ``str_`` or
a NumPy object array of references. Per-sample calls go through the process-wide micro-batcher
(:func:`torchmover.integrations.config.process_reward`), which turns the thread pool's concurrent
calls back into batches. verl's ``prime`` manager runs the function in a *process* pool, where every
process would load its own encoder: use ``naive``, ``dapo`` or ``batch`` instead.

Configuration: environment variables ``TORCHMOVER_*`` or a config file (see
:mod:`torchmover.integrations.config`). This file only uses absolute imports, because verl executes
it as a standalone module.
"""
from __future__ import annotations

from typing import Callable, Sequence

from torchmover.integrations.config import ProcessReward, process_reward
from torchmover.integrations.parsing import reference_list

__all__ = ["compute_score", "compute_score_batch"]


def _references(shared: ProcessReward, ground_truth, extra_info, index: int | None) -> list[str] | None:
    """The sample's references, read from the configured ``reference_field`` (None if absent)."""
    field = shared.config.reference_field
    head, *keys = field.split(".")
    value = ground_truth if head == "ground_truth" else extra_info
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return reference_list(value, field if index is None else f"{field} of sample {index}")


def _no_reference(shared: ProcessReward, data_sources: Sequence, where: Callable[[int], str]) -> Callable[[int], str]:
    """The error message for sample ``i`` without a reference (when no ``missing_score`` is set)."""
    return lambda i: (f"{where(i)} (data_source={data_sources[i]!r}) has no reference in "
                      f"{shared.config.reference_field}: set TORCHMOVER_MISSING_SCORE to give such samples a "
                      "fixed reward, or TORCHMOVER_REFERENCE_FIELD to read the reference elsewhere")


def _check_solutions(solution_strs: Sequence) -> list[str]:
    for i, text in enumerate(solution_strs):
        if not isinstance(text, str):
            raise TypeError(f"solution_str{f's[{i}]' if len(solution_strs) > 1 else ''} must be a str, "
                            f"got {type(text).__name__}")
    return [str(t) for t in solution_strs]  # NumPy str_ -> str


def compute_score(data_source, solution_str: str, ground_truth, extra_info=None, **kwargs) -> float:
    """The reward of one response ``solution_str`` against its reference(s) (a float, as verl expects).

    Safe to call from many threads at once: concurrent calls are scored together in one batch. A sample
    without a reference raises a ValueError, or scores ``TORCHMOVER_MISSING_SCORE`` when set. Other
    keyword arguments verl passes (``reward_router_address``, ``reward_kwargs``) are ignored.
    """
    shared = process_reward()
    texts = _check_solutions([solution_str])
    refs = [_references(shared, ground_truth, extra_info, None)]
    return shared.score(texts, refs, _no_reference(shared, [data_source], lambda i: "this sample"))[0]


def compute_score_batch(data_sources: Sequence, solution_strs: Sequence[str], ground_truths: Sequence,
                        extra_infos: Sequence | None = None, **kwargs) -> list[float]:
    """The rewards of a batch (verl's ``batch`` reward manager): one float per response, in order."""
    shared = process_reward()
    n = len(solution_strs)
    extra_infos = [None] * n if extra_infos is None else extra_infos
    for name, values in (("data_sources", data_sources), ("ground_truths", ground_truths),
                         ("extra_infos", extra_infos)):
        if len(values) != n:
            raise ValueError(f"{name} has {len(values)} values for {n} solution_strs")
    texts = _check_solutions(solution_strs)
    refs = [_references(shared, truth, extra, i)
            for i, (truth, extra) in enumerate(zip(ground_truths, extra_infos))]
    return shared.score(texts, refs, _no_reference(shared, data_sources, lambda i: f"sample {i}"))
