"""verl adapter: ``reward.custom_reward_function.path=pkg://torchmover.integrations.verl`` with
``reward.custom_reward_function.name=compute_score``.

verl 0.7 to 0.9 load the function from ``reward.custom_reward_function`` (``path``: a file, or
``pkg://`` and a module; ``name``, default ``compute_score``) in each reward-loop worker
(``verl/experimental/reward_loop/reward_loop.py``, ``RewardLoopWorker`` → ``load_reward_manager`` →
``get_custom_reward_fn``). The reward manager (``naive``, the default, ``dapo``, ``gdpo``,
``rate_limited``) calls it once per sample, with keywords::

    compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs)

from the worker's thread pool (``loop.run_in_executor``), every sample of the worker's share of the
batch at once. ``solution_str`` is the response decoded without special tokens; ``ground_truth`` is
the dataset's ``reward_model.ground_truth`` (after the parquet round trip a str, or a NumPy array of
str); ``extra_info`` gains ``num_turns`` and ``rollout_reward_scores``. The float returned is put at
the response's last valid token. The concurrent per-sample calls go through the process-wide
micro-batcher (:func:`~torchmover.integrations.configured.process_reward`), which turns them back
into batches.

verl fetches ``compute_score`` when a reward-loop worker starts; the reward is built then (module
``__getattr__``), so an unparseable setting or a model that cannot load fails the worker's start,
before the first rollout. Importing this module builds nothing.

Settings: ``TORCHMOVER_*`` environment variables or a config file
(:mod:`torchmover.integrations.config`). This file only uses absolute imports, because verl may
execute it as a standalone file (``path=/path/to/verl.py``).
"""
from __future__ import annotations

from torchmover.integrations.configured import process_reward

__all__ = ["score_sample"]


def score_sample(data_source, solution_str: str, ground_truth, extra_info=None, **kwargs) -> float:
    """The reward of one response ``solution_str`` against its reference(s) (a float, as verl expects);
    what ``compute_score`` is.

    Safe to call from many threads at once: concurrent calls are scored together in one batch. A sample
    without a reference raises a ValueError naming its ``data_source``, or scores ``missing_score`` when
    set. The keywords verl may add (``reward_router_address``, ``reward_model_tokenizer``, the
    ``reward_kwargs``) are ignored.
    """
    shared = process_reward()
    with shared.counting(1):
        if not isinstance(solution_str, str):
            raise TypeError(f"solution_str must be a str, got {type(solution_str).__name__}")
        refs = [shared.references(ground_truth, extra_info, f"the sample of data_source={data_source!r}")]
        pending = shared.pending([str(solution_str)], refs, lambda i: f"the sample of data_source={data_source!r}")
        return shared.score(pending)[0]


def __getattr__(name: str):
    """``compute_score`` (what verl fetches by name): :func:`score_sample`, once the process-wide
    reward is built, so that its errors surface when verl loads the function."""
    if name == "compute_score":
        process_reward()
        return score_sample
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
