"""OpenRLHF adapter: pass this file as ``--remote_rm_url`` (a path ending in ``.py``).

OpenRLHF executes the file and calls its ``reward_func(queries, prompts, labels)``
(``openrlhf/utils/agent.py``, ``SingleTurnAgentExecutor``): in current versions one sample at a time
through ``asyncio.to_thread`` (so from many threads at once), in older ones
(``openrlhf/utils/remote_rm_utils.py``) once per micro-batch as a Ray task. Each ``query`` is the
prompt's tokens (left-truncated to ``max_prompt_length``) followed by the generated tokens, decoded
with ``skip_special_tokens=False``; ``prompts`` are the prompt strings and ``labels`` the dataset's
``--label_key`` values. It reads back a dict with ``"rewards"`` (used for the advantages), ``"scores"``
(used by dynamic filtering; ``"rewards"`` when absent) and ``"extra_logs"`` (logged), tensors with one
value per query, as in OpenRLHF's ``examples/python/reward_func.py``.

The response is cut out of the query by :func:`~torchmover.integrations.parsing.response_from_query`
(``TORCHMOVER_SPECIAL_TOKENS``, ``TORCHMOVER_ON_PROMPT_MISMATCH``), then parsed
(``TORCHMOVER_STRIP_REASONING``, ``TORCHMOVER_PARSE``) and scored by the process-wide micro-batched
reward (:mod:`torchmover.integrations.config`), so the per-sample calls are scored in batches.
A sample whose label is missing raises a ValueError, or scores ``TORCHMOVER_MISSING_SCORE`` when set.
The HTTP form of ``--remote_rm_url`` is served by ``torchmover serve``. This file only uses absolute
imports, because OpenRLHF executes it as a standalone module.
"""
from __future__ import annotations

from typing import Sequence

import torch

from torchmover.integrations.config import process_reward
from torchmover.integrations.parsing import reference_list, response_from_query

__all__ = ["reward_func", "response_from_query"]


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence, **kwargs) -> dict:
    """``{"rewards": Tensor[B], "scores": Tensor[B], "extra_logs": {<reward name>: Tensor[B]}}`` for
    ``B`` queries (prompt + response), their prompts and their labels (a str, a list of str, or None
    each). Safe to call from many threads at once. Other keyword arguments are ignored."""
    shared = process_reward()
    config = shared.config
    n = len(queries)
    for name, values in (("prompts", prompts), ("labels", labels)):
        if len(values) != n:
            raise ValueError(f"{name} has {len(values)} values for {n} queries")
    responses = [response_from_query(query, prompt, special_tokens=config.special_tokens,
                                     on_mismatch=config.on_prompt_mismatch)
                 for query, prompt in zip(queries, prompts)]
    refs = [reference_list(label, f"labels[{i}]") for i, label in enumerate(labels)]

    def no_reference(i: int) -> str:
        return (f"labels[{i}] is {labels[i]!r}: no reference to score against. Set "
                "TORCHMOVER_MISSING_SCORE to give such samples a fixed reward")

    values = torch.tensor(shared.score(responses, refs, no_reference), dtype=torch.float32)
    return {"rewards": values, "scores": values, "extra_logs": {shared.name: values}}
