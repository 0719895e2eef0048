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

import warnings

from .config import CENTER_SCOPES
from .signature import library_versions, parse_signature

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

# Signature keys -> Scorer options (values parsed by _SIGNATURE_PARSERS).
_CENTERINGS = ("none", "dimension", "sentence", "batch", "fixed", "running")


def preset_options(name: str, **overrides) -> dict:
    """The Scorer options of preset ``name``, updated with ``overrides``. Overriding ``model``
    drops the preset's layer (the new model's recorded default applies) unless ``layer`` is given."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    options = dict(PRESETS[name])
    if "model" in overrides and "layer" not in overrides:
        options.pop("layer", None)
    options.update(overrides)
    return options


def signature_options(signature: str, stopwords=None) -> dict:
    """Scorer options that reproduce a printed signature.

    Statistics fitted on a corpus (IDF dictionaries, a ``fixed``/``running`` centering mean, a
    rescaling baseline) are not in the signature — only their hashes or values are: the options ask
    for them (``idf=True``, ``centering="fixed"``, ``rescale=True``) and the caller refits on the same corpus, after which
    ``scorer.signature`` equals ``signature`` again. A custom stopword list must be passed
    (``stopwords=...``). Warns when the signature was made with other library versions.
    """
    method, f = parse_signature(signature)
    if "finetuned" in f:
        raise ValueError(f"the signature is of a scorer fine-tuned on {f['finetuned']}: its weights are not on the "
                         "hub; load the directory it was saved to with Scorer.from_pretrained")
    model, _, revision = f["model"].partition("@")
    options = dict(model=model, revision=revision or None, layer=int(f["layer"]), method=method,
                   multi_ref=f.get("refs", "max"), max_length=int(f["maxlen"]) if "maxlen" in f else None,
                   power_mean_layers=int(f.get("pmeans", 1)), special_tokens=f.get("special", "drop"),
                   subwords=f.get("subwords", "all"), punctuation=f.get("punct", "keep"),
                   ngram=int(f.get("ngram", 1)), dtype=f.get("dtype", "float32"))
    stop = f.get("stop", "none")
    if stop.startswith("custom-") and stopwords is None:
        raise ValueError(f"the signature uses a custom stopword list ({stop}); pass it as stopwords=[...]")
    options["stopwords"] = stopwords if stop.startswith("custom-") else (() if stop == "none" else stop)
    options["idf"] = f.get("weights", "uniform").startswith("idf")
    options["rescale"] = "rescale" in f  # the baseline itself is refitted: Scorer.fit_baseline
    if f.get("direction", "all") != "all":  # all: the command line's P/R/F1 columns of one scorer
        options["direction"] = f["direction"]
    if "T" in f and method not in ("wmd", "moverscore"):
        options["temperature"] = None if f["T"] == "exact" else float(f["T"])
    if "iter" in f:
        options["n_iter"] = None if f["iter"] == "converged" else int(f["iter"])
    center = f.get("center", "batch").split("-")
    if center[0] not in _CENTERINGS:
        raise ValueError(f"unknown centering {f.get('center')!r} in the signature")
    options["centering"] = center[0]
    options["center_scope"] = next((scope for scope in CENTER_SCOPES if scope in center[1:]), "joint")
    mismatched = {k: (v, f[k]) for k, v in library_versions().items() if k in f and f[k] != v}
    if mismatched:
        warnings.warn("the signature was made with other library versions (installed, signed): "
                      + ", ".join(f"{k} {a} vs {b}" for k, (a, b) in mismatched.items()), stacklevel=3)
    return options
