"""The reproducibility signature: one line that pins every choice that changes a score.

Example: ``twmd|model:sentence-transformers/all-MiniLM-L6-v2|layer:4|direction:recall|T:0.15|
iter:1|center:batch|weights:uniform|refs:max|maxlen:512|torchmover:0.1.0|torch:2.13.0|
transformers:5.23.0|geomloss:0.3.1`` (one line). Fields are ``key:value`` joined by ``|``; the first
field is the method.
"""
from __future__ import annotations

import hashlib
from importlib import metadata

import torch

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


def format_signature(method: str, fields: dict[str, object]) -> str:
    """``method|key:value|...|<library>:<version>...``."""
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
