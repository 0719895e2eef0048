"""TRL adapter: a torchmover reward as a ``reward_funcs`` entry of ``GRPOTrainer`` / ``RLOOTrainer``.

TRL (``trl/trainer/grpo_trainer.py``, ``_calculate_rewards``; the same call since TRL 0.16, and in
``rloo_trainer.py`` since 0.22) calls each reward function once per batch as
``f(prompts=..., completions=..., completion_ids=..., **columns)`` (plus ``trainer_state`` since
0.20, ``log_extra`` / ``log_metric`` in recent versions), with every dataset column except
``prompt`` / ``completion`` repeated for the ``G`` completions of its row, and turns a ``None`` in the
returned list into NaN, which it ignores. It logs the function under its ``__name__``.
"""
from __future__ import annotations

from typing import Sequence

from ..reward.rewards import MoverReward
from ..functional.members import get_member
from ..scorer import Scorer, ScorerConfig
from .parsing import Parser, apply_parser, check_parser, reference_list

__all__ = ["TRLReward", "as_trl_reward", "reward_name"]

# keyword arguments TRL adds to the dataset columns
_TRL_KWARGS = ("completion_ids", "trainer_state", "log_extra", "log_metric", "environments")


class TRLReward:
    """A reward function in TRL's convention: ``f(prompts, completions, **kwargs) -> list[float | None]``,
    one value per completion.

    ``completions`` are strings, or conversations (lists of ``{"role", "content"}`` messages) of which
    the last assistant message's content is scored (text parts joined when the content is a list of
    parts; no assistant message = the empty text, reward 0). ``parse`` (e.g.
    :func:`~torchmover.integrations.parsing.strip_reasoning`) is then applied to each text. The reference
    of each row is ``kwargs[reference_column]``: a str, a list of str (several references, pooled by
    the scorer's ``multi_ref``), or None / an empty list, which gives None (TRL turns it into NaN and
    ignores it). TRL repeats each row for its ``G`` completions; the references are encoded once
    (cache). Prompts and TRL's other keyword arguments (``completion_ids``, ``trainer_state``, ...) are
    ignored. Not an ``nn.Module``, so TRL calls it as a function and not as a reward model.
    """

    def __init__(self, reward: MoverReward, reference_column: str = "reference", name: str | None = None,
                 parse: Parser | None = None):
        if not isinstance(reference_column, str) or not reference_column:
            raise ValueError(f"reference_column must be a non-empty str, got {reference_column!r}")
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"name must be a non-empty str or None, got {name!r}")
        self.reward, self.reference_column, self.parse = reward, reference_column, check_parser(parse)
        self.__name__ = name or reward_name(reward.scorer.config)

    def __repr__(self) -> str:
        parse = "" if self.parse is None else f", parse={getattr(self.parse, '__name__', self.parse)!r}"
        return (f"TRLReward({self.reward!r}, reference_column={self.reference_column!r}, "
                f"name={self.__name__!r}{parse})")

    def __call__(self, prompts=None, completions=None, **kwargs) -> list[float | None]:
        if completions is None:
            raise ValueError(f"{self.__name__}: completions is required")
        if self.reference_column not in kwargs:
            columns = sorted(k for k in kwargs if k not in _TRL_KWARGS)
            raise KeyError(
                f"{self.__name__} reads the references from the dataset column {self.reference_column!r}, "
                f"which is missing; the columns passed are {columns}. Add the column or pass "
                "reference_column=... to as_trl_reward"
            )
        references = kwargs[self.reference_column]
        if len(references) != len(completions):
            raise ValueError(f"{self.__name__}: {len(completions)} completions but {len(references)} "
                             f"values in column {self.reference_column!r}")
        rows = []  # (row, completion text, references) of the rows that have a reference
        for i, (completion, value) in enumerate(zip(completions, references)):
            refs = reference_list(value, f"{self.reference_column}[{i}]")
            if refs is not None:
                text = apply_parser(self.parse, _completion_text(completion, i), f"completions[{i}]")
                rows.append((i, text, refs))
        out: list[float | None] = [None] * len(completions)
        if rows:
            scores = self.reward.score([text for _, text, _ in rows], [refs for _, _, refs in rows])
            for (i, _, _), s in zip(rows, scores.tolist()):
                out[i] = s
        return out


def reward_name(config: ScorerConfig) -> str:
    """``torchmover_<method>[_<direction>]``, the name a reward is logged under by default."""
    return f"torchmover_{config.method}" + (f"_{config.direction}" if get_member(config.method).directed else "")


def _completion_text(completion, i: int) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and all(isinstance(m, dict) for m in completion):
        contents = [m.get("content") for m in completion if m.get("role") == "assistant"]
        content = contents[-1] if contents else ""
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        if isinstance(content, Sequence):  # multimodal parts [{"type": "text", "text": ...}, ...]
            return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise TypeError(f"completions[{i}] must be a str or a list of {{'role', 'content'}} messages, "
                    f"got {type(completion).__name__}")


def as_trl_reward(scorer_or_reward: Scorer | MoverReward, reference_column: str = "reference",
                  name: str | None = None, parse: Parser | None = None) -> TRLReward:
    """A TRL reward function (:class:`TRLReward`) scoring completions against
    ``kwargs[reference_column]`` with a :class:`~torchmover.Scorer` (wrapped in a
    :class:`~torchmover.reward.MoverReward`, whose centering must not depend on the batch: fit it first)
    or with a given reward (its :meth:`~torchmover.reward.MoverReward.score`: TRL computes the group
    advantages itself). ``name`` (default ``torchmover_<method>[_<direction>]``) is the ``__name__`` TRL
    logs under; ``parse(text) -> text`` is applied to each completion before scoring.

    Example:
        >>> from torchmover.integrations.parsing import strip_reasoning
        >>> reward = MoverReward(Scorer(device="cpu"))  # a centering scorer: .fit(train_references) first
        >>> f = as_trl_reward(reward, parse=strip_reasoning)
        >>> f.__name__
        'torchmover_twmd_recall'
        >>> f(prompts=["Summarise: ..."], completions=["<think>hm</think>a cat sat"], reference=[["the cat sat"]])
        [0.9168...]

    Then ``GRPOTrainer(model, reward_funcs=[f], train_dataset=dataset, ...)``, the dataset holding a
    ``reference`` column (``list[str]`` in every row).
    """
    if isinstance(scorer_or_reward, Scorer):
        reward = MoverReward(scorer_or_reward)
    elif isinstance(scorer_or_reward, MoverReward):
        reward = scorer_or_reward
    else:
        raise TypeError(f"scorer_or_reward must be a torchmover.Scorer or MoverReward, "
                        f"got {type(scorer_or_reward).__name__}")
    return TRLReward(reward, reference_column, name, parse)
