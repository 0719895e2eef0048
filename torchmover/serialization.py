"""Saving and loading a :class:`~torchmover.Scorer` as a directory (safe formats only).

Layout of a saved scorer::

    path/
      torchmover.json          {"format": 1, "torchmover": "<version>", "config": {ScorerConfig fields},
                                "encoder_dtype": "float32"}
      encoder/                 the encoder cut at ``layer`` (``model.safetensors``, ``config.json``)
                               and its tokenizer files, written by ``save_pretrained``
      centering.safetensors    the Centering buffers ``mean`` [D] and ``num_tokens`` []
      idf.json                 the fitted IDF dictionaries {"hyp": ..., "ref": ...} (``idf=True`` only)

The ``model`` field of the config keeps the original name (e.g. the hub name), so a reloaded scorer
has the same :attr:`~torchmover.Scorer.signature`; the weights come from ``encoder/``. The encoder is
saved already truncated (``config.num_hidden_layers == layer``), so reloading never rebuilds the
dropped blocks.

Writes are atomic: everything goes into a hidden temporary directory next to ``path`` that is renamed
into place at the end, so ``path`` is either absent, the previous save, or the complete new one.
Loading reads only JSON and safetensors (``use_safetensors=True``, ``local_files_only=True``: a
missing ``encoder/`` is an error, never a hub download).
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

FORMAT_VERSION = 1
CONFIG_FILE = "torchmover.json"
ENCODER_DIR = "encoder"
CENTERING_FILE = "centering.safetensors"
IDF_FILE = "idf.json"


def save_scorer(scorer, path: str | os.PathLike) -> Path:
    """Write ``scorer`` to the directory ``path`` (layout in the module docs); returns ``path``.

    An existing ``path`` is replaced only if it is empty or a previously saved scorer (it holds
    ``torchmover.json``); any other existing path raises ``FileExistsError``.
    """
    from safetensors.torch import save_file

    from . import __version__

    target = Path(path)
    if target.exists() and not _replaceable(target):
        raise FileExistsError(f"path {str(target)!r} exists and is not a saved torchmover scorer; "
                              "choose a new path or remove it")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        encoder = scorer.encoder
        encoder.model.save_pretrained(tmp / ENCODER_DIR, safe_serialization=True)
        encoder.tokenizer.save_pretrained(tmp / ENCODER_DIR)
        buffers = {name: b.detach().cpu().contiguous() for name, b in scorer.centering.named_buffers()}
        save_file(buffers, str(tmp / CENTERING_FILE))
        if scorer.idf:
            (tmp / IDF_FILE).write_text(json.dumps({side: idf.to_dict() for side, idf in scorer.idf.items()}),
                                        encoding="utf-8")
        meta = {
            "format": FORMAT_VERSION,
            "torchmover": __version__,
            "config": dataclasses.asdict(scorer.config),
            "encoder_dtype": str(next(encoder.model.parameters()).dtype).removeprefix("torch."),
            "signature": scorer.signature,  # informative only: the signature of the saved scorer
        }
        with open(tmp / CONFIG_FILE, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        _move_into_place(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _replaceable(target: Path) -> bool:
    return target.is_dir() and (not any(target.iterdir()) or (target / CONFIG_FILE).is_file())


def _move_into_place(tmp: Path, target: Path) -> None:
    """Rename ``tmp`` to ``target``; an existing ``target`` is first renamed aside, then deleted."""
    if not target.exists():
        os.rename(tmp, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.rename(target, old / target.name)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old / target.name, target)  # put the previous save back
        raise
    finally:
        if (old / target.name).exists() and target.exists():
            shutil.rmtree(old, ignore_errors=True)


def read_meta(path: str | os.PathLike) -> dict:
    """The parsed ``torchmover.json`` of a saved scorer, with errors that name the path."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"no saved scorer at {str(root)!r}: not a directory")
    file = root / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{str(root)!r} is not a saved torchmover scorer: {CONFIG_FILE} is missing")
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"corrupt {CONFIG_FILE} in {str(root)!r}: {e}") from e
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise ValueError(f"corrupt {CONFIG_FILE} in {str(root)!r}: expected an object with a 'config' object")
    if meta.get("format") != FORMAT_VERSION:
        raise ValueError(f"{str(file)!r} has format {meta.get('format')!r}; this torchmover reads format "
                         f"{FORMAT_VERSION} (saved by torchmover {meta.get('torchmover', 'unknown')})")
    return meta


def load_scorer(cls, path: str | os.PathLike, device="auto", dtype: str | torch.dtype | None = None):
    """Rebuild a ``cls`` (a :class:`~torchmover.Scorer`) saved by :func:`save_scorer`.

    ``dtype`` defaults to the dtype the encoder was saved in; ``device`` (``"auto"``, a name or a
    ``torch.device``, :func:`torchmover.devices.resolve_device`) to ``"auto"``.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoTokenizer

    from .devices import resolve_device, resolve_dtype
    from .encoding import Encoder
    from .scorer import ScorerConfig
    from .weights import IDF

    device, dtype = resolve_device(device), resolve_dtype(dtype)
    root = Path(path)
    meta = read_meta(root)
    fields = {f.name for f in dataclasses.fields(ScorerConfig)}
    unknown = sorted(set(meta["config"]) - fields)
    if unknown:
        raise ValueError(f"{str(root / CONFIG_FILE)!r} has unknown config fields {unknown} (saved by "
                         f"torchmover {meta.get('torchmover', 'unknown')}; a newer version?)")
    try:
        config = ScorerConfig(**meta["config"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"invalid config in {str(root / CONFIG_FILE)!r}: {e}") from e
    for name in (ENCODER_DIR, CENTERING_FILE):
        if not (root / name).exists():
            raise FileNotFoundError(f"incomplete saved scorer {str(root)!r}: {name} is missing")

    try:
        model = AutoModel.from_pretrained(root / ENCODER_DIR, use_safetensors=True, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(root / ENCODER_DIR, use_fast=True, local_files_only=True)
    except (OSError, ValueError, SafetensorError) as e:
        raise ValueError(f"cannot load the encoder of the saved scorer {str(root)!r}: {e}") from e
    saved_dtype = getattr(torch, str(meta.get("encoder_dtype", "float32")), None)
    dtype = dtype or (saved_dtype if isinstance(saved_dtype, torch.dtype) else None)
    if dtype is not None:
        model = model.to(dtype)
    encoder = Encoder(model.eval(), tokenizer, config.layer, name=config.model, revision=config.revision,
                      max_length=config.max_length, special_tokens=config.special_tokens,
                      power_mean_layers=config.power_mean_layers)
    accepted = inspect.signature(cls.__init__).parameters
    options = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
               if f.name in accepted and f.name not in ("model", "max_length", "revision")}
    scorer = cls(encoder, **options, device=device)
    if scorer.config != config:
        raise ValueError(f"the scorer rebuilt from {str(root)!r} has config {scorer.config}, saved {config}")

    try:
        buffers = load_file(str(root / CENTERING_FILE))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"corrupt {CENTERING_FILE} in {str(root)!r}: {e}") from e
    missing = {name for name, _ in scorer.centering.named_buffers()} - set(buffers)
    if missing:
        raise ValueError(f"{CENTERING_FILE} in {str(root)!r} lacks {sorted(missing)}")
    scorer.centering.load_state_dict(buffers)
    if (root / IDF_FILE).is_file():
        try:
            saved = json.loads((root / IDF_FILE).read_text(encoding="utf-8"))
            scorer.idf = {side: IDF.from_dict(saved[side]) for side in ("hyp", "ref")}
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"corrupt {IDF_FILE} in {str(root)!r}: {e}") from e
    return scorer.to(device=device)
