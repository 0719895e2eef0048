"""One process-wide reward for the verl and OpenRLHF adapters, configured by environment variables
or a config file.

Those frameworks import a *file* and call a plain function in it (verl: ``compute_score``, OpenRLHF:
``reward_func``), so there is no constructor to pass a scorer to. The adapters therefore call
:func:`process_reward`, which builds on its first call (thread-safe: concurrent first calls build it
once) a :class:`~torchmover.reward.MoverReward` behind a
:class:`~torchmover.reward.batching.BatchedReward`, from :class:`RewardConfig` read by
:meth:`RewardConfig.from_env`: the JSON (``.json``) or TOML (``.toml``) file named by
``TORCHMOVER_CONFIG``, whose keys are the field names below, then one ``TORCHMOVER_<FIELD>``
environment variable per field, which overrides the file:

=========================  ===============================================================================
variable / key             meaning (default)
=========================  ===============================================================================
``MODEL`` / model          encoder name or path (the default model, or the preset's)
``PRESET`` / preset        a named preset (:data:`torchmover.PRESETS`), e.g. ``twmd-b``
``SCORER`` / scorer        a directory written by ``Scorer.save_pretrained`` (instead of model / preset)
``OPTIONS`` / options      other ``Scorer`` options, a JSON object, e.g. ``{"direction": "f1"}``
``DEVICE`` / device        where the encoder runs (the scorer's default)
``FIT_REFERENCES``         a text file, one reference per line: ``reward.fit(lines)`` centers every
                           reward on its mean (needed for batch-centered presets such as ``twmd-b``)
``CACHE_SIZE``             references kept in the reward's cache (1024)
``MAX_BATCH_SIZE``         the micro-batcher's largest batch, in pairs (256)
``MAX_WAIT_MS``            how long the micro-batcher waits for more calls (5.0)
``REFERENCE_FIELD``        verl: where a sample's reference is read: ``ground_truth`` (default),
                           ``ground_truth.<key>...`` or ``extra_info.<key>...`` (dict lookups)
``MISSING_SCORE``          the reward of a sample without a reference (unset: raise a ValueError)
``STRIP_REASONING``        ``1`` / ``true``: drop ``<think>…</think>`` traces before scoring; or the two
                           delimiters separated by a space, e.g. ``[R] [/R]`` (TOML / JSON: a pair)
``PARSE``                  ``module:function``, a completion parser applied after ``STRIP_REASONING``
``SPECIAL_TOKENS``         OpenRLHF: the special tokens to remove from ``query`` (space-separated or a
                           JSON list; default: the common chat-template tokens)
``ON_PROMPT_MISMATCH``     OpenRLHF: ``error`` (default) or ``query`` (score the whole query) when the
                           prompt cannot be found at the start of ``query``
=========================  ===============================================================================

Every process builds its own reward (Ray workers are processes); the configuration is read once, on
the first call. :func:`reset_process_reward` closes it so that the next call rebuilds it.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple, Sequence

from ..reward.batching import BatchedReward
from ..reward.rewards import MoverReward
from ..scorer import Scorer
from .parsing import ON_MISMATCH, Parser, apply_parser, strip_reasoning
from .trl import reward_name

__all__ = ["ENV_PREFIX", "ProcessReward", "RewardConfig", "build_parser", "build_reward", "process_reward",
           "reset_process_reward"]

ENV_PREFIX = "TORCHMOVER_"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class RewardConfig:
    """How the process-wide reward is built and how the adapters read what they are given (see the
    module docs for each field)."""

    model: str | None = None
    preset: str | None = None
    scorer: str | None = None
    options: dict = field(default_factory=dict)
    device: str | None = None
    fit_references: str | None = None
    cache_size: int = 1024
    max_batch_size: int = 256
    max_wait_ms: float = 5.0
    reference_field: str = "ground_truth"
    missing_score: float | None = None
    strip_reasoning: tuple[str, str] | None = None
    parse: str | None = None
    special_tokens: tuple[str, ...] | None = None
    on_prompt_mismatch: str = "error"

    def __post_init__(self):
        if self.scorer is not None and (self.model is not None or self.preset is not None):
            raise ValueError("scorer (a saved scorer directory) excludes model and preset: give one or the other")
        if self.scorer is not None and self.options:
            raise ValueError(f"options {sorted(self.options)} do not apply to a saved scorer (scorer={self.scorer!r})")
        if not isinstance(self.options, dict):
            raise TypeError(f"options must be a dict of Scorer options, got {type(self.options).__name__}")
        head = self.reference_field.split(".")[0]
        if head not in ("ground_truth", "extra_info"):
            raise ValueError(f"reference_field must start with 'ground_truth' or 'extra_info', "
                             f"got {self.reference_field!r}")
        if self.on_prompt_mismatch not in ON_MISMATCH:
            raise ValueError(f"on_prompt_mismatch must be one of {ON_MISMATCH}, got {self.on_prompt_mismatch!r}")
        if self.strip_reasoning is not None and len(self.strip_reasoning) != 2:
            raise ValueError(f"strip_reasoning must be an (open, close) pair, got {self.strip_reasoning!r}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, object], source: str = "config") -> "RewardConfig":
        """A config from a mapping of field names to values (strings are parsed as in environment
        variables); an unknown key raises a ValueError naming ``source``."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} in {source}; known: {sorted(fields)}")
        return cls(**{name: _parse_value(name, value, source) for name, value in values.items()})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "RewardConfig":
        """The file named by ``TORCHMOVER_CONFIG`` (JSON or TOML), then ``TORCHMOVER_<FIELD>`` variables."""
        environ = os.environ if environ is None else environ
        values: dict[str, object] = {}
        path = environ.get(ENV_PREFIX + "CONFIG")
        if path:
            values.update(_read_file(path))
        names = [f.name for f in dataclasses.fields(cls)]
        values.update({name: environ[ENV_PREFIX + name.upper()] for name in names
                       if ENV_PREFIX + name.upper() in environ})
        return cls.from_mapping(values, f"{ENV_PREFIX}CONFIG={path}" if path else "the environment")


def _read_file(path: str) -> dict:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{ENV_PREFIX}CONFIG names {path!r}, which is not a file")
    if path.endswith(".toml"):
        import tomllib

        with open(path, "rb") as f:
            values = tomllib.load(f)
    elif path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
    else:
        raise ValueError(f"{ENV_PREFIX}CONFIG={path!r}: use a .json or .toml file")
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold an object of settings, got {type(values).__name__}")
    return values


def _parse_value(name: str, value, source: str):
    """A field's value from a file value or an environment string (converted by the field's type)."""
    where = f"{name} (from {source})"
    if name in ("cache_size", "max_batch_size"):
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where} must be an int, got {value!r}") from None
    if name in ("max_wait_ms", "missing_score"):
        if name == "missing_score" and value in (None, ""):
            return None
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where} must be a number, got {value!r}") from None
    if name == "options" and isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where} must be a JSON object of Scorer options: {e}") from None
    if name == "strip_reasoning":
        if isinstance(value, bool) or (isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE):
            on = value if isinstance(value, bool) else value.strip().lower() in _TRUE
            return ("<think>", "</think>") if on else None
        pair = value.split() if isinstance(value, str) else value
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(isinstance(d, str) for d in pair):
            raise ValueError(f"{where} must be true/false or two delimiters (open close), got {value!r}")
        return tuple(pair)
    if name == "special_tokens":
        if isinstance(value, str):
            value = json.loads(value) if value.lstrip().startswith("[") else value.split()
        if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
            raise ValueError(f"{where} must be a list of strings, got {value!r}")
        return tuple(value)
    if value is not None and name != "options" and not isinstance(value, str):
        raise ValueError(f"{where} must be a string, got {value!r}")
    return value


def _import(spec: str):
    """The object named ``module:attribute``."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"parse must be 'module:function', got {spec!r}")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def build_parser(config: RewardConfig) -> Parser | None:
    """The completion parser of ``config``: reasoning traces stripped, then the ``parse`` function."""
    custom = _import(config.parse) if config.parse else None
    if custom is not None and not callable(custom):
        raise TypeError(f"parse={config.parse!r} is not callable")
    delimiters = config.strip_reasoning
    if delimiters is None:
        return custom

    def parse(text: str) -> str:
        text = strip_reasoning(text, *delimiters)
        return text if custom is None else custom(text)

    return parse


def build_reward(config: RewardConfig) -> MoverReward:
    """The :class:`~torchmover.reward.MoverReward` that ``config`` describes (fitted on
    ``fit_references`` if set)."""
    if config.scorer is not None:
        scorer = Scorer.from_pretrained(config.scorer)
    elif config.preset is not None:
        scorer = Scorer.from_preset(config.preset, **({"model": config.model} if config.model else {}),
                                    **config.options)
    elif config.model is not None:
        scorer = Scorer(config.model, **config.options)
    else:
        scorer = Scorer(**config.options)
    if config.device is not None:
        scorer.to(config.device)
    reward = MoverReward(scorer, cache_size=config.cache_size)
    if config.fit_references is not None:
        with open(config.fit_references, encoding="utf-8") as f:
            reward.fit([line.rstrip("\n") for line in f if line.strip()])
    reward.centering  # a batch-centered scorer without fit: the error now, not at the first sample
    return reward


class ProcessReward(NamedTuple):
    """The process-wide reward: its config, the micro-batched reward and the completion parser."""

    config: RewardConfig
    batched: BatchedReward
    parse: Parser | None
    name: str

    def score(self, texts: Sequence[str], refs: Sequence[list[str] | None],
              no_reference: Callable[[int], str]) -> list[float]:
        """Rewards of ``texts[i]`` (parsed by ``parse`` first) against ``refs[i]``, in one micro-batched
        call. A row whose ``refs[i]`` is None scores ``config.missing_score``; without one it raises a
        ValueError with the message ``no_reference(i)``."""
        out = [self._missing(i, no_reference) if r is None else 0.0 for i, r in enumerate(refs)]
        rows = [i for i, r in enumerate(refs) if r is not None]
        if rows:
            parsed = [apply_parser(self.parse, texts[i], f"completion {i}") for i in rows]
            for i, score in zip(rows, self.batched.score(parsed, [refs[i] for i in rows]).tolist()):
                out[i] = score
        return out

    def _missing(self, i: int, no_reference: Callable[[int], str]) -> float:
        if self.config.missing_score is None:
            raise ValueError(no_reference(i))
        return self.config.missing_score


_lock = threading.Lock()
_process_reward: ProcessReward | None = None


def process_reward() -> ProcessReward:
    """The process-wide reward, built from :meth:`RewardConfig.from_env` on the first call (once,
    whatever the number of threads calling at the same time)."""
    global _process_reward
    current = _process_reward
    if current is not None:
        return current
    with _lock:
        if _process_reward is None:
            config = RewardConfig.from_env()
            reward = build_reward(config)
            batched = BatchedReward(reward, max_batch_size=config.max_batch_size, max_wait_ms=config.max_wait_ms)
            _process_reward = ProcessReward(config, batched, build_parser(config), reward_name(reward.scorer.config))
        return _process_reward


def reset_process_reward() -> None:
    """Close the process-wide reward (its queued calls are scored first); the next call rebuilds it."""
    global _process_reward
    with _lock:
        if _process_reward is not None:
            _process_reward.batched.close()
            _process_reward = None
