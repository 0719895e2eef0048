"""The reproducibility signature: one line that pins every choice that changes a score.

The default scorer's, for example (one line)::

    twmd|model:sentence-transformers/all-MiniLM-L6-v2@weights-90b183863c-tokenizer-7913d4b951|layer:4|
    special:drop|subwords:all|stop:none|punct:keep|weights:uniform|ngram:1|direction:recall|T:0.1|iter:1|
    center:none|refs:max|maxlen:512|torchmover:0.1.0|torch:2.13.0+cpu|transformers:5.24.0|geomloss:0.3.1

Fields are ``key:value`` joined by ``|``; the first field is the method.
"""
from __future__ import annotations

import hashlib
import json
from importlib import metadata
from typing import cast

import torch

from ..functional.family import WMD_TEMPERATURE
from ..functional.members import get_member
from .config import NAMED_STOPWORDS, ScorerConfig

LIBRARIES = ("torchmover", "torch", "transformers", "geomloss")


def library_versions() -> dict[str, str]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "unknown"
    return versions


def tensor_digest(t: torch.Tensor) -> str:
    """Short content hash of a tensor (pins a fitted centering mean)."""
    data = bytes(t.detach().to("cpu", torch.float32).contiguous().view(torch.uint8).tolist())
    return hashlib.sha256(data).hexdigest()[:10]


def stopwords_field(stopwords: tuple[str, ...]) -> str:
    """The ``stop`` field of a (normalised) stopword list: ``none``, the name of a
    :data:`~torchmover.scorer.config.NAMED_STOPWORDS` list, or ``custom-`` and a digest of the words
    (of their JSON list: no two lists share it)."""
    if not stopwords:
        return "none"
    named = (name for name, words in NAMED_STOPWORDS.items() if words == stopwords)
    return next(named, f"custom-{hashlib.sha256(json.dumps(list(stopwords)).encode()).hexdigest()[:10]}")


def scorer_signature(config: ScorerConfig, idf: dict, centering, baseline, finetuned: str | None = None,
                     dtype: torch.dtype = torch.float32) -> str:
    """The signature of a scorer of (resolved) ``config``, with its fitted statistics: the ``idf``
    dictionaries (``{"hyp": IDF, "ref": IDF}`` or empty), its ``centering`` module (a fitted mean is
    pinned by a digest), its rescaling ``baseline`` (``PRF`` or None) and, for an encoder fine-tuned
    after loading, what it was fine-tuned on and the digest of its weights (``finetuned``, the field
    after ``model``, which then names the model it started from). ``dtype``: the encoder's, named
    after the layer where it is not float32 (a bf16 encoder's vectors move scores by ~1e-3). A
    member's traits decide which of ``direction``, ``T`` and ``iter`` it has."""
    c, member = config, get_member(config.method)
    fields: dict[str, object] = {"model": c.model + (f"@{c.revision}" if c.revision else "")}
    if finetuned is not None:
        fields["finetuned"] = finetuned
    fields["layer"] = c.layer
    if cast(int, c.power_mean_layers) > 1:  # set in a resolved config (ScorerConfig.resolved), as the centering
        fields["pmeans"] = c.power_mean_layers
    if dtype != torch.float32:
        fields["dtype"] = str(dtype).removeprefix("torch.")
    fields.update({"special": c.special_tokens, "subwords": c.subwords, "stop": stopwords_field(c.stopwords),
                   "punct": c.punctuation})
    weights = "uniform"
    if c.idf:
        weights = f"idf-{idf['ref'].digest()}-{idf['hyp'].digest()}" if idf else "idf-unfitted"
    fields.update({"weights": weights, "ngram": c.ngram})
    if member.directed:
        fields["direction"] = c.direction
    if member.temperature is not None:
        fields["T"] = WMD_TEMPERATURE if member.temperature == "fixed" else (c.temperature or "exact")
    if member.iterations and (member.temperature == "tuned" or c.temperature):
        fields["iter"] = "converged" if c.n_iter is None else c.n_iter
    center = cast(str, c.centering) + ("" if c.center_scope == "joint" else f"-{c.center_scope}")
    if c.centering in ("fixed", "running") and centering.fitted:
        center += f"-{tensor_digest(centering.mean)}"
    fields.update({"center": center, "refs": c.multi_ref, "maxlen": c.max_length})
    if c.rescale:  # the three baselines, P/R/F1 (one value thrice for members without directions)
        fields["rescale"] = baseline_field(baseline)
    return format_signature(c.method, fields)


def baseline_field(baseline) -> str:
    """The ``rescale`` field of a rescaling ``baseline`` (``PRF`` of floats, or None): ``unfitted``, or
    ``b=P/R/F1``, each the shortest decimal that reads back as the same float (``repr``), so that no two
    baselines share it: rescaling divides by ``1 − b``, which magnifies any rounding of ``b``."""
    return "b=" + "/".join(map(repr, baseline)) if baseline else "unfitted"


def format_signature(method: str, fields: dict[str, object]) -> str:
    """``method|key:value|...|<library>:<version>...``; a value holding ``|`` (which would split it)
    raises ``ValueError``."""
    for key, value in fields.items():
        if "|" in str(value):
            raise ValueError(f"the signature's {key} {value!r} holds '|', which separates the signature's fields")
    parts = [method] + [f"{k}:{v}" for k, v in fields.items()]
    parts += [f"{k}:{v}" for k, v in library_versions().items()]
    return "|".join(parts)


def parse_signature(signature: str) -> tuple[str, dict[str, str]]:
    """``(method, {key: value})`` of a signature string (library versions included)."""
    if not isinstance(signature, str) or "|" not in signature:
        raise ValueError(f"not a torchmover signature: {signature!r}")
    method, *parts = signature.strip().split("|")
    fields = {}
    for part in parts:
        key, sep, value = part.partition(":")
        if not sep or not key:
            raise ValueError(f"malformed signature field {part!r} in {signature!r}")
        fields[key] = value
    return method, fields


def signature_diff(a: str, b: str) -> dict[str, tuple[str | None, str | None]]:
    """Fields (``method`` included) whose values differ between two signatures: ``{key: (a, b)}``."""
    (method_a, fa), (method_b, fb) = parse_signature(a), parse_signature(b)
    fa["method"], fb["method"] = method_a, method_b
    return {k: (fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)}
