"""Scoring corpora larger than memory, on one process or many, resumably: :func:`score_files`.

``score_files(scorer, Column("hyps.txt"), [Column("refs.txt")], "scores.jsonl")`` (the command line's
``torchmover score --hyps ... --refs ... --output ...``) reads the inputs in chunks of ``chunk_pairs``
pairs and writes each chunk's scores as soon as it is scored:

- **Input** (:func:`read_column`): text files (one text per line), JSON lines (a field of each
  record; ``.jsonl``, ``.ndjson`` or ``.json``), Parquet and Arrow IPC / Feather files (a column;
  through ``pyarrow``, the ``parquet`` extra). A reference row is a text or a list of texts (several
  references). Every input is read once before any work (:func:`check_inputs`): an undecodable row, a
  text that is not valid Unicode (a lone surrogate, which a JSON escape can hold), a row of the wrong
  type, an empty file or a row-count mismatch is reported naming the file and the line (or row); so
  is a field given for a text file, which has none.
- **Memory** is bounded by the chunk (:mod:`torchmover.scorer.corpus`), never by the corpus; passes
  that fit a statistic on the whole corpus keep 8 bytes per distinct text to count each once
  (:class:`~torchmover.scorer.corpus.SeenTexts`).
- **Sharded** under ``torch.distributed`` (``torchrun``): rank 0 reads the inputs and sends each chunk
  to every rank (only rank 0 needs the files and the output directory); each rank scores a share of
  the chunk, balanced by token count; rank 0 writes the chunk in input order. The scores equal one
  process's, ``batch`` centering included (the mean of the whole corpus's distinct texts, from a
  first pass over it).
- **Resumable**: each finished chunk is written atomically as a part file in ``<output>.parts/``;
  the output itself is assembled from the parts atomically once all are there. A run is recorded in
  ``<output>.manifest.json`` — the SHA-256 of every input, the fields, the scorer's options and then
  its signature, the output settings — before any work. Rerunning the same command after a crash
  (any rank killed) skips the chunks already written (and the statistics already fitted, kept in the
  parts directory): no row is lost or written twice. Rerunning it with other inputs or options is
  refused, naming what differs (``overwrite=True`` starts over), and so is finishing a run whose
  input changed while it ran (each input is hashed again at the end: :func:`check_unchanged`, and
  on resume against the manifest); rerunning a finished run does
  nothing while its output is the file it wrote (its SHA-256 is recorded), and is refused once that
  file is gone or changed. An output that is one of the inputs, or a directory, is refused before
  anything is read or written.

The statistics a scorer fits on the call's texts (:func:`~torchmover.evaluation.scoring.fit_to_call`:
IDF, a ``fixed`` / ``running`` centering mean, the rescaling baseline) are fitted on the streamed
corpus (:func:`fit_to_corpus`), equal to ``fit_to_call`` on the whole lists.
"""
from __future__ import annotations

import codecs
import dataclasses
import hashlib
import itertools
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence, cast

import torch
import torch.distributed as dist

from ..runtime.checkpoint import atomic_write, atomic_write_text
from ..runtime.distributed import broadcast_object
from ..runtime.progress import PairProgress
from ..scorer import Scorer
from ..scorer.corpus import (SCORE_CHUNK, SeenTexts, call_means, check_batch_size, eval_mode, score_chunk,
                             sharding_group, token_sums)
from ..scorer.inputs import check_text, stripped
from ..scorer.module import baseline_draws
from ..scorer.serialization import sha256_file
from ..scorer.units import BatchMeans
from ..text.weights import frequency_counts, idf_of_counts, warn_if_weightless

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".arrow": "arrow",
           ".feather": "arrow", ".ipc": "arrow"}  # any other suffix: a text file, one text per line
FIELD_SUFFIXES = ", ".join(FORMATS)  # for messages: the suffixes of the files that have fields
RUN_FORMAT = 1  # the manifest's layout


class InputError(ValueError):
    """Bad input, found before any work: names the file and the line (or row)."""


class Column(NamedTuple):
    """One input column: a file, and for JSON lines / Parquet / Arrow the ``field`` (column) that holds
    it. A text file has no fields: :func:`read_column` refuses one given for it."""

    path: str
    field: str | None = None

    @property
    def format(self) -> str:
        """``text``, ``jsonl``, ``parquet`` or ``arrow``, by the file's suffix (:data:`FORMATS`)."""
        return FORMATS.get(Path(self.path).suffix.lower(), "text")

    @property
    def row_name(self) -> str:
        return "line" if self.format in ("text", "jsonl") else "row"


# --- reading --------------------------------------------------------------------------------------

def read_column(column: Column, references: bool = False) -> Iterator[str | list[str]]:
    """The rows of ``column``, one at a time: texts, or for ``references`` a text or a non-empty list
    of texts each. Raises :class:`InputError` naming the file and the line (or row) of the first bad
    one: not UTF-8, not JSON, no such field, a null, a value of another type, a text that is not valid
    Unicode; and a file that is not there, or that has no fields where ``column`` names one."""
    require_regular_file(column.path)
    check_field_applies(column)
    if column.format != "text" and not column.field:
        raise InputError(f"{column.path}: a {column.format} file needs the field (column) that holds the texts")
    rows = {"text": _text_rows, "jsonl": _jsonl_rows, "parquet": _parquet_rows, "arrow": _arrow_rows}[column.format]
    for number, value in enumerate(rows(column), 1):
        yield _checked(value, column, number, references)


def require_regular_file(path: str | os.PathLike) -> None:
    """An :class:`InputError` unless ``path`` is a regular file: each input is read more than once (the
    check, the hash, the chunks), which a pipe (``<(...)``, ``/dev/stdin``) cannot be."""
    if Path(path).is_file():
        return
    if Path(path).exists():
        raise InputError(f"{path} is not a regular file (a pipe?): torchmover reads each input more than once; "
                         "write it to a file first")
    raise InputError(f"no such file: {path}")


def check_field_applies(column: Column) -> None:
    """An :class:`InputError` naming the file where ``column`` gives a field for a file read as text."""
    if column.format == "text" and column.field is not None:
        raise InputError(f"{column.path} is read as text, one text per line, which has no field {column.field!r}: "
                         f"fields are read from {FIELD_SUFFIXES} files")


def _checked(value, column: Column, number: int, references: bool) -> str | list[str]:
    """``value`` if it is a valid Unicode text (or, for ``references``, a non-empty list of them), else
    :class:`InputError`."""
    where = f"{column.path} {column.row_name} {number}"
    if isinstance(value, str) or references and _is_text_list(value):
        for text in [value] if isinstance(value, str) else value:
            try:
                check_text(where, text)
            except ValueError as error:
                raise InputError(str(error)) from None
        return value
    if value is None:
        raise InputError(f"{where}: the {column.field!r} value is null")
    expected = "a text or a non-empty list of texts" if references else "a text"
    raise InputError(f"{where}: the {column.field!r} value must be {expected}, got {described_value(value)}")


def _is_text_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


def described_value(value) -> str:
    """``value`` for a message, at most 80 characters: as JSON where it is JSON (what a JSON line
    held), else its type and ``repr`` (a Parquet or Arrow value: bytes, a timestamp, ...)."""
    try:
        return json.dumps(value)[:80]
    except (TypeError, ValueError):
        return f"{type(value).__name__} {repr(value)[:80]}"


def read_lines(path: str | os.PathLike) -> list[str]:
    """The texts of the text file ``path``, one a line, read as a text column is (:func:`read_column`,
    whatever the suffix): ``\\n`` or ``\\r\\n`` ends a line, strictly UTF-8. Raises :class:`InputError`
    naming the file (and the line of an undecodable one)."""
    require_regular_file(path)
    return list(_text_rows(Column(str(path))))


def _text_rows(column: Column) -> Iterator[str]:
    """One text per line (``\\n`` or ``\\r\\n`` ends), strictly UTF-8; a byte-order mark that starts the
    file (as some Windows editors write) is not part of its first text, as it is not of a JSON file's."""
    with open(column.path, "rb") as f:
        for number, line in enumerate(f, 1):
            line = line.removeprefix(codecs.BOM_UTF8) if number == 1 else line
            line = line[:-1] if line.endswith(b"\n") else line
            line = line[:-1] if line.endswith(b"\r") else line
            try:
                yield line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise InputError(f"{column.path} line {number}: not valid UTF-8 (byte 0x{line[error.start]:02x} "
                                 f"at column {error.start + 1})") from None


def _jsonl_rows(column: Column) -> Iterator:
    """The ``field`` of the JSON object on each line."""
    with open(column.path, "rb") as f:
        for number, line in enumerate(f, 1):
            where = f"{column.path} line {number}"
            try:
                record = json.loads(line)
            except UnicodeDecodeError:
                raise InputError(f"{where}: not valid UTF-8") from None
            except ValueError as error:
                raise InputError(f"{where}: not a JSON record ({error.args[0].split(':')[0]})") from None
            if not isinstance(record, dict) or column.field not in record:
                raise InputError(f"{where}: no field {column.field!r}")
            yield record[column.field]


def require_pyarrow():
    """``pyarrow``, or ``ImportError`` saying how to install it."""
    try:
        import pyarrow
    except ImportError:
        raise ImportError("Parquet and Arrow input needs pyarrow: pip install 'torchmover[parquet]'") from None
    return pyarrow


def _parquet_rows(column: Column) -> Iterator:
    """The ``field`` column of a Parquet file, read batch by batch."""
    pa = require_pyarrow()
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(column.path)
    except pa.ArrowException as error:
        raise InputError(f"{column.path}: not a Parquet file ({error})") from None
    _check_field(column, file.schema_arrow.names)
    for batch in file.iter_batches(batch_size=4096, columns=[column.field]):
        yield from batch.column(0).to_pylist()


def _arrow_rows(column: Column) -> Iterator:
    """The ``field`` column of an Arrow IPC file (Feather v2) or stream, read batch by batch."""
    pa = require_pyarrow()
    with pa.memory_map(column.path) as source:
        try:
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            source.seek(0)
            try:
                reader = batches = pa.ipc.open_stream(source)
            except pa.ArrowInvalid as error:
                raise InputError(f"{column.path}: not an Arrow IPC file or stream ({error})") from None
        _check_field(column, reader.schema.names)
        index = reader.schema.get_field_index(column.field)
        for batch in batches:
            yield from batch.column(index).to_pylist()


def _check_field(column: Column, names: Sequence[str]) -> None:
    """An :class:`InputError` unless the table's column ``names`` hold ``column.field`` exactly once."""
    if column.field not in names:
        raise InputError(f"{column.path}: no column {column.field!r} (it has {', '.join(map(repr, names))})")
    if names.count(column.field) > 1:
        raise InputError(f"{column.path}: {names.count(column.field)} columns are named {column.field!r}: "
                         "which holds the texts is ambiguous; give each column its own name")


def check_inputs(hyps: Column, refs: Sequence[Column]) -> int:
    """Read every input once, before any work: every row is checked (:func:`read_column`), no file
    is empty, and every reference file has as many rows as the hypotheses. Returns that number."""
    if not refs:
        raise InputError("no reference file")
    counts = []
    for k, column in enumerate((hyps, *refs)):
        counts.append(sum(1 for _ in read_column(column, references=k > 0)))
        if not counts[-1]:
            raise InputError(f"{column.path} is empty")
    for column, count in zip(refs, counts[1:]):
        if count != counts[0]:
            raise InputError(f"{column.path} has {count} {column.row_name}s but {hyps.path} has {counts[0]}: "
                             f"one reference {column.row_name} per hypothesis")
    return counts[0]


def read_chunks(hyps: Column, refs: Sequence[Column], chunk_pairs: int) -> Iterator[tuple[list[str], list[list[str]]]]:
    """The pairs, ``chunk_pairs`` at a time: ``(hypotheses, references of each)``; a hypothesis's
    references are its row of every reference column, in order (a list row gives several). Texts are
    :func:`~torchmover.scorer.inputs.stripped`, as every entry point's are."""
    rows = zip(read_column(hyps), *(read_column(c, references=True) for c in refs))
    while chunk := list(itertools.islice(rows, chunk_pairs)):
        yield (stripped([row[0] for row in chunk]),
               [stripped([r for value in row[1:] for r in ([value] if isinstance(value, str) else value)])
                for row in chunk])


# --- every rank: what rank 0 reads ----------------------------------------------------------------

def on_rank0(fn: Callable, device, group):
    """``fn()`` run on rank 0 of ``group`` only and its result on every rank (``fn()`` itself outside a
    group). An error it raises is raised on every rank, so that no rank waits for one that failed."""
    if group is None:
        return fn()
    result = error = None
    if dist.get_rank(group) == 0:
        try:
            result = fn()
        except (ValueError, OSError, ImportError) as failure:
            error = failure
    result, error = broadcast_object((result, error), device, group=group)
    if error is not None:
        raise error
    return result


def shared_chunks(read: Callable[[], Iterator], device, group) -> Iterator:
    """The items of ``read()`` (called on rank 0 only) on every rank of ``group``, one broadcast each."""
    if group is None:
        yield from read()
        return
    items = read() if dist.get_rank(group) == 0 else None
    # the lambda runs on rank 0 only, where items is read()'s iterator
    while (item := on_rank0(lambda: next(cast(Iterator, items), None), device, group)) is not None:
        yield item


# --- statistics fitted on the corpus --------------------------------------------------------------

def fit_to_corpus(scorer: Scorer, chunks: Callable[[], Iterator[tuple[list[str], list[list[str]]]]], *,
                  batch_size: int = 64, baseline_corpus: Sequence[str] | None = None, baseline_pairs: int = 1000,
                  group=None, bar: PairProgress | None = None) -> Scorer:
    """:func:`~torchmover.evaluation.scoring.fit_to_call` on a corpus streamed in chunks (``chunks()``: a
    fresh iterator of ``(hypotheses, references)`` chunks, the same on every rank of ``group``), with
    the same result: IDF on the distinct references and hypotheses, a ``fixed`` / ``running`` centering
    mean on the distinct references (each rank encoding a share), the rescaling baseline on
    ``baseline_corpus`` or on pairs of distinct non-empty references drawn as
    :meth:`~torchmover.Scorer.fit_baseline` draws them. One pass over the corpus per statistic (the
    IDF's and the references' count without the encoder). An IDF dictionary that weighs every token 0
    (a side of one distinct text) warns (:func:`~torchmover.text.weights.warn_if_weightless`)."""
    config, device = scorer.config, scorer.encoder.device
    draw_references = config.rescale and baseline_corpus is None
    if config.idf or draw_references:
        counts, n_references = text_counts(scorer, chunks(), group, idf=config.idf)
        if config.idf:
            scorer.idf = {side: idf_of_counts(summed(counts[side].to(device), group)) for side in counts}
            warn_if_weightless({"references": scorer.idf["ref"], "hypotheses": scorer.idf["hyp"]})
    if config.centering in ("fixed", "running"):
        sums = token_sums(scorer, chunks(), batch_size, ("ref",), group=group, bar=bar, weight=0.5)[0][0]
        dim = len(sums) - 2  # Σ x, then the number of tokens (and of texts with a unit)
        scorer.centering.fit_sums(sums[:dim], int(sums[dim]))
    if draw_references:
        first, second = baseline_draws(n_references, baseline_pairs)
        texts = drawn_references(chunks(), set(first) | set(second))
        scorer.fit_baseline_pairs([texts[i] for i in first], [texts[j] for j in second], batch_size, progress=False)
    elif config.rescale:
        scorer.fit_baseline(cast(Sequence[str], baseline_corpus),  # given: not drawn
                            n_pairs=baseline_pairs, batch_size=batch_size, progress=False)
    return scorer


def summed(counts: torch.Tensor, group) -> torch.Tensor:
    """``counts`` summed over the ranks of ``group`` (``counts`` itself when None)."""
    if group is not None:
        dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=group)
    return counts


def text_counts(scorer: Scorer, chunks: Iterator, group, idf: bool) -> tuple[dict[str, torch.Tensor], int]:
    """One pass without the encoder: with ``idf``, the dense document frequencies
    (:func:`~torchmover.text.weights.frequency_counts`) of the distinct references and hypotheses, each
    rank counting every ``world``-th new text (to be summed over the ranks); and the number of
    distinct non-empty references."""
    tokenizer = scorer.encoder.tokenizer
    rank, world = (dist.get_rank(group), dist.get_world_size(group)) if group is not None else (0, 1)
    seen = {"ref": SeenTexts(), "hyp": SeenTexts(), "nonempty": SeenTexts()}
    counts = {"ref": torch.zeros(len(tokenizer) + 1, dtype=torch.long)}
    counts["hyp"] = counts["ref"].clone()
    for hyps, groups in chunks:
        references = [r for g in groups for r in g]
        seen["nonempty"].new(r for r in references if r.strip())
        if idf:
            for side, texts in (("ref", references), ("hyp", hyps)):
                mine = seen[side].new(texts)[rank::world]
                counts[side] += frequency_counts(mine, tokenizer, scorer.encoder.max_length)
    return counts, len(seen["nonempty"])


def drawn_references(chunks: Iterator, positions: set[int]) -> dict[int, str]:
    """The distinct non-empty references at ``positions`` (in order of first appearance), one pass."""
    seen, found = SeenTexts(), {}
    for _, groups in chunks:
        start = len(seen)
        for k, text in enumerate(seen.new(r for g in groups for r in g if r.strip())):
            if start + k in positions:
                found[start + k] = text
    return found


# --- the run's files ------------------------------------------------------------------------------

class RunError(ValueError):
    """An output that another run wrote, or is writing, or that the run must not write."""


def same_path(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` name one file: the same file where both exist (links included), else the
    same resolved path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def check_output(output: str | os.PathLike, inputs: Mapping[str, Sequence[str]], option: str = "--output",
                 holds: Callable[[str], bool] | None = None) -> None:
    """Refuse (:class:`RunError`), before anything is read or written, an output (given as ``option``)
    that is a directory, or that would replace or remove one of the ``inputs`` (the paths of each input
    option, by the option's name), or that lies inside an input directory. ``holds(path)``: whether
    writing the output replaces or removes ``path`` (default: the output's run files,
    :meth:`RunFiles.holds`)."""
    holds = holds or RunFiles(output).holds
    if Path(output).is_dir():
        raise RunError(f"{option} {output} is a directory: give the path of a file")
    for input_option, paths in inputs.items():
        for path in paths:
            inside = Path(path).is_dir() and Path(path).resolve() in Path(output).resolve().parents
            if inside:
                raise RunError(f"{option} {output} is inside an input directory ({input_option} {path}): the run "
                               f"would write among the files it reads; give another {option}")
            if holds(path):
                raise RunError(f"{option} {output} is also an input ({input_option} {path}): the run would replace "
                               f"or remove it; give another {option}")


class RunFiles:
    """The files of a run writing ``output``: ``<output>.manifest.json`` (what the run is, whether it
    finished), ``<output>.parts/`` (one file per finished chunk — a JSON header line with its row
    count and column sums, then its output lines — and ``statistics.pt``, the fitted statistics),
    and the output, assembled from the parts once all are there; the parts are then removed."""

    def __init__(self, output: str | os.PathLike):
        self.output = Path(output)
        self.manifest = self.output.with_name(self.output.name + ".manifest.json")
        self.parts = self.output.with_name(self.output.name + ".parts")
        self.statistics = self.parts / "statistics.pt"

    def part(self, chunk: int) -> Path:
        return self.parts / f"{chunk:08d}.part"

    def holds(self, path: str | os.PathLike) -> bool:
        """Whether ``path`` is one of the run's files: the output, the manifest, the parts directory or
        a file in it."""
        inside_parts = self.parts.resolve() in Path(path).resolve().parents
        return inside_parts or any(same_path(path, own) for own in (self.output, self.manifest, self.parts))

    def recorded(self) -> dict | None:
        if not self.manifest.is_file():
            return None
        try:
            return json.loads(self.manifest.read_text(encoding="utf-8"))
        except ValueError:
            raise RunError(f"{self.manifest} is not a torchmover run manifest: remove it or give --overwrite") from None

    def begin(self, run: dict, overwrite: bool) -> dict:
        """Start the run ``run`` (its manifest, without a signature yet) or resume it: returns the
        recorded manifest (``finished``, ``signature``) and the chunks already written (``done``).
        Refuses (:class:`RunError`) to resume another run, to replace files no run recorded, or to
        take a finished run whose output is gone or changed as done, unless ``overwrite``."""
        recorded = self.recorded()
        if recorded is not None and not overwrite:
            differ = [key for key in ("inputs", "options", "output", "baseline_corpus")
                      if recorded.get(key) != run.get(key)]
            if differ:
                raise RunError(f"{self.output} belongs to a run with other {', '.join(differ)} ({self.manifest}): "
                               "resuming it would mix two runs' scores. Give --overwrite to start over, or "
                               "another --output")
            if recorded["finished"]:
                self.check_finished(recorded)
                shutil.rmtree(self.parts, ignore_errors=True)  # left by a run stopped as it was finishing
            done = sorted(int(p.stem) for p in self.parts.glob("*.part")) if self.parts.is_dir() else []
            return {**recorded, "done": done}
        if recorded is None and not overwrite:
            self.check_unrecorded()
        self.clear()  # and a parts directory left by a run killed before it wrote its manifest
        atomic_write_text(self.manifest, json.dumps({**run, "finished": False}, indent=1) + "\n")
        self.parts.mkdir()  # after the manifest: no parts directory without a run that recorded it
        return {**run, "finished": False, "done": []}

    def check_finished(self, recorded: dict) -> None:
        """Refuse (:class:`RunError`) to take the finished run ``recorded`` as done when its output is
        gone, or is no longer the file it wrote (the SHA-256 recorded when it finished)."""
        if not self.output.is_file():
            raise RunError(f"{self.output} is missing, though the run recorded in {self.manifest} finished: "
                           "give --overwrite to score it again")
        if sha256_file(str(self.output)) != recorded.get("output_sha256"):
            raise RunError(f"{self.output} changed since the run recorded in {self.manifest} finished (its SHA-256 "
                           "is not the recorded one): give --overwrite to score it again")

    def check_unrecorded(self) -> None:
        """Refuse (:class:`RunError`) to replace an output, or a file where the parts directory goes,
        that no run recorded (there is no manifest)."""
        if self.output.exists():
            raise RunError(f"{self.output} exists and no torchmover run recorded it ({self.manifest} is missing): "
                           "give --overwrite to replace it, or another --output")
        if self.parts.exists() and not self.parts.is_dir():
            raise RunError(f"{self.parts} exists and is not a run's parts directory: remove it, or give another "
                           "--output")

    def clear(self) -> None:
        for path in (self.output, self.manifest):
            path.unlink(missing_ok=True)
        shutil.rmtree(self.parts, ignore_errors=True)

    def record(self, **fields) -> None:
        """Update the manifest (atomically) with ``fields``."""
        recorded = cast(dict, self.recorded())  # begin wrote the manifest first
        atomic_write_text(self.manifest, json.dumps({**recorded, **fields}, indent=1) + "\n")

    def write_part(self, chunk: int, text: str, rows: int, sums: list[float]) -> None:
        atomic_write_text(self.part(chunk), json.dumps({"rows": rows, "sums": sums}) + "\n" + text)

    def assemble(self, chunks: int) -> tuple[int, list[float]]:
        """Write the output from the parts ``0 … chunks − 1`` (atomically), remove the parts; returns
        the row count and the column sums."""
        totals: dict[str, Any] = {"rows": 0, "sums": None}

        def copy_parts(out) -> None:
            for chunk in range(chunks):
                with open(self.part(chunk), "rb") as part:
                    header = json.loads(part.readline())
                    shutil.copyfileobj(part, out)
                totals["rows"] += header["rows"]
                totals["sums"] = header["sums"] if totals["sums"] is None else [
                    a + b for a, b in zip(totals["sums"], header["sums"])]

        atomic_write(self.output, copy_parts)
        rows, sums = totals["rows"], totals["sums"]
        return rows, sums


# --- the job --------------------------------------------------------------------------------------

@dataclasses.dataclass
class CorpusResult:
    """What :func:`score_files` did: ``rows`` scored, the ``means`` of each output column (``score``,
    or ``precision``, ``recall``, ``f1``), the scorer's ``signature``, the ``output`` path (None:
    standard output), the chunks ``resumed`` (already written by an earlier run) and whether the
    run had ``finished`` before (nothing was done)."""

    rows: int
    means: dict[str, float]
    signature: str
    output: str | None
    resumed: int = 0
    already_finished: bool = False


def score_files(scorer: Scorer, hyps: Column, refs: Sequence[Column], output: str | os.PathLike | None = None, *,
                format: str = "text", return_all: bool = False, chunk_pairs: int = SCORE_CHUNK, batch_size: int = 64,
                progress: bool | None = None, overwrite: bool = False, fit: bool = True,
                baseline_corpus: Sequence[str] | None = None, distributed: bool = True) -> CorpusResult:
    """Score the pairs of ``hyps`` (a :class:`Column`) against ``refs`` (one or more) into ``output``
    (None: standard output), streaming, sharded over the ranks of a ``torch.distributed`` job
    (``distributed``) and resumable (module docs).

    ``format``: ``text`` (one score per line; ``return_all``: ``P R F1``) or ``jsonl``
    (``{"line": n, "score": s}``; ``return_all``: ``precision``, ``recall``, ``f1``). ``fit``: fit the
    statistics the scorer's options ask for on the corpus (:func:`fit_to_corpus`). A collective
    under ``torch.distributed``: every rank calls it with the same arguments; only rank 0 reads the
    inputs and writes. Returns a :class:`CorpusResult` (on every rank).
    """
    if format not in ("text", "jsonl"):
        raise ValueError(f"format must be 'text' or 'jsonl', got {format!r}")
    if type(chunk_pairs) is not int or chunk_pairs < 1:
        raise ValueError(f"chunk_pairs must be a positive int, got {chunk_pairs!r}")
    check_batch_size(batch_size)
    group, device = sharding_group(scorer, distributed), scorer.encoder.device
    refs = list(refs)
    if output is not None:
        inputs = {"--hyps": [hyps.path], "--refs": [column.path for column in refs]}
        on_rank0(lambda: check_output(output, inputs), device, group)
    run = on_rank0(lambda: describe_run(scorer, hyps, refs, format, return_all, chunk_pairs, baseline_corpus),
                   device, group)
    files = None if output is None else RunFiles(output)
    state: dict[str, Any] = {"done": [], "finished": False} if files is None else \
        on_rank0(lambda: files.begin(run, overwrite), device, group)
    columns = ["precision", "recall", "f1"] if return_all else ["score"]
    if state["finished"]:
        return CorpusResult(state["rows"], dict(zip(columns, state["means"])), state["signature"], str(output),
                            already_finished=True)
    n_chunks = -(-run["rows"] // chunk_pairs)

    def chunks() -> Iterator[tuple[list[str], list[list[str]]]]:  # every rank: the chunks rank 0 reads
        return shared_chunks(lambda: read_chunks(hyps, refs, chunk_pairs), device, group)

    todo = set(range(n_chunks)) - set(state["done"])
    rows_todo = sum(min(chunk_pairs, run["rows"] - c * chunk_pairs) for c in todo)
    with eval_mode(scorer), torch.no_grad(), PairProgress(rows_todo, progress) as bar:
        bar.plan(rows_todo)  # the scoring pass; prepare adds the passes it makes
        means = prepare(scorer, files, chunks, fit, batch_size, baseline_corpus, group, bar, run["rows"])
        signature = scorer.signature
        if files is not None:
            on_rank0(lambda: check_signature(files, state, signature), device, group)
        sums = [0.0] * len(columns)
        for index, (chunk_hyps, chunk_groups) in enumerate(chunks() if todo else ()):
            if index not in todo:
                continue
            scores = score_chunk(scorer, chunk_hyps, chunk_groups, batch_size, means=means, return_all=return_all,
                                 group=group, bar=bar).double().cpu()
            if group is None or dist.get_rank(group) == 0:
                part_sums = scores.sum(1).tolist()
                sums = [a + b for a, b in zip(sums, part_sums)]
                text = format_rows(scores, index * chunk_pairs, format, columns)
                if files is None:
                    sys.stdout.write(text)
                    sys.stdout.flush()
                else:
                    files.write_part(index, text, len(chunk_hyps), part_sums)
    on_rank0(lambda: check_unchanged(hyps, refs, run), device, group)
    if files is None:
        return CorpusResult(run["rows"], {c: s / run["rows"] for c, s in zip(columns, sums)}, signature, None)
    rows, sums = on_rank0(lambda: finish(files, n_chunks), device, group)
    return CorpusResult(rows, dict(zip(columns, (s / rows for s in sums))), signature, str(output),
                        resumed=len(state["done"]))


def describe_run(scorer: Scorer, hyps: Column, refs: list[Column], format: str, return_all: bool, chunk_pairs: int,
                 baseline_corpus) -> dict:
    """The manifest of a run (before any work): its inputs (checked: :func:`check_inputs`; each by its
    SHA-256 and field), the scorer's options, the output's layout."""
    rows = check_inputs(hyps, refs)

    def described(column: Column) -> dict:
        return {"field": column.field, "sha256": sha256_file(column.path)}  # a text column has none (checked)
    baseline = None if baseline_corpus is None else hashlib.sha256(json.dumps(list(baseline_corpus)).encode()).hexdigest()
    options = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(scorer.config).items()}
    return {"torchmover_run": RUN_FORMAT, "rows": rows, "paths": {"hyps": hyps.path, "refs": [c.path for c in refs]},
            "inputs": {"hyps": described(hyps), "refs": [described(c) for c in refs]},
            "options": options, "baseline_corpus": baseline,
            "output": {"format": format, "all": return_all, "chunk_pairs": chunk_pairs}, "signature": None}


def check_unchanged(hyps: Column, refs: list[Column], run: dict) -> None:
    """A :class:`RunError` naming each input whose SHA-256 is no longer the one recorded when the run
    began (:func:`describe_run`; a resumed run was checked against it then): its scores would mix two
    versions of the file, so the run is not finished."""
    recorded = [run["inputs"]["hyps"], *run["inputs"]["refs"]]
    changed = [column.path for column, then in zip([hyps, *refs], recorded) if sha256_file(column.path) != then["sha256"]]
    if changed:
        raise RunError(f"{', '.join(changed)} changed while the run scored it (its SHA-256 differs from the one "
                       "recorded when the run began): the scores would mix two versions, so the run is left "
                       "unfinished; give --overwrite to score the files as they are now")


def prepare(scorer: Scorer, files: RunFiles | None, chunks, fit: bool, batch_size: int, baseline_corpus, group,
            bar: PairProgress, rows: int) -> BatchMeans | None:
    """The statistics of the run: restored from the parts directory when a run resumes, else fitted
    on the ``chunks()`` of the corpus of ``rows`` pairs (:func:`fit_to_corpus`) and, under ``batch``
    centering, the mean of its distinct texts (a pass of the encoder over it), then saved there. The
    bar counts those passes too. Returns the batch means (or None)."""
    device = scorer.encoder.device
    saved = None if files is None else on_rank0(lambda: load_statistics(files), device, group)
    if saved is not None:
        return restore_statistics(scorer, saved)
    config = scorer.config
    centered = config.centering == "batch"
    references_mean = fit and config.centering in ("fixed", "running")  # a pass over the references alone
    bar.plan(rows * (centered + 0.5 * references_mean))
    if fit:
        fit_to_corpus(scorer, chunks, batch_size=batch_size, baseline_corpus=baseline_corpus, group=group, bar=bar)
    means = call_means(scorer, chunks(), batch_size, group=group, bar=bar)[0] if centered else None
    if files is not None:
        on_rank0(lambda: save_statistics(files, scorer, means), device, group)
    return means


def check_signature(files: RunFiles, state: dict, signature: str) -> None:
    """Record the scorer's signature once its statistics are fitted; a resumed run must have the
    recorded one (the same options and inputs, but another library version, say, would mix scores)."""
    if state.get("signature") not in (None, signature):
        raise RunError(f"{files.output}: the run recorded in {files.manifest} scored with signature\n  "
                       f"{state['signature']}\nthis one would score with\n  {signature}\ngive --overwrite to start over")
    if state.get("signature") is None:
        files.record(signature=signature)


def finish(files: RunFiles, chunks: int) -> tuple[int, list[float]]:
    """Assemble the output, record the run as finished, remove the parts."""
    rows, sums = files.assemble(chunks)
    files.record(finished=True, means=[s / rows for s in sums], output_sha256=sha256_file(str(files.output)))
    shutil.rmtree(files.parts, ignore_errors=True)
    return rows, sums


def format_rows(scores: torch.Tensor, first: int, format: str, columns: list[str]) -> str:
    """Output lines of ``scores`` ``[k, n]`` (rows ``first + 1 … first + n``). Text output of several
    columns starts with a header naming them (``# precision recall f1``): JSON lines name theirs."""
    rows = scores.t().tolist()
    if format == "jsonl":
        return "".join(json.dumps({"line": first + i + 1, **dict(zip(columns, row))}) + "\n" for i, row in enumerate(rows))
    header = f"# {' '.join(columns)}\n" if first == 0 and len(columns) > 1 else ""
    return header + "".join(" ".join(f"{v:.6f}" for v in row) + "\n" for row in rows)


def save_statistics(files: RunFiles, scorer: Scorer, means) -> None:
    """The statistics fitted for the run, in the parts directory (atomically)."""
    idf = {side: scorer.idf[side].to_dict() for side in ("ref", "hyp")} if scorer.idf else None
    statistics = {"idf": idf, "centering": {k: v.cpu() for k, v in scorer.centering.state_dict().items()},
                  "baseline": None if scorer.baseline is None else list(scorer.baseline),
                  "means": None if means is None else [m.cpu() for m in means.vectors],
                  "lone_means": None if means is None else means.lone.cpu()}
    atomic_write(files.statistics, lambda f: torch.save(statistics, f))


def load_statistics(files: RunFiles) -> dict | None:
    return torch.load(files.statistics, weights_only=True) if files.statistics.is_file() else None


def restore_statistics(scorer: Scorer, saved: dict) -> BatchMeans | None:
    """Put :func:`save_statistics`' statistics back into ``scorer``; returns the batch means."""
    from ..text.weights import IDF

    device = scorer.encoder.device
    if saved["idf"] is not None:
        scorer.idf = {side: IDF.from_dict(saved["idf"][side]) for side in ("ref", "hyp")}
    scorer.centering.load_state_dict({k: v.to(device) for k, v in saved["centering"].items()})
    if saved["baseline"] is not None:
        scorer.baseline = saved["baseline"]
    if saved["means"] is None:
        return None
    vectors = tuple(m.to(device) for m in saved["means"])
    lone = saved.get("lone_means")  # not saved by the versions before it: none was lone, as they scored
    if lone is None:
        lone = torch.zeros(len(vectors), dtype=torch.bool)
    return BatchMeans(vectors, lone.to(device))
