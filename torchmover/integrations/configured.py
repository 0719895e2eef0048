"""A reward with its settings applied: what the verl and OpenRLHF adapter files and ``torchmover serve``
all call, so that the same samples get the same rewards whatever the transport.

:class:`ConfiguredReward` joins a :class:`~torchmover.reward.batching.BatchedReward` and a
:class:`~torchmover.integrations.config.RewardConfig`. It reads a sample the way the settings say
(the reference field, the completion parser, OpenRLHF's query cut at its prompt), gives a sample
without a reference the configured ``missing_score`` (or raises), scores the rest in one
micro-batched call, and counts the calls that fail.

Failures are loud. OpenRLHF catches any exception of a reward function (or any failed request), logs
it at INFO and goes on with no reward; so every failed call is also logged here at WARNING on the
``torchmover`` logger with the running count of failed samples, and every answer carries that count
in its ``extra_logs`` (``torchmover_failures``), which OpenRLHF logs with the rewards. With
``missing_score`` set, a process whose first call has no reference in any sample raises anyway: a
wrong ``reference_field`` or a missing ``--data.label_key`` would otherwise train on a constant reward.

The adapter files share one :func:`process_reward` per process (Ray workers are processes), built on
first use from :meth:`RewardConfig.from_env <torchmover.integrations.config.RewardConfig.from_env>`
(its signature logged at INFO on the ``torchmover`` logger); :func:`reset_process_reward` closes it so
that the next use rebuilds it.

Signature. What a sample is scored as depends on settings beyond the scorer's, so a configured reward
has a signature of its own (:attr:`ConfiguredReward.signature`, which ``torchmover serve`` prints and
``GET /health`` returns): the reward's scores' (:attr:`MoverReward.scored_signature
<torchmover.reward.MoverReward.scored_signature>`: the scorer's, with the centering the reward uses), followed
by one field per such setting, always all of them, in this order (:data:`REWARD_FIELDS`):

- ``reffield``: ``reference_field``;
- ``strip``: ``none``, or ``strip_reasoning``'s two delimiters as a JSON list (``["<think>","</think>"]``);
- ``parse``: ``none``, or the ``parse`` setting (``module:function``: the function is named, its code is not
  pinned);
- ``missing``: ``error``, or ``missing_score`` (Python's ``repr`` of the float);
- ``qtokens``: ``default`` (:data:`~torchmover.integrations.parsing.DEFAULT_SPECIAL_TOKENS` and the chat
  templates' patterns), or ``query_special_tokens`` as a JSON list;
- ``mismatch``: ``on_prompt_mismatch``;
- ``shaping``: ``none``, or the ``module:qualified name`` of the reward's ``shaping`` function (named only).

A ``|`` in a value is written ``\\u007c`` (in the JSON lists, JSON's own escape).
:func:`split_reward_signature` parts the scorer's signature (for ``Scorer.from_signature``) from these
fields.
"""
from __future__ import annotations

import json
import logging
import threading
from contextlib import contextmanager
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

from ..reward.batching import BatchedReward
from ..reward.rewards import shaping_name
from .config import RewardConfig, build_parser, build_reward, setting_names
from .parsing import apply_parser, reference_list, response_from_query
from .trl import reward_name

__all__ = ["FAILURES_LOG", "REWARD_FIELDS", "ConfiguredReward", "Pending", "Refused", "process_reward",
           "reset_process_reward", "reward_signature", "split_reward_signature"]

FAILURES_LOG = "torchmover_failures"  # the extra_logs key of the running count of failed samples
# The fields a configured reward's signature adds to its scorer's, in order (see the module docs)
REWARD_FIELDS = ("reffield", "strip", "parse", "missing", "qtokens", "mismatch", "shaping")
_BAR = "\\u007c"  # how a | is written in a reward field's value (JSON's escape of it)

logger = logging.getLogger("torchmover")


def reward_signature(scorer_signature: str, config: RewardConfig, shaping: Callable | None = None) -> str:
    """``scorer_signature`` followed by the :data:`REWARD_FIELDS` of ``config`` and ``shaping`` (see the
    module docs)."""
    values = {"reffield": config.reference_field,
              "strip": "none" if config.strip_reasoning is None else _text_list(config.strip_reasoning),
              "parse": config.parse or "none",
              "missing": "error" if config.missing_score is None else repr(float(config.missing_score)),
              "qtokens": "default" if config.query_special_tokens is None else _text_list(config.query_special_tokens),
              "mismatch": config.on_prompt_mismatch,
              "shaping": "none" if shaping is None else shaping_name(shaping)}
    return "|".join([scorer_signature, *(f"{key}:{value.replace('|', _BAR)}" for key, value in values.items())])


def _text_list(texts: Iterable[str]) -> str:
    """``texts`` as a compact JSON list (which ``json.loads`` reads back, escaped ``|`` included)."""
    return json.dumps(list(texts), separators=(",", ":"))


def split_reward_signature(signature: str) -> tuple[str, dict[str, str]]:
    """``(scorer's signature, {field: value})`` of a configured reward's :attr:`~ConfiguredReward.signature`:
    the scorer's part (for ``Scorer.from_signature``) and the values of its :data:`REWARD_FIELDS`, as
    written (see the module docs). A signature that does not end with those fields, in their order,
    raises a ValueError."""
    parts = signature.split("|")
    scorer_parts, fields = parts[:-len(REWARD_FIELDS)], [p.partition(":") for p in parts[-len(REWARD_FIELDS):]]
    if len(scorer_parts) < 2 or [(key, sep) for key, sep, _ in fields] != [(key, ":") for key in REWARD_FIELDS]:
        raise ValueError(f"not a configured reward's signature (it must end with the fields {REWARD_FIELDS}): "
                         f"{signature!r}")
    return "|".join(scorer_parts), {key: value for key, _, value in fields}


class Refused(ValueError):
    """A call refused before any of its samples was scored (e.g. over a server limit): raised through
    :meth:`ConfiguredReward.counting`, its samples are neither seen nor failed."""


class Pending(NamedTuple):
    """Samples read and ready to score: ``values[i]`` is the fixed reward of a sample without a
    reference, None for one to score; ``texts`` / ``refs`` are those to score, in order."""

    values: list[float | None]
    texts: list[str]
    refs: list[list[str]]

    def fill(self, scores: Sequence[float]) -> list[float]:
        """Every sample's reward, ``scores`` (of ``texts``, in order) in the places left None."""
        scored = iter(scores)
        return [next(scored) if v is None else v for v in self.values]


class ConfiguredReward:
    """A micro-batched reward that reads samples as ``config`` says (see the module docs).

    Thread-safe: the adapters call it from many threads at once, the server from its event loop.
    """

    def __init__(self, batched: BatchedReward, config: RewardConfig):
        if not isinstance(batched, BatchedReward):
            raise TypeError(f"batched must be a torchmover BatchedReward, got {type(batched).__name__}")
        if not isinstance(config, RewardConfig):
            raise TypeError(f"config must be a RewardConfig, got {type(config).__name__}")
        self.batched, self.config = batched, config
        self.parse = build_parser(config)
        self.name = reward_name(batched.reward.scorer.config)
        self._lock = threading.Lock()
        self._samples = self._failures = 0
        self._seen_reference = False

    @classmethod
    def build(cls, config: RewardConfig) -> "ConfiguredReward":
        """The reward ``config`` describes (:func:`~torchmover.integrations.config.build_reward`),
        behind a micro-batcher of its ``max_batch_size`` / ``max_wait_ms``."""
        batched = BatchedReward(build_reward(config), max_batch_size=config.max_batch_size,
                                max_wait_ms=config.max_wait_ms)
        return cls(batched, config)

    def __repr__(self) -> str:
        return f"ConfiguredReward({self.name!r}, {self.config!r})"

    @property
    def signature(self) -> str:
        """What pins this reward's values: its reward's :attr:`~torchmover.reward.MoverReward.scored_signature`
        (the scorer's, with the centering the reward uses) followed by the fields of the settings that
        change what a sample is scored as (:func:`reward_signature`; see the module docs)."""
        reward = self.batched.reward
        return reward_signature(reward.scored_signature, self.config, reward.shaping)

    # --- reading samples ---------------------------------------------------------------------------

    def references(self, ground_truth, extra_info=None, where: str = "the sample") -> list[str] | None:
        """A sample's references, read from ``reference_field`` in ``ground_truth`` (verl's
        ``reward_model.ground_truth``, OpenRLHF's label) or ``extra_info`` (verl's); None if absent."""
        head, *keys = self.config.reference_field.split(".")
        value = ground_truth if head == "ground_truth" else extra_info
        for key in keys:
            if not isinstance(value, Mapping) or key not in value:
                return None
            value = value[key]
        return reference_list(value, f"{self.config.reference_field} of {where}")

    def check_labels_only(self) -> None:
        """OpenRLHF and the server hand over a label and no ``extra_info``: a ValueError if
        ``reference_field`` reads ``extra_info``."""
        if self.config.reference_field.split(".")[0] != "ground_truth":
            raise ValueError(f"{setting_names('reference_field')}={self.config.reference_field!r} reads verl's "
                             "extra_info; OpenRLHF and the server pass only the label: use ground_truth[.KEY...]")

    def pending(self, texts: Sequence[str], refs: Sequence[list[str] | None],
                no_reference: Callable[[int], str]) -> Pending:
        """``texts`` parsed and ready to score against ``refs``; a sample whose ``refs[i]`` is None gets
        ``missing_score``, or raises a ValueError naming it by ``no_reference(i)``. The first call of the
        instance with a reference nowhere raises even with ``missing_score`` (see the module docs)."""
        missing = [i for i, r in enumerate(refs) if r is None]
        if missing and self.config.missing_score is None:
            raise ValueError(f"{no_reference(missing[0])}: no reference to score against; set "
                             f"{setting_names('missing_score')} to give such samples a fixed reward, or "
                             f"{setting_names('reference_field')} to read the references elsewhere")
        if refs and len(missing) == len(refs) and not self._seen_reference:
            raise ValueError(f"the first call of this process has no reference in any of its {len(refs)} "
                             f"sample(s) ({no_reference(0)}), so {setting_names('reference_field')} (or OpenRLHF's "
                             "--data.label_key) is probably wrong; missing_score applies only once a call "
                             "has had references")
        self._seen_reference = self._seen_reference or len(missing) < len(refs)
        values: list[float | None] = [None] * len(refs)
        todo_texts, todo_refs = [], []
        for i, (text, ref) in enumerate(zip(texts, refs)):
            if ref is None:
                values[i] = self.config.missing_score
            else:
                todo_texts.append(apply_parser(self.parse, text, f"completion {i}"))
                todo_refs.append(ref)
        return Pending(values, todo_texts, todo_refs)

    def check_openrlhf(self, queries: Sequence[str], prompts: Sequence[str], labels: Sequence) -> None:
        """The checks of OpenRLHF's call as a whole, before any of its samples is read: a ValueError if
        the three lengths differ (or ``reference_field`` reads ``extra_info``), a TypeError if a query
        or a prompt is not a str. The server refuses such a request without counting failed samples."""
        self.check_labels_only()
        n = len(queries)
        for name, values in (("prompts", prompts), ("labels", labels)):
            if len(values) != n:
                raise ValueError(f"{name} has {len(values)} values for {n} queries")
        for i, (query, prompt) in enumerate(zip(queries, prompts)):
            if not isinstance(query, str) or not isinstance(prompt, str):
                raise TypeError(f"queries[{i}] and prompts[{i}] must be strings, got "
                                f"{type(query).__name__} and {type(prompt).__name__}")

    def openrlhf_pending(self, queries: Sequence[str], prompts: Sequence[str], labels: Sequence) -> Pending:
        """OpenRLHF's ``(queries, prompts, labels)``, checked by :meth:`check_openrlhf`: each response cut
        out of its query (:func:`~torchmover.integrations.parsing.response_from_query` with
        ``query_special_tokens`` and ``on_prompt_mismatch``), its references read from its label."""
        self.check_openrlhf(queries, prompts, labels)
        responses = [response_from_query(query, prompt, special_tokens=self.config.query_special_tokens,
                                         on_mismatch=self.config.on_prompt_mismatch)
                     for query, prompt in zip(queries, prompts)]
        refs = [self.references(label, None, f"labels[{i}]") for i, label in enumerate(labels)]
        return self.pending(responses, refs, lambda i: f"labels[{i}] is {labels[i]!r}")

    # --- scoring -----------------------------------------------------------------------------------

    def score(self, pending: Pending) -> list[float]:
        """Every sample's reward (blocks until the batch holding these samples is scored)."""
        return pending.fill(self.batched.score(pending.texts, pending.refs).tolist() if pending.texts else [])

    async def ascore(self, pending: Pending) -> list[float]:
        """:meth:`score` for ``asyncio`` code."""
        return pending.fill((await self.batched.ascore(pending.texts, pending.refs)).tolist() if pending.texts else [])

    def openrlhf_answer(self, values: list[float]) -> dict:
        """OpenRLHF's reward dict (lists): ``rewards``, ``scores`` (the same) and ``extra_logs`` (the
        rewards under the reward's name, and the running count of failed samples)."""
        return {"rewards": values, "scores": values,
                "extra_logs": {self.name: values, FAILURES_LOG: [float(self.failures)] * len(values)}}

    # --- failures ----------------------------------------------------------------------------------

    @property
    def failures(self) -> int:
        """How many samples failed so far (their call raised)."""
        return self._failures

    @contextmanager
    def counting(self, n: int):
        """Counts ``n`` samples; if the block raises, counts them as failed and logs a WARNING with the
        running count before the exception goes on (a :class:`Refused` call counts nothing)."""
        try:
            yield
        except Refused:
            raise
        except Exception as error:
            with self._lock:
                self._samples += n
                self._failures += n
                failed, total = self._failures, self._samples
            logger.warning("torchmover reward: %d sample(s) failed (%d of %d so far in this process): %s: %s",
                           n, failed, total, type(error).__name__, error)
            raise
        with self._lock:
            self._samples += n

    def stats(self) -> dict[str, int]:
        """Samples seen and failed so far."""
        return {"samples": self._samples, "failures": self._failures}


_lock = threading.Lock()
_process_reward: ConfiguredReward | None = None


def process_reward() -> ConfiguredReward:
    """The process-wide reward of the adapter files, built from
    :meth:`RewardConfig.from_env <torchmover.integrations.config.RewardConfig.from_env>` on the first
    call (once, whatever the number of threads calling at the same time)."""
    global _process_reward
    current = _process_reward
    if current is not None:
        return current
    with _lock:
        if _process_reward is None:
            _process_reward = ConfiguredReward.build(RewardConfig.from_env())
            logger.info("torchmover reward: built, signature %s", _process_reward.signature)
        return _process_reward


def reset_process_reward() -> None:
    """Close the process-wide reward (its queued calls are scored first); the next call rebuilds it."""
    global _process_reward
    with _lock:
        if _process_reward is not None:
            _process_reward.batched.close()
            _process_reward = None
