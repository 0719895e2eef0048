"""Named presets that reproduce published metrics, and scorers rebuilt from a printed signature.

Each preset is a set of :class:`~torchmover.Scorer` options; the model can be overridden
(``Scorer.from_preset("moverscore", model=...)``), and the layer then comes from the model's
recorded default (``DEFAULT_LAYERS``) unless given.

Directions. All torchmover presets report the direction named in their options, in BERTScore's
sense: *recall* = every reference token is matched. The TWMD authors' released code passes
(candidate, reference) into functions whose parameters are named (reference, candidate), so what it
calls "recall" is *precision* here: ``twmd-b-authors`` therefore uses ``direction="precision"`` to
reproduce its numbers, while ``twmd-b`` (the paper's definitions) uses ``recall``.

Presets:

==================== ===================================================================================
``twmd-b``           the TWMD paper's defaults: roberta-base, layer 10, TWMD, T = 0.10, one iteration,
                     recall, batch centering of hypotheses and references together.
``twmd-b-authors``   the released TWMD-b code's choices where they differ: [CLS] kept and the final
                     separator dropped (for the centering mean as for the clouds), references and
                     candidates centered separately, each on the mean of its side's texts of the batch's
                     pairs, a text counted once per pair it is in (``center_scope="pairs"``; their code
                     centers each mini-batch of 32 pairs: call the scorer on slices of 32 pairs to
                     reproduce that; ``scorer.score`` centers on the whole call), and its "recall"
                     (= precision here). Its P, R and F1 are torchmover's ``precision``, ``recall`` and
                     ``f1`` directions (their F1 ``f1_12 / sqrt(f1_11 · f1_22)`` is torchmover's ``f1``
                     where the recall and precision terms share a sign: the self-terms of both directions
                     are equal, so normalising the harmonic mean and taking the harmonic mean of
                     normalised scores agree; where the signs differ the signed F1 is 0);
                     ``bench/studies/compare_authors.py`` checks all three, for TWMD, TRWMD and BERTScore, with
                     and without centering. Its one deviation from the authors' code, which has no rule
                     for empty texts (it moves the [CLS] token): an empty text scores 0, as everywhere.
``trwmd-b``          TRWMD-b: the closed-form relaxation, T = 0.15.
``twmd``             TWMD without centering at the paper's T = 0.02.
``moverscore``       MoverScore v2: distilbert-base-uncased, last layer, [CLS]/[SEP] kept (IDF gives them
                     weight 0), ``##`` pieces and ASCII punctuation dropped, no stopwords, IDF dictionaries fitted
                     separately on references and hypotheses (call ``fit_idf``), Euclidean-cost EMD,
                     score ``1 − EMD``, no centering.
``bertscore``        BERTScore F1 as the ``bert-score`` package computes it (roberta-large, layer 17, no
                     centering, no baseline rescaling): [CLS]/[SEP] weigh 0 but stay matching targets
                     (``special_tokens="target"``); with ``idf=True`` call ``fit_idf(references)`` (one
                     dictionary from the references, as ``bert_score.score(idf=True)``).
``sbert``            cosine of mean-pooled token vectors (no centering).
``cka``              Wordset-CKA (batch centering).
``sms``              Sentence Mover's Similarity (Clark et al., 2019): sentences as mean word vectors,
                     masses ``|s|/|A|``, Euclidean cost, exact OT, ``exp(−WMD)``; no centering.
``s+wms``            the union of words and sentences, masses ``count/2|A|`` and ``|s|/2|A|``.
==================== ===================================================================================
"""
from __future__ import annotations

import re
import warnings
from typing import Any

from ..functional.family import DIRECTIONS
from ..functional.members import MEMBERS
from ..text.encoder import SPECIAL_TOKEN_POLICIES
from ..text.weights import PUNCTUATION_POLICIES, SUBWORD_POLICIES
from .config import CENTER_SCOPES, MULTI_REF, NAMED_STOPWORDS, stopword_tuple, unused_member_options
from .signature import LIBRARIES, library_versions, parse_signature, stopwords_field

PRESETS: dict[str, dict] = {
    "twmd-b": dict(model="roberta-base", method="twmd", temperature=0.10, n_iter=1, direction="recall",
                   centering="batch"),
    "twmd-b-authors": dict(model="roberta-base", method="twmd", temperature=0.10, n_iter=1,
                           direction="precision", centering="batch", center_scope="pairs",
                           special_tokens="cls"),
    "trwmd-b": dict(model="roberta-base", method="trwmd", temperature=0.15, direction="recall", centering="batch"),
    "twmd": dict(model="roberta-base", method="twmd", temperature=0.02, n_iter=1, direction="recall",
                 centering="none"),
    "moverscore": dict(model="distilbert-base-uncased", layer=6, method="moverscore", centering="none",
                       special_tokens="keep", subwords="first", punctuation="ascii", stopwords=(), idf=True),
    "bertscore": dict(model="roberta-large", layer=17, method="bertscore", direction="f1", centering="none",
                      special_tokens="target"),
    "sbert": dict(method="sbert", centering="none"),
    "cka": dict(method="cka", centering="batch"),
    "sms": dict(method="sms", centering="none"),
    "s+wms": dict(method="s+wms", centering="none"),
}

# The values signature_options reads, by field (a value that matches none is refused).
_DIGEST = "[0-9a-f]{10}"
_NUMBER = "[0-9]+([.][0-9]+)?(e[-+]?[0-9]+)?"
_FIELD_VALUES = {
    "layer": "[0-9]+", "pmeans": "[0-9]+", "ngram": "[0-9]+", "maxlen": "[0-9]+",
    "special": "|".join(SPECIAL_TOKEN_POLICIES), "subwords": "|".join(SUBWORD_POLICIES),
    "punct": "|".join(PUNCTUATION_POLICIES), "refs": "|".join(MULTI_REF),
    "stop": "|".join(["none", *NAMED_STOPWORDS, f"custom-{_DIGEST}"]),
    "weights": f"uniform|idf-unfitted|idf-{_DIGEST}-{_DIGEST}",
    "direction": "|".join([*DIRECTIONS, "all"]),  # all: the command line's P/R/F1 columns of one scorer
    "T": f"exact|{_NUMBER}", "iter": "converged|[0-9]+",
    "center": f"none|dimension|sentence|batch(-separate|-pairs)?|(fixed|running)(-{_DIGEST})?",
    "rescale": f"unfitted|b=-?{_NUMBER}/-?{_NUMBER}/-?{_NUMBER}",
}
_FIELDS = {"model", "finetuned", "dtype", *_FIELD_VALUES, *LIBRARIES}


def preset_options(name: str, **overrides) -> dict:
    """The Scorer options of preset ``name``, updated with ``overrides``. Overriding ``model``
    drops the preset's layer (the new model's recorded default applies) unless ``layer`` is given;
    overriding ``method`` drops the preset's ``direction``, ``temperature`` and ``n_iter`` that the new
    method has no use for (:func:`~torchmover.scorer.config.unused_member_options`) unless given."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    options = dict(PRESETS[name])
    if "model" in overrides and "layer" not in overrides:
        options.pop("layer", None)
    options.update(overrides)
    if "method" in overrides:
        member_options = {k: options[k] for k in ("direction", "temperature", "n_iter") if k in options}
        for option in unused_member_options(options["method"], **member_options).keys() - overrides.keys():
            del options[option]
    return options


def check_signature_fields(signature: str, method: str, fields: dict[str, str]) -> None:
    """Raise ``ValueError``, naming the field and quoting ``signature``, for a field missing (``model``,
    ``layer``), unknown, or of a value that :func:`signature_options` does not read, and for an
    unknown method."""
    if method not in MEMBERS:
        raise ValueError(f"unknown method {method!r} in the signature {signature!r}; known: {tuple(MEMBERS)}")
    for key in ("model", "layer"):
        if not fields.get(key):
            raise ValueError(f"the signature has no {key}: {signature!r}")
    unknown = sorted(set(fields) - _FIELDS)
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)} in the signature {signature!r}")
    for key, values in _FIELD_VALUES.items():
        if key in fields and not re.fullmatch(values, fields[key]):
            raise ValueError(f"invalid {key} value {fields[key]!r} in the signature {signature!r}")


def signature_options(signature: str, stopwords=None) -> dict:
    """Scorer options that reproduce a printed signature.

    Statistics fitted on a corpus (IDF dictionaries, a ``fixed``/``running`` centering mean, a
    rescaling baseline) are not in the signature — only their hashes or values are: the options ask
    for them (``idf=True``, ``centering="fixed"``, ``rescale=True``) and the caller refits on the same
    corpus, after which ``scorer.signature`` equals ``signature`` again. A custom stopword list must be
    passed (``stopwords=...``), and must be the one the signature's digest names. A malformed
    signature (a field missing, unknown, or of an unknown value) raises ``ValueError`` naming the field
    (:func:`check_signature_fields`). Warns when the signature was made with other library versions.
    """
    method, f = parse_signature(signature)
    if "finetuned" in f:
        raise ValueError(f"the signature is of a scorer fine-tuned on {f['finetuned']}: its weights are not on the "
                         "hub; load the directory it was saved to with Scorer.from_pretrained")
    check_signature_fields(signature, method, f)
    model, _, revision = f["model"].partition("@")
    options: dict[str, Any] = dict(model=model, revision=revision or None, layer=int(f["layer"]), method=method,
                   multi_ref=f.get("refs", "max"), max_length=int(f["maxlen"]) if "maxlen" in f else None,
                   power_mean_layers=int(f.get("pmeans", 1)), special_tokens=f.get("special", "drop"),
                   subwords=f.get("subwords", "all"), punctuation=f.get("punct", "keep"),
                   ngram=int(f.get("ngram", 1)), dtype=f.get("dtype", "float32"))
    stop = f.get("stop", "none")
    if stop.startswith("custom-"):
        if stopwords is None:
            raise ValueError(f"the signature uses a custom stopword list ({stop}); pass it as stopwords=[...]")
        given = stopwords_field(stopword_tuple(stopwords))
        if given != stop:
            raise ValueError(f"the stopwords given are not the signature's list ({stop}): they sign as {given}")
    options["stopwords"] = stopwords if stop.startswith("custom-") else (() if stop == "none" else stop)
    options["idf"] = f.get("weights", "uniform") != "uniform"
    options["rescale"] = "rescale" in f  # the baseline itself is refitted: Scorer.fit_baseline
    if f.get("direction", "all") != "all":  # all: the command line's P/R/F1 columns of one scorer
        options["direction"] = f["direction"]
    if "T" in f and method not in ("wmd", "moverscore"):
        options["temperature"] = None if f["T"] == "exact" else float(f["T"])
    if "iter" in f:
        options["n_iter"] = None if f["iter"] == "converged" else int(f["iter"])
    center = f.get("center", "batch").split("-")
    options["centering"] = center[0]
    options["center_scope"] = center[1] if center[1:] and center[1] in CENTER_SCOPES else "joint"
    mismatched = {k: (v, f[k]) for k, v in library_versions().items() if k in f and f[k] != v}
    if mismatched:
        warnings.warn("the signature was made with other library versions (installed, signed): "
                      + ", ".join(f"{k} {a} vs {b}" for k, (a, b) in mismatched.items()), stacklevel=3)
    return options
