"""Every choice of a :class:`~torchmover.Scorer` that changes a score, and its defaults, in one place.

:class:`ScorerConfig` holds the options; a field left ``None`` means "the default for the model",
filled in by :meth:`ScorerConfig.resolve` once the encoder is known (the config a scorer keeps, saves
and signs is the resolved one, every field explicit). The defaults:

- ``layer``, ``max_length``, ``revision``, ``special_tokens``, ``power_mean_layers``: the encoder's
  (:class:`~torchmover.Encoder`; a new one takes the model's recorded layer from
  :data:`~torchmover.text.encoder.DEFAULT_LAYERS`, its full window, ``drop`` and 1);
- ``centering`` and the temperature of a tuned member: the model's measured choice in
  :data:`MODEL_DEFAULTS` if there is one, else the TWMD paper's (:data:`DEFAULT_CENTERING`, the member's
  ``default_temperature``, :mod:`torchmover.functional.members`).

Each field carries its help text and group (``metadata``): the command line builds its options from
them, so none is forgotten. :class:`RunOptions` are the options that change where and how a scorer
runs, never its scores.
"""
from __future__ import annotations

import dataclasses
from typing import Any, TypedDict

from ..functional.centering import MODULE_MODES
from ..functional.family import DIRECTIONS
from ..functional.members import MEMBERS, get_member
from ..functional.transport import check_converged_temperature, check_temperature
from ..text.encoder import DEFAULT_MODEL, SPECIAL_TOKEN_POLICIES
from ..text.weights import ENGLISH_STOPWORDS, PUNCTUATION_POLICIES, SUBWORD_POLICIES

MULTI_REF = ("max", "mean")
CENTER_SCOPES = ("joint", "separate", "pairs")
NAMED_STOPWORDS = {"english": ENGLISH_STOPWORDS}

class ModelDefaults(TypedDict, total=False):
    """A model's measured ``centering`` and ``temperatures`` (by member) in :data:`MODEL_DEFAULTS`."""

    centering: str
    temperatures: dict[str, float]


# The TWMD paper's centering, for any model without a measured one.
DEFAULT_CENTERING = "batch"

# Defaults measured for a model on WMT15-16 DA (bench/studies/select_defaults.py; numbers in
# bench/results/select_defaults.md): they override the paper's for that model.
# all-MiniLM-L6-v2, layer 4, TWMD recall, average Pearson r over the 10 language pairs × years:
# no centering 0.6887 (T=0.10) / 0.6884 (T=0.15); at T=0.10 fixed 0.6828, batch 0.6783, sentence 0.6644.
# A paired bootstrap puts none − fixed (the best other centering) at +0.0059 [+0.0039, +0.0080]: this
# contrastively trained sentence encoder gains nothing from centering (BERT/RoBERTa do, per the paper).
MODEL_DEFAULTS: dict[str, ModelDefaults] = {
    DEFAULT_MODEL: {"centering": "none", "temperatures": {"twmd": 0.10, "trwmd": 0.15}},
    "sentence-transformers/all-mpnet-base-v2": {"centering": "none", "temperatures": {"twmd": 0.15, "trwmd": 0.15}},
}


def _option(default, group: str, help: str, **cli: Any):
    """A config field with its group and help text (and, in ``cli``, how the command line reads it:
    ``choices`` (a callable, read when the parser is built), ``cli_type``)."""
    return dataclasses.field(default=default, metadata={"group": group, "help": help, **cli})


def _methods() -> tuple[str, ...]:
    return tuple(MEMBERS)


@dataclasses.dataclass(frozen=True)
class ScorerConfig:
    """Every choice of a :class:`~torchmover.Scorer` that changes a score (serialised with the model).

    Each field is the :class:`~torchmover.Scorer` argument of the same name, described there with its
    allowed values; a field left ``None`` takes the model's default in :meth:`resolve`. In short:

    - ``model``: hub name or local path; ``layer``: hidden layer (0 = embeddings); ``max_length``: the
      encoder window; ``revision``: the hub revision.
    - ``method``: ``twmd``, ``trwmd``, ``wmd``, ``moverscore``, ``bertscore``, ``sbert``, ``cka``, ``sms``,
      ``s+wms``, ``wms``; ``direction``: ``recall``, ``precision``, ``f1``; ``temperature``:
      ``1.2e-38 ≤ T ≤ 1e30``; ``n_iter``: a positive int or ``None`` (converged).
    - ``centering``: ``batch``, ``running``, ``fixed``, ``sentence``, ``dimension``, ``none``;
      ``center_scope``: ``joint`` centers hypotheses and references together (the paper), ``separate``
      each side on the mean of its own distinct texts, ``pairs`` each side on the mean of its texts as
      the pairs list them, a text counted once per pair it is in (the TWMD authors' released code, which
      concatenates the 32 references and the 32 candidates of a mini-batch, repeats included, and
      subtracts each side's token mean); ``multi_ref``: ``max``, ``mean``.
    - Token policy (:mod:`torchmover.text.weights`): ``special_tokens``: ``drop``, ``cls``, ``keep``,
      ``target`` (special tokens weigh 0 but stay matching targets, and so do tokens of IDF 0 —
      bert_score's rule; for the matching members ``bertscore`` and ``trwmd``); ``power_mean_layers``: a
      positive int; ``subwords``: ``all``, ``first``, ``mean``; ``stopwords``: a tuple of words, or
      ``"english"``; ``punctuation``: ``keep``, ``drop``, ``ascii``; ``idf``: a bool (weights from
      :meth:`Scorer.fit_idf <torchmover.Scorer.fit_idf>`); ``ngram``: a positive int.
    - ``rescale``: map every score ``s`` to ``(s − b) / (1 − b)`` with the baseline ``b`` of unrelated
      pairs (:meth:`Scorer.fit_baseline <torchmover.Scorer.fit_baseline>`).
    """

    model: str = _option(DEFAULT_MODEL, "encoder", f"hub name or local path (default: {DEFAULT_MODEL})")
    layer: int | None = _option(None, "encoder", "hidden layer, 0 = embeddings (default: the model's recorded layer)")
    method: str = _option("twmd", "metric", "the family member (default: twmd)", choices=_methods)
    direction: str = _option("recall", "metric", "recall: every reference token ships its mass; precision: every hypothesis "
                                                                  "token; f1: their harmonic mean (twmd, trwmd, bertscore; default: recall)", choices=lambda: DIRECTIONS)
    temperature: float | None = _option(
        None, "metric", "T of twmd / trwmd (default: the model's measured T, else 0.10 / 0.15), or of the "
                        "tempered sentence movers (default: exact)")
    n_iter: int | None = _option(1, "metric", "Sinkhorn iterations of twmd, or 'converged' (default: 1)",
                                 cli_type="iterations")
    centering: str | None = _option(
        None, "metric", "default: the model's measured choice (none for the default model), else batch; "
                        "fixed/running: fitted on the references", choices=lambda: MODULE_MODES)
    center_scope: str = _option("joint", "metric", "batch centering of both sides together, each apart, or each "
                                                   "apart with a text counted once per pair it is in, as the TWMD "
                                                   "authors' code (default: joint)", choices=lambda: CENTER_SCOPES)
    multi_ref: str = _option("max", "metric", "how several references combine (default: max)",
                             choices=lambda: MULTI_REF)
    max_length: int | None = _option(None, "encoder", "encoder window in tokens (default: the model's)")
    revision: str | None = _option(None, "encoder", "model revision on the hub, recorded in the signature "
                                                                            "(default: the latest)")
    special_tokens: str | None = _option(None, "encoder", "drop them; cls: keep [CLS] (the TWMD authors' code); "
                                                                  "keep: all (MoverScore); target: zero-mass matching targets "
                                                                  "(bertscore, trwmd; bert_score's rule) (default: drop)",
                                                 choices=lambda: SPECIAL_TOKEN_POLICIES)
    power_mean_layers: int | None = _option(None, "encoder", "power means over this many layers up to --layer "
                                                             "(default: 1, the layer alone)")
    subwords: str = _option("all", "token policy", "every piece, the first piece of each word "
                                                                   "(MoverScore), or pieces mean-pooled into words "
                                                                   "(default: all)", choices=lambda: SUBWORD_POLICIES)
    stopwords: tuple[str, ...] = _option((), "token policy", "'english', or a file with one stopword per line "
                                                             "(default: none)", cli_type="stopwords")
    punctuation: str = _option("keep", "token policy", "keep; drop: words made only of punctuation; ascii: "
                                                               "MoverScore's string.punctuation rule (default: keep)",
                               choices=lambda: PUNCTUATION_POLICIES)
    idf: bool = _option(False, "token policy", "IDF weights, fitted on the references and hypotheses of the "
                                                                "call (default: off, uniform weights)")
    ngram: int = _option(1, "token policy", "n-gram units (default: 1)")
    rescale: bool = _option(False, "metric", "report (s - b) / (1 - b), b = the mean score of random "
                                                                   "unrelated pairs (default: off)")

    def __post_init__(self):
        member = get_member(self.method)
        _check_choice("direction", self.direction, DIRECTIONS)
        _check_choice("centering", self.centering, (None, *MODULE_MODES))
        _check_choice("center_scope", self.center_scope, CENTER_SCOPES)
        _check_choice("multi_ref", self.multi_ref, MULTI_REF)
        _check_choice("special_tokens", self.special_tokens, (None, *SPECIAL_TOKEN_POLICIES))
        _check_choice("subwords", self.subwords, SUBWORD_POLICIES)
        _check_choice("punctuation", self.punctuation, PUNCTUATION_POLICIES)
        for name, least, default in (("layer", 0, "the model's recorded layer"),
                                     ("power_mean_layers", 1, "the layer alone")):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < least):
                raise ValueError(f"{name} must be an int >= {least} or None ({default}), got {value!r}")
        unused = unused_member_options(self.method, self.direction, self.temperature, self.n_iter)
        if unused:
            raise ValueError(next(iter(unused.values())))
        if self.temperature is not None:
            check_temperature(self.temperature)
            object.__setattr__(self, "temperature", float(self.temperature))  # as the signature prints it
        if self.n_iter is not None and (type(self.n_iter) is not int or self.n_iter < 1):
            raise ValueError(f"n_iter must be a positive int or None (converged), got {self.n_iter!r}")
        if member.temperature == "tuned" and member.iterations and self.n_iter is None and self.temperature is not None:
            check_converged_temperature(self.temperature)
        if type(self.ngram) is not int or self.ngram < 1:
            raise ValueError(f"ngram must be a positive int, got {self.ngram!r}")
        for name in ("idf", "rescale"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.center_scope != "joint" and self.centering not in (None, "batch"):
            raise ValueError(f"center_scope={self.center_scope!r} needs centering='batch' (each side's own batch mean)")
        if member.documents and not (self.token_policy_is_identity and not self.idf and self.ngram == 1):
            raise ValueError(f"method={self.method!r} moves words and sentences of whole documents: it takes no "
                             "subwords/stopwords/punctuation/idf/ngram options")
        if self.special_tokens in ("cls", "keep") and (self.subwords == "mean" or member.documents):
            dropper = "the sentence movers drop" if member.documents else "subwords='mean' drops"
            raise ValueError(f"special_tokens={self.special_tokens!r} keeps special tokens as units, but {dropper} "
                             "them (special tokens belong to no word or sentence): use special_tokens='drop'")
        if self.special_tokens == "target" and (not member.matching or self.subwords == "mean" or self.ngram > 1):
            matching = tuple(name for name, m in MEMBERS.items() if m.matching)
            raise ValueError(f"special_tokens='target' (zero-mass matching targets) is defined for the methods "
                             f"{matching} on tokens (not subwords='mean', not ngram > 1), got "
                             f"method={self.method!r}, subwords={self.subwords!r}, ngram={self.ngram!r}")
        object.__setattr__(self, "stopwords", stopword_tuple(self.stopwords))

    @property
    def token_policy_is_identity(self) -> bool:
        return self.subwords == "all" and not self.stopwords and self.punctuation == "keep"

    def resolve(self, encoder) -> "ScorerConfig":
        """This config with every default filled in for ``encoder`` (the
        :class:`~torchmover.Encoder` the scorer runs): its name, layer, window, revision and
        special-token policy, and the model's measured (else the paper's) centering and temperature."""
        member = get_member(self.method)
        measured = MODEL_DEFAULTS.get(encoder.name, {})
        temperature = self.temperature
        if temperature is None and member.temperature == "tuned":
            temperature = measured.get("temperatures", {}).get(self.method, member.default_temperature)
        return dataclasses.replace(
            self, model=encoder.name, layer=encoder.layer, max_length=encoder.max_length, revision=encoder.revision,
            special_tokens=encoder.special_tokens, power_mean_layers=encoder.power_mean_layers,
            temperature=temperature, centering=self.centering or measured.get("centering", DEFAULT_CENTERING))

    def options(self) -> dict[str, Any]:
        """The fields as :class:`~torchmover.Scorer` keyword arguments (all but ``model``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "model"}


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Options of a :class:`~torchmover.Scorer` that change where and how it runs, never its scores."""

    name: str | None = _option(None, "encoder", "the model's name in the signature when --model is a local "
                                                "directory (default: the hub id the directory records)")
    device: str | None = _option("auto", "running", "auto (default: CUDA when available, the local rank's GPU "
                                                     "under torchrun), cpu, cuda, cuda:1, ...")
    dtype: str | None = _option(None, "running", "encoder precision: float32, bf16, fp16, ... (default: the "
                                                 "weights'; scores stay float32)")
    compile: bool = _option(False, "running", "run the transport terms through torch.compile (default: off)")
    pass_cost: int | str | None = _option(
        "auto", "running", "what one more encoder pass costs, in padded tokens: a call's texts run in passes of "
                           "similar length where that saves more (auto: 128 on the CPU, 8192 on a GPU; none: one "
                           "pass a call)", cli_type="pass_cost")


def encoder_fields() -> tuple[str, ...]:
    """The config fields that belong to the encoder (another value needs another encoder)."""
    return tuple(f.name for f in dataclasses.fields(ScorerConfig) if f.metadata["group"] == "encoder")


SCORER_OPTIONS = frozenset(f.name for cls in (ScorerConfig, RunOptions) for f in dataclasses.fields(cls))


def stopword_tuple(stopwords) -> tuple[str, ...]:
    """``stopwords`` (a name of :data:`NAMED_STOPWORDS`, words, or None) as a sorted tuple of
    lower-case words."""
    if isinstance(stopwords, str):
        if stopwords not in NAMED_STOPWORDS:
            raise ValueError(f"stopwords must be a list of words or one of {tuple(NAMED_STOPWORDS)}, got {stopwords!r}")
        return NAMED_STOPWORDS[stopwords]
    if stopwords is None:
        return ()
    words = list(stopwords)
    if not all(isinstance(w, str) for w in words):
        raise TypeError("stopwords must be strings")
    spaced = [w for w in words if any(c.isspace() for c in w)]
    if spaced:
        raise ValueError(f"a stopword is one word, matched whole (no whitespace in it), got {spaced!r}")
    return tuple(sorted({w.lower() for w in words}))


def unused_member_options(method: str, direction: str = "recall", temperature=None, n_iter=1) -> dict[str, str]:
    """``{option: why}`` for each of ``direction``, ``temperature`` and ``n_iter`` that ``method`` has no
    use for (it would be ignored, and the signature would not show it): a direction other than
    ``recall`` for a member without directions, a temperature for a member without one (or with the
    exact solver's fixed one), and Sinkhorn iterations other than the default 1 for a member that runs
    none (a sentence mover runs them only when tempered). :class:`ScorerConfig` refuses them."""
    member, unused = get_member(method), {}
    if direction != "recall" and not member.directed:
        directed = tuple(name for name, m in MEMBERS.items() if m.directed)
        unused["direction"] = (f"method={method!r} has no directions (its score is one value), got "
                               f"direction={direction!r}; directions are defined for {directed}")
    if temperature is not None and member.temperature in (None, "fixed"):
        tempered = tuple(name for name, m in MEMBERS.items() if m.temperature in ("tuned", "optional"))
        why = "it runs the exact solver at its fixed T" if member.temperature == "fixed" else "it has none"
        unused["temperature"] = (f"method={method!r} takes no temperature ({why}), got temperature={temperature!r}; "
                                 f"a temperature is a parameter of {tempered}")
    iterates = member.iterations and (member.temperature == "tuned" or temperature is not None)
    if n_iter != 1 and not iterates:
        iterating = tuple(name for name, m in MEMBERS.items() if m.iterations)
        unused["n_iter"] = (f"method={method!r} runs no Sinkhorn iterations here, got n_iter={n_iter!r}; n_iter is "
                            f"a parameter of {iterating} (the sentence movers' when tempered)")
    return unused


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(c for c in choices if c is not None)}, got {value!r}")
