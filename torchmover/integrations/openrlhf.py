"""OpenRLHF adapter: pass this file as ``--reward.remote_url`` (a path ending in ``.py``; print it with
``python -m torchmover.integrations.openrlhf``).

OpenRLHF 0.11 loads the file in each rollout actor (``openrlhf/utils/agent.py``,
``SingleTurnAgentExecutor.__init__``) and calls its ``reward_func(queries, prompts, labels)`` once
per sample through ``asyncio.to_thread``, so from many threads at once. Each ``query`` is the
prompt's tokens (left-truncated to fit ``--data.max_len``) followed by the generated tokens, decoded
with ``skip_special_tokens=False``; ``prompts`` are the prompt strings and ``labels`` the values of
the dataset's ``--data.label_key`` column (``""`` without one). It reads back a dict with
``"rewards"`` (the advantages' input), ``"scores"`` (dynamic filtering's) and ``"extra_logs"``
(logged), tensors with one value per query. Any exception is caught there and logged at INFO, and
the sample goes on without a reward: :mod:`torchmover.integrations.configured` logs every failure at
WARNING with a running count, also returned in ``extra_logs`` as ``torchmover_failures``.

The samples are read and scored exactly as ``torchmover serve`` reads and scores OpenRLHF's HTTP
requests (:class:`~torchmover.integrations.configured.ConfiguredReward`: the same settings, rewards
and ``extra_logs`` keys). OpenRLHF fetches ``reward_func`` right after loading the file; the reward
is built then (module ``__getattr__``), so an unparseable setting, a ``reference_field`` OpenRLHF
cannot serve or a model that cannot load fails the rollout actor's start. Importing this module
builds nothing. This file only uses absolute imports, because OpenRLHF executes it as a standalone
file.
"""
from __future__ import annotations

from typing import Sequence

import torch

from torchmover.integrations.configured import process_reward

__all__ = ["score_queries"]


def score_queries(queries: Sequence[str], prompts: Sequence[str], labels: Sequence, **kwargs) -> dict:
    """``{"rewards": Tensor[B], "scores": Tensor[B], "extra_logs": {<reward name>: Tensor[B],
    "torchmover_failures": Tensor[B]}}`` for ``B`` queries (prompt + response), their prompts and their
    labels (a str, a list of str, or None each); what ``reward_func`` is. Safe to call from many threads
    at once. Other keyword arguments are ignored."""
    shared = process_reward()
    with shared.counting(len(queries)):
        values = shared.score(shared.openrlhf_pending(queries, prompts, labels))
    answer = shared.openrlhf_answer(values)
    rewards = torch.tensor(values, dtype=torch.float32)
    return {"rewards": rewards, "scores": rewards,
            "extra_logs": {key: torch.tensor(v, dtype=torch.float32) for key, v in answer["extra_logs"].items()}}


def __getattr__(name: str):
    """``reward_func`` (what OpenRLHF fetches after loading the file): :func:`score_queries`, once the
    process-wide reward is built and checked, so that its errors surface when OpenRLHF loads the file."""
    if name == "reward_func":
        process_reward().check_labels_only()
        return score_queries
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":  # python -m torchmover.integrations.openrlhf: the path for --reward.remote_url
    print(__file__)
