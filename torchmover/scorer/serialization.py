"""Saving and loading a :class:`~torchmover.Scorer` as a directory (safe formats only).

Layout of a saved scorer::

    path/
      torchmover.json          {"format": 1, "torchmover": "<version>", "config": {ScorerConfig fields},
                                "encoder_dtype": "float32", "signature": "...", "baseline": [P, R, F1] or null,
                                "finetuned": "<what it was fine-tuned on>@weights-<hash>" or null,
                                "files": {"<relative path>": "<SHA-256>", ...},
                                "manifest_sha256": "<SHA-256 of the rest of this file's content>"}
      encoder/                 the encoder cut at ``layer`` (``model.safetensors``, ``config.json``)
                               and its tokenizer files, written by ``save_pretrained``
      centering.safetensors    the Centering buffers ``mean`` [D] and ``num_tokens`` []
      idf.json                 the fitted IDF dictionaries {"hyp": ..., "ref": ...} (``idf=True`` only)

The ``model`` field of the config keeps the original name (e.g. the hub name), so a reloaded scorer
has the same :attr:`~torchmover.Scorer.signature`; the weights come from ``encoder/``. The encoder is
saved already truncated (``config.num_hidden_layers == layer``), so reloading never rebuilds the
dropped blocks.

Every file the save writes is recorded with its SHA-256 in ``torchmover.json`` (``"files"``:
``{"encoder/model.safetensors": "<hex>", ...}``), and ``torchmover.json`` records the SHA-256 of its
own canonical content (:func:`manifest_digest`: its JSON with sorted keys and no whitespace, without
that field), so that a changed value in it (``temperature`` 0.1 read as 1.1) or in a recorded digest
is caught too. Both are verified on load, the manifest first (``verify=False`` skips them, e.g. for a
huge model on trusted storage, or a ``torchmover.json`` edited by hand): a flipped bit is an error
naming the file that holds it, never a silently different scorer, and never blames an intact file.
Every load error names the file it comes from, with ``verify=False`` too.

Saving never deletes a file it did not write. A save goes into a new or existing directory: files
already there are kept, except those an earlier save wrote there (listed in its ``torchmover.json``):
they are overwritten, or removed if this save no longer writes them and they are unchanged since (a
changed one is kept, with a warning). A file of another origin at a name the save writes is in the
way: the save refuses, naming it, before writing anything. A ``torchmover.json`` counts as an earlier
save's only if its own digest matches (a user's own file of that name, or one changed since, is in
the way), and a symbolic link where the save writes a folder (``encoder/`` pointing elsewhere) is in
the way too: the save never writes outside ``path``.

A save first checks that the encoder's weights are those the signature pins
(:func:`check_signed_weights`: trained weights need :meth:`~torchmover.Scorer.mark_finetuned`, after
training), so that a saved scorer never signs weights it does not hold.

Writes are atomic per file and the save as a whole is marked by its ``torchmover.json``: every file is
first written into a hidden staging directory next to ``path``, ``.NAME.tmp-XXXXXXXX`` (a failure
there leaves ``path`` untouched; the directory is removed when the save ends, and one left by a
killed save is removed by the next save of ``path``:
:func:`~torchmover.runtime.checkpoint.staging_directory`); then the names of the files being written are recorded in ``.torchmover-saving.json`` (so
that a retry after a crash knows them as its own), the old ``torchmover.json`` is removed, each staged
file is moved into place with ``os.replace``, and the new ``torchmover.json`` is written last
(fsync'ed, then renamed). At any moment ``path`` therefore holds the previous complete save, the new
complete save, or no ``torchmover.json`` (a load then says so) — never a mixture that loads.

One save at a time: a save holds an exclusive lock on ``path`` (``flock`` on the directory) from
start to end, so a second save into it, from another thread or process, raises ``BlockingIOError``
("another save ... is in progress") before it writes anything, and the first ends complete. Files
get the mode the umask gives a new file (``0o666`` less the umask), weights included.

Loading reads only JSON and safetensors (``use_safetensors=True``, ``local_files_only=True``: a
missing ``encoder/`` is an error, never a hub download), and strictly: weights with a tensor missing,
unexpected or of another shape than the encoder's config asks are refused, naming the tensors, with
``verify=False`` too (transformers would initialise a missing one at random).
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import NamedTuple, cast

import torch

from .._version import __version__
from ..runtime.checkpoint import HELD, atomic_write_text, exclusive, file_mode, remove_abandoned, staging_directory
from ..runtime.devices import resolve_dtype
from ..text.encoder import Encoder, weights_digest
from ..text.weights import IDF
from .config import ScorerConfig

FORMAT_VERSION = 1
CONFIG_FILE = "torchmover.json"
ENCODER_DIR = "encoder"
CENTERING_FILE = "centering.safetensors"
IDF_FILE = "idf.json"
PENDING_FILE = ".torchmover-saving.json"  # the files of a save in progress (removed when it completes)
MANIFEST_DIGEST = "manifest_sha256"  # the field of torchmover.json (and of the pending record) with their own digest


def save_scorer(scorer, path: str | os.PathLike) -> Path:
    """Write ``scorer`` to the directory ``path`` (layout and rules in the module docs); returns ``path``.

    Raises ``FileExistsError`` naming the files in the way (or ``path`` itself if it is a file), and
    ``BlockingIOError`` if another save into ``path`` is in progress (it holds the directory's lock).
    """
    check_signed_weights(scorer)
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"path {str(target)!r} exists and is not a directory")
    created = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    try:
        with exclusive(target, "save"):
            _save(scorer, target)
    except BaseException:
        if created:  # a failed first save leaves no empty directory behind
            with contextlib.suppress(OSError):
                target.rmdir()
        raise
    return target


def check_signed_weights(scorer) -> None:
    """Raise ``ValueError``, in one line, unless the encoder's weights are those ``scorer``'s signature
    pins: those :meth:`~torchmover.Scorer.mark_finetuned` hashed into its ``finetuned`` field, or, where
    it has none, those the scorer was built with (its model and revision's, or a saved scorer's). One
    :func:`~torchmover.text.encoder.weights_digest` of the encoder (about 0.045 s for the default model
    on a CPU core). A stale pin would save weights that no rebuild from the signature reaches."""
    now = weights_digest(scorer.encoder.model)
    if scorer.finetuned is not None:
        on, _, pinned = scorer.finetuned.rpartition("@weights-")
        if now != pinned:
            raise ValueError(f"the encoder's weights (weights-{now}) changed after mark_finetuned({on!r}) pinned "
                             f"weights-{pinned}: call mark_finetuned again before saving")
        return
    dtype, built = scorer._built_weights
    if now != built:
        converted = "" if scorer.encoder.dtype == dtype else f" (converted from {dtype} to {scorer.encoder.dtype})"
        raise ValueError(f"the encoder's weights (weights-{now}) are not those the scorer was built with and its "
                         f"signature pins (weights-{built}){converted}: after training, call "
                         "scorer.mark_finetuned(on) before saving")


def _save(scorer, target: Path) -> None:
    """:func:`save_scorer` into the existing directory ``target``, which this process holds."""
    from safetensors.torch import save_file

    staging = f".{target.name}.tmp-"
    remove_abandoned(target.parent, glob.escape(staging) + "*")  # left by a killed save of this path
    with staging_directory(target.parent, staging) as tmp:
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
            "encoder_dtype": str(encoder.dtype).removeprefix("torch."),
            "baseline": None if scorer.baseline is None else list(scorer.baseline),  # rescaling, fit_baseline
            "finetuned": scorer.finetuned,  # what the encoder was fine-tuned on (mark_finetuned), or None
            "signature": scorer.signature,  # informative only: the signature of the saved scorer
        }
        _install(tmp, target, meta)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_digest(record: dict) -> str:
    """SHA-256 of a record's canonical content: its JSON with sorted keys, no whitespace and ASCII
    escapes, without its :data:`MANIFEST_DIGEST` field. Re-indenting the file changes nothing; any
    changed key or value does."""
    content = {k: v for k, v in record.items() if k != MANIFEST_DIGEST}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode("ascii")).hexdigest()


def _signed(record: dict) -> dict:
    return {**record, MANIFEST_DIGEST: manifest_digest(record)}


def _is_signed(record) -> bool:
    return isinstance(record, dict) and record.get(MANIFEST_DIGEST) == manifest_digest(record)


def _saved_record(file: Path) -> dict | None:
    """The record a save wrote at ``file`` (``torchmover.json`` or the pending record), or None where
    there is none, or the file is not a save's (unreadable, not JSON, its own digest does not match)."""
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if _is_signed(record) else None


def _staged_files(tmp: Path) -> dict[str, str]:
    """``{relative POSIX path: SHA-256}`` of every file under ``tmp`` but its lock file, each fsync'ed
    (durable before it is moved into place) and given the mode the umask says (safetensors writes
    0600)."""
    files, mode = {}, file_mode()
    for file in sorted(p for p in tmp.rglob("*") if p.is_file() and p != tmp / HELD):
        os.chmod(file, mode)
        with open(file, "rb") as f:
            os.fsync(f.fileno())
        files[file.relative_to(tmp).as_posix()] = sha256_file(file)
    return files


def _earlier_save(target: Path) -> dict[str, str]:
    """The files earlier saves recorded in ``target``: in its ``torchmover.json`` and in the record of an
    interrupted save, where a save wrote them (:func:`_saved_record`; ``{}`` where there is none)."""
    recorded = {}
    for name in (CONFIG_FILE, PENDING_FILE):
        files = (_saved_record(target / name) or {}).get("files")
        if isinstance(files, dict):
            recorded.update({name: digest for name, digest in files.items() if _inside(name)})
    return recorded


def _inside(name: str) -> bool:
    """Whether the relative path ``name`` stays inside the directory it is relative to (no absolute
    path, no ``..``)."""
    return isinstance(name, str) and not Path(name).is_absolute() and ".." not in Path(name).parts


def _in_the_way(target: Path, names: list[str], ours: set[str]) -> list[str]:
    """The paths under ``target`` that writing ``names`` would overwrite although they are not ``ours``
    (a file at the name or at one of its parent folders; a folder where a file goes; a symbolic link
    where a folder goes, through which the save would write outside ``target``)."""
    blocking = set()
    for name in names:
        path = target / name
        if os.path.lexists(path) and (name not in ours or not path.is_file()):
            blocking.add(name)
        for parent in Path(name).parents:
            folder = target / parent
            if parent != Path(".") and os.path.lexists(folder) and (folder.is_symlink() or not folder.is_dir()):
                blocking.add(parent.as_posix())
    return sorted(blocking)


def _install(tmp: Path, target: Path, meta: dict) -> None:
    """Move the staged files of ``tmp`` into ``target`` and write ``torchmover.json`` (with their hashes)
    last; keep every file of ``target`` that no save wrote (see the module docs)."""
    staged = _staged_files(tmp)
    earlier = _earlier_save(target)
    records = {name for name in (CONFIG_FILE, PENDING_FILE) if _saved_record(target / name) is not None}
    in_the_way = _in_the_way(target, [*staged, CONFIG_FILE, PENDING_FILE], set(earlier) | records)
    if in_the_way:
        raise FileExistsError(f"cannot save into {str(target)!r}: {in_the_way} would be overwritten (or written "
                              "through) and were not written by an earlier save, or were changed since; move them or "
                              "choose another path")
    # Until the last step no save is visible; the pending record lets a retry after a crash recognise
    # the files this save (or the earlier one) wrote.
    atomic_write_text(target / PENDING_FILE, json.dumps(_signed({"files": {**earlier, **staged}})))
    (target / CONFIG_FILE).unlink(missing_ok=True)
    for name in staged:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / name, target / name)
    changed = []
    for name, digest in earlier.items():
        old = target / name
        if name in staged or not old.is_file():
            continue
        if sha256_file(old) == digest:
            old.unlink()
        else:
            changed.append(name)
    if changed:
        warnings.warn(f"kept {changed} in {str(target)!r}: written by an earlier save but changed since", stacklevel=3)
    atomic_write_text(target / CONFIG_FILE, json.dumps(_signed({**meta, "files": staged}), indent=2) + "\n")
    (target / PENDING_FILE).unlink()


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
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"corrupt {str(file)!r}: {e}") from e
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise ValueError(f"corrupt {str(file)!r}: expected an object with a 'config' object")
    if meta.get("format") != FORMAT_VERSION:
        raise ValueError(f"{str(file)!r} has format {meta.get('format')!r}; this torchmover reads format "
                         f"{FORMAT_VERSION} (saved by torchmover {meta.get('torchmover', 'unknown')})")
    return meta


def verify_manifest(root: Path, meta: dict) -> None:
    """Check ``torchmover.json`` against the digest of its own content (:func:`manifest_digest`)."""
    file = str(root / CONFIG_FILE)
    if MANIFEST_DIGEST not in meta:
        raise ValueError(f"{file!r} records no SHA-256 of its own content (saved by torchmover "
                         f"{meta.get('torchmover', 'unknown')}); load with verify=False to skip the check")
    if meta[MANIFEST_DIGEST] != manifest_digest(meta):
        raise ValueError(f"{file!r} does not match its own SHA-256 ({MANIFEST_DIGEST}): the file is corrupt or was "
                         "changed after saving (verify=False loads it anyway)")


def verify_files(root: Path, meta: dict) -> None:
    """Check ``torchmover.json`` (:func:`verify_manifest`), then every file it records against its
    SHA-256; errors name the file."""
    verify_manifest(root, meta)
    files = meta.get("files")
    if not isinstance(files, dict):
        raise ValueError(f"{str(root / CONFIG_FILE)!r} records no SHA-256 of the saved files (saved by torchmover "
                         f"{meta.get('torchmover', 'unknown')}); load with verify=False to skip the check")
    for name, digest in files.items():
        if not _inside(name):
            raise ValueError(f"{str(root / CONFIG_FILE)!r} lists {name!r}, a path outside the saved scorer")
        file = root / name
        if not file.is_file():
            raise FileNotFoundError(f"incomplete saved scorer {str(root)!r}: {name} is missing")
        if sha256_file(file) != digest:
            raise ValueError(f"{str(file)!r} does not match its SHA-256 in {CONFIG_FILE}: the file is corrupt or "
                             "was changed after saving (verify=False loads it anyway)")


class SavedScorer(NamedTuple):
    """What a saved scorer holds, read and checked (:func:`load_saved`): its config, its encoder, and
    the statistics fitted on a corpus (centering buffers, rescaling baseline, IDF dictionaries)."""

    config: ScorerConfig
    encoder: Encoder
    centering: dict[str, torch.Tensor]
    baseline: list[float] | None
    idf: dict[str, IDF]
    root: Path
    finetuned: str | None = None

    def restore(self, scorer) -> None:
        """Put the fitted statistics into ``scorer`` (built from :attr:`config` on :attr:`encoder`)."""
        missing = {name for name, _ in scorer.centering.named_buffers()} - set(self.centering)
        if missing:
            raise ValueError(f"{str(self.root / CENTERING_FILE)!r} lacks {sorted(missing)}")
        try:
            scorer.centering.load_state_dict(self.centering)
        except RuntimeError as e:  # a buffer of another shape
            raise ValueError(f"{str(self.root / CENTERING_FILE)!r} does not fit the encoder: {e}") from e
        if self.baseline is not None:
            try:
                scorer.baseline = self.baseline
            except (TypeError, ValueError) as e:
                raise ValueError(f"corrupt baseline in {str(self.root / CONFIG_FILE)!r}: {e}") from e
        if self.idf:
            scorer.idf = self.idf
        scorer._finetuned = self.finetuned


def load_saved(path: str | os.PathLike, dtype: str | torch.dtype | None = None, verify: bool = True) -> SavedScorer:
    """Read a scorer saved by :func:`save_scorer` (JSON and safetensors only, no network):
    :class:`SavedScorer`, whose encoder is in ``dtype`` (default: the dtype it was saved in) on the CPU.

    ``verify`` checks ``torchmover.json`` against its own digest and every saved file against the
    SHA-256 it records first (:func:`verify_files`). Every error names the file it comes from.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    dtype = resolve_dtype(dtype)
    root = Path(path)
    meta = read_meta(root)
    if verify:
        verify_files(root, meta)
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

    model, tokenizer = _load_encoder_files(root / ENCODER_DIR)
    saved_dtype = getattr(torch, str(meta.get("encoder_dtype", "float32")), None)
    dtype = dtype or (saved_dtype if isinstance(saved_dtype, torch.dtype) else None)
    if dtype is not None:
        model = model.to(dtype)
    try:
        # a saved config is resolved (ScorerConfig.resolve): its encoder fields are set
        encoder = Encoder(model.eval(), tokenizer, cast(int, config.layer), name=config.model,
                          revision=config.revision, max_length=config.max_length,
                          special_tokens=cast(str, config.special_tokens),
                          power_mean_layers=cast(int, config.power_mean_layers))
    except (TypeError, ValueError) as e:
        raise ValueError(f"the encoder in {str(root / ENCODER_DIR)!r} does not fit the config in "
                         f"{str(root / CONFIG_FILE)!r}: {e}") from e
    try:
        buffers = load_file(str(root / CENTERING_FILE))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"corrupt {str(root / CENTERING_FILE)!r}: {e}") from e
    idf = {}
    listed = meta.get("files")
    if IDF_FILE in listed if isinstance(listed, dict) else (root / IDF_FILE).is_file():
        try:
            saved = json.loads((root / IDF_FILE).read_text(encoding="utf-8"))
            idf = {side: IDF.from_dict(saved[side]) for side in ("hyp", "ref")}
        except (OSError, KeyError, TypeError, ValueError) as e:  # UnicodeDecodeError, JSONDecodeError: ValueErrors
            raise ValueError(f"corrupt {str(root / IDF_FILE)!r}: {e}") from e
    finetuned = meta.get("finetuned")
    if finetuned is not None and not isinstance(finetuned, str):
        raise ValueError(f"corrupt 'finetuned' in {str(root / CONFIG_FILE)!r}: expected a string, got {finetuned!r}")
    return SavedScorer(config, encoder, buffers, meta.get("baseline"), idf, root, finetuned)


def _load_encoder_files(directory: Path):
    """The model and tokenizer saved in ``directory`` (safetensors and JSON only, no network). Errors
    name the file at fault where it can be told (a JSON file that does not parse, a weights file
    whose header does not), else the files the model or the tokenizer was read from. Any exception of
    transformers or tokenizers counts: a corrupt file surfaces as any of them (a ``TypeError``, a
    ``RuntimeError`` on mismatched sizes, a bare ``Exception`` from the Rust tokenizer)."""
    from safetensors import safe_open
    from transformers import AutoModel, AutoTokenizer

    files = sorted(p for p in directory.iterdir() if p.is_file())
    weights = [p for p in files if p.suffix == ".safetensors"]
    for file in files:
        try:
            if file.suffix == ".json":
                json.loads(file.read_text(encoding="utf-8"))
            elif file in weights:
                with safe_open(str(file), framework="pt"):
                    pass
        except Exception as e:  # noqa: BLE001 (see the docstring)
            raise ValueError(f"corrupt {str(file)!r}: {e}") from e
    try:
        model, report = AutoModel.from_pretrained(directory, use_safetensors=True, local_files_only=True,
                                                  output_loading_info=True)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"cannot load the encoder from {str(directory / 'config.json')!r} and its weights "
                         f"{[p.name for p in weights]}: {e}") from e
    wrong = {kind: sorted(report.get(f"{kind}_keys") or ()) for kind in ("missing", "unexpected", "mismatched")}
    if any(wrong.values()):  # transformers would fill them with random values, or drop them
        listed = "; ".join(f"{kind} tensors {names[:8]}" + (f" and {len(names) - 8} more" if len(names) > 8 else "")
                           for kind, names in wrong.items() if names)
        raise ValueError(f"the weights {[str(p) for p in weights]} do not fit {str(directory / 'config.json')!r}: "
                         f"{listed}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, use_fast=True, local_files_only=True)
    except Exception as e:  # noqa: BLE001
        names = [p.name for p in files if p.name != "config.json" and p not in weights]
        raise ValueError(f"cannot load the tokenizer from {str(directory)!r} ({', '.join(names)}): {e}") from e
    return model, tokenizer
