"""The reward settings shared by every transport: the verl and OpenRLHF adapter files and
``torchmover serve`` read the same :class:`RewardConfig`, from the same sources.

Those frameworks import a *file* and call a plain function in it (verl: ``compute_score``, OpenRLHF:
``reward_func``), so there is no constructor to pass a scorer to; ``torchmover serve`` is started by
a command. All three therefore read their settings from, in increasing precedence:

1. the JSON (``.json``) or TOML (``.toml``) file named by ``TORCHMOVER_CONFIG``, whose keys are the
   field names below;
2. one ``TORCHMOVER_<FIELD>`` environment variable per field (any other ``TORCHMOVER_*`` variable is
   an error: a misspelt setting must not be ignored);
3. for ``torchmover serve`` only, one ``--<field-name>`` flag per field (the scorer's own flags,
   ``--model``, ``--preset``, ``--device``, ``--layer``, ... fill ``model``, ``preset``, ``device``
   and ``options``).

A value given as a string (a variable, a flag) is read the same way whatever its source; ``options``
are merged key by key across the sources, every other field is replaced. The fields, with the
variable and the flag of each, are listed by :func:`settings_table` (the user guide prints it).
An unknown key, an unparseable value (a bool or a fraction in a file where a number or an int is due),
a value out of range (a size below 1, a number that is not finite) or contradictory fields raise a
``ValueError`` naming the setting, and where it came from if it could not be read, when the settings
are read: before any model is loaded or sample scored. A ``parse`` function that cannot be imported and
Scorer options that the scorer refuses raise a ``ValueError`` naming the setting and where it was read
when the reward is built (:func:`build_parser`, :func:`build_reward`), before any sample is scored.
"""
from __future__ import annotations

import codecs
import dataclasses
import importlib
import io
import json
import math
import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Mapping, cast

from ..evaluation.corpus import read_lines
from ..evaluation.scoring import fit_to_call
from ..functional.centering import Centering
from ..reward.rewards import MoverReward
from ..scorer import Scorer
from .parsing import ON_MISMATCH, Parser, strip_reasoning
from ..runtime.devices import resolve_device

__all__ = ["ENV_PREFIX", "RewardConfig", "build_parser", "build_reward", "setting_names", "settings_table"]

ENV_PREFIX = "TORCHMOVER_"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def _setting(default, help: str, **extra):
    """A field of :class:`RewardConfig` with its help text (a callable default is a factory)."""
    metadata = {"help": help, **extra}
    return field(default_factory=default, metadata=metadata) if callable(default) else field(default=default, metadata=metadata)


@dataclass(frozen=True)
class RewardConfig:
    """How the reward is built and how a framework's sample becomes the text and references it
    scores. Every field is a setting: ``TORCHMOVER_<FIELD>``, the key ``<field>`` of the config file,
    and ``torchmover serve --<field-name>``."""

    model: str | None = _setting(None, "encoder name or path (default: the default model, or the preset's)")
    preset: str | None = _setting(None, "a named preset (torchmover.PRESETS), e.g. twmd-b")
    scorer: str | None = _setting(None, "a directory written by Scorer.save_pretrained (instead of model / preset)")
    options: dict = _setting(dict, 'other Scorer options, a JSON object, e.g. {"direction": "f1"}')
    device: str | None = _setting(None, "where the encoder runs, e.g. cuda:1 (default: the scorer's)")
    fit_references: str | None = _setting(
        None, "a text file, one reference per line, on which the statistics the scorer's options ask for are "
              "fitted (a fixed centering mean, IDF, the rescaling baseline); required by batch-centered scorers, "
              "whose reward is centered on their mean")
    cache_size: int = _setting(1024, "references kept encoded on the device")
    max_batch_size: int = _setting(256, "the most (completion, references) pairs scored in one batch")
    max_wait_ms: float = _setting(5.0, "how long a batch waits for more concurrent calls, in ms")
    reference_field: str = _setting(
        "ground_truth", "where a sample's references are read: ground_truth (verl: reward_model.ground_truth; "
                        "OpenRLHF and the server: the label), ground_truth.KEY... (keys into a dict), or, in "
                        "verl only, extra_info.KEY...")
    missing_score: float | None = _setting(
        None, "the reward of a sample without a reference (default: such a sample is an error)")
    strip_reasoning: tuple[str, str] | None = _setting(
        None, "true: drop <think>...</think> traces before scoring; or the two delimiters, space-separated, "
              "e.g. '[R] [/R]' (a pair in a file)", flag_const="true")
    parse: str | None = _setting(None, "module:function, a completion parser applied after strip_reasoning")
    query_special_tokens: tuple[str, ...] | None = _setting(
        None, "OpenRLHF and the server: the special tokens cut from the query, space-separated or a JSON list "
              "(default: the common chat-template tokens)")
    on_prompt_mismatch: str = _setting(
        "error", "OpenRLHF and the server: what a query that does not start with its prompt gets: error, "
                 "or query (score the whole query)")

    # where each setting was read (see origin): not a field; from_env and from_mapping give the instance its own
    _sources: ClassVar[Mapping[str, str]] = MappingProxyType({})

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
        for name in ("cache_size", "max_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{setting_names(name)} must be a positive int, got {getattr(self, name)}")
        if not 0 <= self.max_wait_ms < math.inf:
            raise ValueError(f"{setting_names('max_wait_ms')} must be a finite number >= 0, got {self.max_wait_ms}")
        if self.missing_score is not None and not math.isfinite(self.missing_score):
            raise ValueError(f"{setting_names('missing_score')} must be a finite number (a reward is never NaN or "
                             f"infinite), got {self.missing_score}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, object], source: str = "config") -> "RewardConfig":
        """A config from a mapping of field names to values (strings are read as environment variables
        are); an unknown key raises a ValueError naming ``source``."""
        return cls(**_parse_values(values, source))._read_from({name: source for name in values})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None,
                 flags: Mapping[str, object] | None = None) -> "RewardConfig":
        """The file named by ``TORCHMOVER_CONFIG`` (JSON or TOML), then the ``TORCHMOVER_<FIELD>``
        variables, then ``flags`` (``torchmover serve``'s, by field name), each over the one before."""
        environ = os.environ if environ is None else environ
        path = environ.get(ENV_PREFIX + "CONFIG")
        layers = []
        if path:
            source = f"{ENV_PREFIX}CONFIG={path}"
            layers.append((source, _parse_values(_read_file(path), source)))
        variables = {name: environ[var] for name, var in _variables().items() if var in environ}
        unknown = sorted(var for var in environ if var.startswith(ENV_PREFIX) and var != ENV_PREFIX + "CONFIG"
                         and var not in _variables().values())
        if unknown:
            raise ValueError(f"unknown variable(s) {unknown}; the settings are "
                             f"{sorted(_variables().values())} and {ENV_PREFIX}CONFIG")
        for source, values in (("the environment", variables), ("the command line", flags or {})):
            layers.append((source, _parse_values(values, source)))
        merged: dict[str, Any] = {}
        read_from: dict[str, str] = {}  # options: every source that gave some
        for source, layer in layers:
            options = {**merged.get("options", {}), **layer.get("options", {})}
            merged.update(layer)
            if options:
                merged["options"] = options
            for name in layer:
                earlier = read_from.get(name) if name == "options" else None
                read_from[name] = f"{earlier} and {source}" if earlier else source
        return cls(**merged)._read_from(read_from)

    def _read_from(self, sources: dict[str, str]) -> "RewardConfig":
        """This config, recording where each of its settings was read (for :meth:`origin`)."""
        object.__setattr__(self, "_sources", dict(sources))
        return self

    def origin(self, name: str) -> str:
        """The setting ``name`` for an error message: its variable and flag (:func:`setting_names`), and
        where its value was read when the config was read by :meth:`from_env` or :meth:`from_mapping`."""
        return setting_names(name, self._sources.get(name))


def _variables() -> dict[str, str]:
    """``{field name: environment variable}``."""
    return {f.name: ENV_PREFIX + f.name.upper() for f in dataclasses.fields(RewardConfig)}


def setting_names(name: str, source: str | None = None) -> str:
    """How a setting is given everywhere, for error messages: ``name (TORCHMOVER_NAME, --name)``, or
    ``name (TORCHMOVER_NAME, --name; read from SOURCE)`` with the ``source`` its value came from."""
    read = f"; read from {source}" if source else ""
    return f"{name} ({ENV_PREFIX}{name.upper()}, --{name.replace('_', '-')}{read})"


def settings_table() -> list[tuple[str, str, str, str, str]]:
    """``(config key, environment variable, serve flag, default, meaning)`` of every setting."""
    rows = []
    for f in dataclasses.fields(RewardConfig):
        # a field without a default has a default_factory (every setting has a default)
        default = cast(Callable[[], Any], f.default_factory)() if f.default is dataclasses.MISSING else f.default
        rows.append((f.name, ENV_PREFIX + f.name.upper(), "--" + f.name.replace("_", "-"),
                     "" if default is None else json.dumps(default), f.metadata["help"]))
    return rows


def _read_file(path: str) -> dict:
    """The settings of the ``TORCHMOVER_CONFIG`` file ``path``: JSON or TOML by its suffix, UTF-8 (a
    byte-order mark that starts it, as some Windows editors write, is dropped). A file that does not
    parse is a ``ValueError`` naming the variable, the file and the parser's message."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{ENV_PREFIX}CONFIG names {path!r}, which is not a file")
    if not path.endswith((".json", ".toml")):
        raise ValueError(f"{ENV_PREFIX}CONFIG={path!r}: use a .json or .toml file")
    with open(path, "rb") as f:
        data = f.read().removeprefix(codecs.BOM_UTF8)
    toml = _toml_reader(path) if path.endswith(".toml") else None
    try:
        values = toml.load(io.BytesIO(data)) if toml else json.loads(data.decode("utf-8"))
    except ValueError as error:  # JSON's, TOML's and UTF-8's errors are ValueErrors
        raise ValueError(f"{ENV_PREFIX}CONFIG={path!r}: not valid {'TOML' if toml else 'JSON'} ({error})") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold an object of settings, got {type(values).__name__}")
    return values


def _toml_reader(path: str):
    """The standard library's ``tomllib`` (Python 3.11+), else the ``tomli`` package (the same module for
    Python 3.10); a ``ValueError`` naming both, and the JSON alternative, where neither is there."""
    try:
        import tomllib
    except ModuleNotFoundError:
        try:
            import tomli as tomllib  # type: ignore[no-redef, import-not-found]  # Python 3.10: the same API
        except ModuleNotFoundError:
            raise ValueError(f"{ENV_PREFIX}CONFIG={path!r}: reading TOML needs Python 3.11 or later, or the "
                             "tomli package on Python 3.10 (pip install tomli); or write the settings as a .json "
                             "file") from None
    return tomllib


def _parse_values(values: Mapping[str, object], source: str) -> dict[str, Any]:
    """Each value read by its field's type; an unknown key raises a ValueError naming ``source``."""
    known = _variables()
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown} in {source}; known: {sorted(known)}")
    return {name: _parse_value(name, value, source) for name, value in values.items()}


def _parse_value(name: str, value, source: str):
    """A field's value from a file value or a string (a variable, a flag), converted by the field's type."""
    where = f"{name} (from {source})"
    if name == "missing_score" and value in (None, ""):
        return None
    if name in ("cache_size", "max_batch_size", "max_wait_ms", "missing_score"):
        return _number(value, name in ("cache_size", "max_batch_size"), where)
    if name == "options":
        try:
            value = json.loads(value) if isinstance(value, str) else value
        except json.JSONDecodeError as e:
            raise ValueError(f"{where} must be a JSON object of Scorer options: {e}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be a JSON object of Scorer options, got {value!r}")
        return value
    if name == "strip_reasoning":
        if isinstance(value, bool) or (isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE):
            on = value if isinstance(value, bool) else value.strip().lower() in _TRUE
            return ("<think>", "</think>") if on else None
        pair = value.split() if isinstance(value, str) else value
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(isinstance(d, str) for d in pair):
            raise ValueError(f"{where} must be true/false or two delimiters (open close), got {value!r}")
        return tuple(pair)
    if name == "query_special_tokens":
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.lstrip().startswith("[") else value.split()
            except json.JSONDecodeError as e:
                raise ValueError(f"{where} must be space-separated tokens or a JSON list: {e}") from None
        if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
            raise ValueError(f"{where} must be a list of strings, got {value!r}")
        return tuple(value)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where} must be a string, got {value!r}")
    return value


def _number(value, integral: bool, where: str) -> int | float:
    """``value`` as an int (``integral``) or a float: a string (a variable, a flag) is parsed, a number
    from a file is taken if it is one of that kind (a float without a fraction is an int); a bool, a
    fraction where an int is due or anything else raises a ValueError naming ``where``."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, str) or is_int or isinstance(value, float) and (value.is_integer() or not integral):
        try:
            return int(value) if integral else float(value)
        except (ValueError, OverflowError):
            pass
    raise ValueError(f"{where} must be {'an int' if integral else 'a number'}, got {value!r}")


def _import(spec: str, where: str):
    """The object named ``module:attribute``; a ValueError naming ``where`` (the setting) if it cannot be
    imported."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{where} must be 'module:function', got {spec!r}")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{where}={spec!r} cannot be imported: {type(e).__name__}: {e}") from e
    return obj


def build_parser(config: RewardConfig) -> Parser | None:
    """The completion parser of ``config``: reasoning traces stripped, then the ``parse`` function. A
    ``parse`` that cannot be imported or is not callable raises a ValueError naming the setting and
    where it was read (:meth:`RewardConfig.origin`)."""
    custom = _import(config.parse, config.origin("parse")) if config.parse else None
    if custom is not None and not callable(custom):
        raise ValueError(f"{config.origin('parse')}={config.parse!r} is not callable")
    delimiters = config.strip_reasoning
    if delimiters is None:
        return custom

    def parse(text: str) -> str:
        text = strip_reasoning(text, *delimiters)
        return text if custom is None else custom(text)

    return parse


def _build_scorer(config: RewardConfig) -> Scorer:
    """The scorer of ``config``'s ``scorer``, ``preset``, ``model``, ``options`` and ``device``."""
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
        scorer.to(resolve_device(config.device))
    return scorer


def _read_references(path: str) -> list[str]:
    """The non-blank lines of ``path``, read as ``torchmover score`` reads a text file
    (:func:`~torchmover.evaluation.corpus.read_lines`: an undecodable line is named). The fits count
    each distinct line once, lines equal up to outer whitespace being one
    (:func:`~torchmover.scorer.inputs.distinct_stripped`, in ``fit_to_call`` and ``MoverReward.fit``)."""
    references = [line for line in read_lines(path) if line.strip()]
    if not references:
        raise ValueError(f"{setting_names('fit_references')}: {path} has no reference")
    return references


def build_reward(config: RewardConfig, *, batch_size: int = 64, progress: bool = False) -> MoverReward:
    """The :class:`~torchmover.reward.MoverReward` that ``config`` describes.

    With ``fit_references``, the scorer's corpus statistics are fitted on the distinct references of
    that file, lines equal up to outer whitespace being one, by the command line's rule
    (:func:`~torchmover.evaluation.scoring.fit_to_call`: IDF, a fixed centering mean, the rescaling
    baseline). A batch-centered scorer is first made to center on a ``fixed`` mean, which that rule
    fits on the references (``centering`` ``fixed`` in its config and signature): a reward must not depend
    on the other samples of its batch, and the baseline is then fitted under the centering the rewards
    use, so that the reward's signature is the one ``Scorer.from_signature`` and the same fits on the
    same references rebuild. A batch-centered scorer without them is refused here, before any sample.

    A scorer that its settings (``scorer``, ``preset``, ``model``, ``options``, ``device``) do not make,
    an unknown option or a bad value, raises a ValueError naming them and where they were read
    (:meth:`RewardConfig.origin`); a model that cannot be loaded, the loader's ``OSError`` naming them.
    """
    try:
        scorer = _build_scorer(config)
    except (TypeError, ValueError, OSError) as e:  # an OSError (a model that cannot load) keeps its type
        given = ", ".join(f"{config.origin(name)} = {getattr(config, name)!r}"
                          for name in ("scorer", "preset", "model", "options", "device") if getattr(config, name))
        message = f"the scorer of {given or 'the default settings'} cannot be built: {e}"
        raise (type(e)(message) if isinstance(e, OSError) else ValueError(message)) from e
    references = _read_references(config.fit_references) if config.fit_references else []
    if scorer.config.centering == "batch":
        if not references:
            raise ValueError(f"this scorer centers on the batch, which would make a sample's reward depend on the "
                             f"others: set {setting_names('fit_references')} to center on their mean, or pass "
                             "centering='none' in options (--centering none)")
        _center_on_a_fixed_mean(scorer)
    if references:
        fit_to_call(scorer, references, references, batch_size=batch_size, progress=progress)
    return MoverReward(scorer, cache_size=config.cache_size)


def _center_on_a_fixed_mean(scorer: Scorer) -> None:
    """Change ``scorer`` in place from ``batch`` centering to a ``fixed`` mean not fitted yet (one mean for
    both sides: ``center_scope`` joint), for :func:`build_reward` to fit on the references before the
    statistics fitted under the centering (the rescaling baseline)."""
    scorer.config = dataclasses.replace(scorer.config, centering="fixed", center_scope="joint")
    scorer.centering = Centering("fixed", dim=scorer.encoder.hidden_size).to(scorer.encoder.device)
    scorer.centering.train(scorer.training)
