"""Human ratings of machine translations, read from four layouts into one record type, :class:`Rating`.

=====================  =========================================================================
layout                 reader
=====================  =========================================================================
our TSV                :func:`read_tsv` — header ``lp year ref hyp score`` (a file or a directory
                       of ``*.tsv``)
JSON lines             :func:`read_jsonl` — ``{"lang", "candidate", "reference", "score"}`` per line
                       (the BLEURT / paper authors' release; ``year`` a key or an argument)
WMT DA segment-level   :func:`read_wmt_daseg` — ``DAseg.newstest{year}.{source,reference,
                       mt-system,human}.{lp}``, four line-aligned files
WMT17 metrics task     :func:`read_wmt17` — ``DA-seglevel.csv`` naming system outputs and
                       references by line
DA table (COMET's)     :func:`read_da_table` — a Parquet file with the columns ``lp src mt ref
                       score`` (and ``raw annotators domain year``), the schema of the direct
                       assessments on the model hub that COMET trains on; :func:`read_hub_da`
                       reads such a dataset from the hub through ``datasets``
=====================  =========================================================================

:func:`read_ratings` recognises the layout of a path. Every malformed row raises :class:`DataError`
(a ``ValueError``) whose message starts with ``path:line:`` (1-based); a missing input file raises
``FileNotFoundError``. :func:`split_dev` holds out a deterministic, stratified development set.

Example:
    >>> r = Rating(lp="de-en", year=2016, ref="The cat sat.", hyp="The cat sits.", score=0.25)
    >>> r.group
    'de-en/2016'
"""
from __future__ import annotations

import codecs
import dataclasses
import json
import math
import random
import re
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Sequence

from ..scorer.inputs import check_text

__all__ = ["DataError", "Rating", "read_tsv", "read_tsv_dir", "read_jsonl", "read_wmt_daseg", "read_wmt17",
           "read_da_table", "read_hub_da", "ratings_from_da_table", "filter_ratings", "read_ratings", "split_dev",
           "group_records"]

TSV_COLUMNS = ("lp", "year", "ref", "hyp", "score")
TSV_OPTIONAL = ("system", "segment_id", "src")
JSONL_KEYS = ("lang", "candidate", "reference", "score")
DASEG_PARTS = ("source", "reference", "mt-system", "human")
WMT17_COLUMNS = ("LP", "DATA", "SYSTEM", "SID", "HUMAN")
DA_TABLE_COLUMNS = ("lp", "src", "mt", "ref", "score", "year")  # required of a DA table; raw, annotators, domain: ignored
# The hub dataset of WMT direct assessments (2017-2022) in that schema, which COMET's DA models train on.
HUB_DA_DATASET = "RicardoRei/wmt-da-human-evaluation"
HUB_PREFIX = "hub:"
_LP = re.compile(r"^[a-z]{2,3}-[a-z]{2,3}$")


class DataError(ValueError):
    """A malformed row: ``str(error)`` is ``"{path}:{line}: {message}"``; ``path`` and ``line``
    (1-based; ``None`` for a whole-file problem) are attributes."""

    def __init__(self, path: str | Path, line: int | None, message: str):
        self.path, self.line = str(path), line
        super().__init__(f"{path}:{line}: {message}" if line is not None else f"{path}: {message}")


@dataclasses.dataclass(frozen=True)
class Rating:
    """One human judgement of one hypothesis against its reference.

    ``score`` is the human score as released (for WMT DA: z-normalised per annotator and averaged;
    higher is better). ``system`` and ``segment_id`` (1-based line in the test set) are known for the
    WMT layouts; ``src`` (the source sentence) for the DAseg layout.
    """

    lp: str
    year: int
    ref: str
    hyp: str
    score: float
    system: str | None = None
    segment_id: int | None = None
    src: str | None = None

    @property
    def group(self) -> str:
        """``"{lp}/{year}"``: the unit over which correlations are computed."""
        return f"{self.lp}/{self.year}"


def group_records(records: Iterable[Rating]) -> dict[str, list[int]]:
    """Indices of ``records`` by :attr:`Rating.group`, groups sorted by name."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        groups[r.group].append(i)
    return dict(sorted(groups.items()))


# --- field parsers (raise DataError with the position) ---------------------------------------------

def _score(value, path, line: int, what: str = "score") -> float:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DataError(path, line, f"{what} must be a number, got {value!r}")
    try:
        x = float(value)
    except ValueError:
        raise DataError(path, line, f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(x):
        raise DataError(path, line, f"{what} must be finite, got {value!r}")
    return x


def _year(value, path, line: int) -> int:
    if isinstance(value, bool):
        raise DataError(path, line, f"year must be an integer, got {value!r}")
    try:
        year = int(value)
    except (TypeError, ValueError):
        raise DataError(path, line, f"year must be an integer, got {value!r}") from None
    if isinstance(value, float) and value != year:
        raise DataError(path, line, f"year must be an integer, got {value!r}")
    return year


def _lp(value, path, line: int | None) -> str:
    if not isinstance(value, str) or not _LP.match(value):
        raise DataError(path, line, f"language pair must look like 'cs-en', got {value!r}")
    return value


def _text(value, path, line: int, what: str) -> str:
    """``value`` if it is a valid Unicode string (a JSON escape can hold a lone surrogate, which no
    tokenizer encodes: :func:`~torchmover.scorer.inputs.check_text`), else a :class:`DataError`."""
    if not isinstance(value, str):
        raise DataError(path, line, f"{what} must be a string, got {type(value).__name__}")
    try:
        check_text(what, value)
    except ValueError as error:
        raise DataError(path, line, str(error)) from None
    return value


def _decoded(path: Path) -> str:
    """The text of ``path``: strict UTF-8, without a byte-order mark that starts it (as some Windows
    editors write). An undecodable byte is a :class:`DataError` naming the file and its line."""
    data = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise DataError(path, line, f"not valid UTF-8 (byte 0x{data[error.start]:02x})") from None


def _read_lines(path: Path) -> list[str]:
    """Line-aligned text (:func:`_decoded`): ``\\n`` or ``\\r\\n`` ends a line, nothing else, so a lone
    ``\\r``, U+2028 and friends inside a sentence do not shift the alignment; a final newline does not
    add an empty line."""
    lines = [line.removesuffix("\r") for line in _decoded(path).split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    return path


# --- TSV -----------------------------------------------------------------------------------------

def read_tsv(path: str | Path) -> list[Rating]:
    r"""Ratings from a tab-separated file with a header naming at least ``lp year ref hyp score``.

    Optional columns ``system``, ``segment_id`` and ``src`` fill the fields of that name; other
    columns are ignored. Lines are split as every line-aligned reader splits them (:func:`_read_lines`:
    only ``\n`` or ``\r\n`` ends one, so a lone ``\r`` stays in its text), then at each tab; texts are
    read verbatim (quotes are text) and may be of any length. Lines that are empty or hold only
    whitespace are skipped. A directory reads every ``*.tsv`` in it, sorted by name (:func:`read_tsv_dir`).
    """
    path = Path(path)
    if path.is_dir():
        return read_tsv_dir(path)
    lines = _read_lines(_require_file(path, "ratings file"))
    if not lines:
        raise DataError(path, 1, f"empty file: expected a header line {' '.join(TSV_COLUMNS)!r}")
    header = lines[0].split("\t")
    missing = [c for c in TSV_COLUMNS if c not in header]
    if missing or len(set(header)) != len(header):
        raise DataError(path, 1, f"header must name the columns {TSV_COLUMNS} once each "
                                 f"(missing: {missing}), got {header}")
    col = {name: header.index(name) for name in TSV_COLUMNS + TSV_OPTIONAL if name in header}
    records = []
    for line, text in enumerate(lines[1:], start=2):
        if not text.strip():
            continue
        row = text.split("\t")
        if len(row) != len(header):
            raise DataError(path, line, f"expected {len(header)} tab-separated columns, got {len(row)}")
        get = {name: row[i] for name, i in col.items()}
        given = get.get("segment_id") or None
        segment_id = None
        if given is not None:
            if not given.isdigit():
                raise DataError(path, line, f"segment_id must be a non-negative integer, got {given!r}")
            segment_id = int(given)
        records.append(Rating(
            lp=_lp(get["lp"], path, line), year=_year(get["year"], path, line), ref=get["ref"],
            hyp=get["hyp"], score=_score(get["score"], path, line), system=get.get("system") or None,
            segment_id=segment_id, src=get.get("src") or None,
        ))
    return records


def read_tsv_dir(directory: str | Path) -> list[Rating]:
    """All ``*.tsv`` files of ``directory``, sorted by file name, concatenated."""
    directory = Path(directory)
    files = sorted(directory.glob("*.tsv"))
    if not files:
        raise FileNotFoundError(f"no *.tsv files in {directory}")
    return [r for f in files for r in read_tsv(f)]


# --- JSON lines ----------------------------------------------------------------------------------

def read_jsonl(path: str | Path, year: int | None = None) -> list[Rating]:
    """Ratings from JSON lines ``{"lang": "de-en", "candidate": ..., "reference": ..., "score": ...}``.

    The year is the record's ``year`` key or, for records without one, the ``year`` argument
    (neither is an error). Optional keys ``system``,
    ``segment_id`` and ``source`` fill the fields ``system``, ``segment_id`` and ``src``. Empty lines
    are skipped.
    """
    path = _require_file(Path(path), "ratings file")
    records = []
    for line, text in enumerate(_decoded(path).split("\n"), start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataError(path, line, f"invalid JSON ({error.msg} at column {error.colno})") from None
        if not isinstance(obj, dict):
            raise DataError(path, line, f"expected a JSON object, got {type(obj).__name__}")
        missing = [k for k in JSONL_KEYS if k not in obj]
        if missing:
            raise DataError(path, line, f"missing keys {missing} (expected {list(JSONL_KEYS)})")
        if "year" in obj:
            y = _year(obj["year"], path, line)
        elif year is not None:
            y = _year(year, path, line)
        else:
            raise DataError(path, line, "no 'year' key: give the year of the records without one (the command "
                                        "line's --year, or read_jsonl(path, year=...))")
        segment_id = obj.get("segment_id")
        if segment_id is not None and (isinstance(segment_id, bool) or not isinstance(segment_id, int)):
            raise DataError(path, line, f"segment_id must be an integer, got {segment_id!r}")
        records.append(Rating(
            lp=_lp(obj["lang"], path, line), year=y,
            ref=_text(obj["reference"], path, line, "reference"),
            hyp=_text(obj["candidate"], path, line, "candidate"),
            score=_score(obj["score"], path, line), system=obj.get("system"), segment_id=segment_id,
            src=obj.get("source"),
        ))
    return records


# --- WMT DA segment-level release ----------------------------------------------------------------

_DASEG = re.compile(r"^DAseg\.newstest(\d{4})\.human\.([a-z]{2,3}-[a-z]{2,3})$")


def daseg_files(directory: str | Path, year: int, lp: str) -> dict[str, Path]:
    """The four files ``DAseg.newstest{year}.{part}.{lp}`` of one year and language pair."""
    directory = Path(directory)
    return {part: directory / f"DAseg.newstest{year}.{part}.{lp}" for part in DASEG_PARTS}


def read_wmt_daseg(directory: str | Path, year: int | None = None, lp: str | None = None) -> list[Rating]:
    """Ratings from the WMT DA segment-level release: four line-aligned files per language pair,
    ``DAseg.newstest{year}.source.{lp}``, ``.reference.``, ``.mt-system.`` (the hypotheses) and
    ``.human.`` (one score per line). ``segment_id`` is the 1-based line number.

    With ``year`` and ``lp`` left out, every ``(year, lp)`` whose ``human`` file is in ``directory``
    is read, sorted.
    """
    directory = Path(directory)
    if year is None or lp is None:
        found = sorted((int(m[1]), m[2]) for f in directory.iterdir() if (m := _DASEG.match(f.name)))
        found = [(y, l) for y, l in found if (year is None or y == year) and (lp is None or l == lp)]
        if not found:
            raise FileNotFoundError(f"no DAseg.newstest{{year}}.human.{{lp}} files in {directory}"
                                    + (f" for year={year}" if year is not None else "")
                                    + (f" for lp={lp}" if lp is not None else ""))
        return [r for y, l in found for r in read_wmt_daseg(directory, y, l)]
    lp = _lp(lp, directory, None)
    files = daseg_files(directory, year, lp)
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"WMT DAseg files not found: {', '.join(missing)}")
    columns = {part: _read_lines(p) for part, p in files.items()}
    counts = {part: len(lines) for part, lines in columns.items()}
    if len(set(counts.values())) != 1:
        listing = ", ".join(f"{files[part].name}: {n}" for part, n in counts.items())
        raise DataError(directory, None, f"DAseg files are not line-aligned ({listing} lines)")
    human = files["human"]
    return [
        Rating(lp=lp, year=year, ref=ref, hyp=hyp, score=_score(score.strip(), human, i + 1),
               segment_id=i + 1, src=src)
        for i, (src, ref, hyp, score) in enumerate(zip(*(columns[p] for p in DASEG_PARTS)))
    ]


# --- WMT17 metrics task --------------------------------------------------------------------------

def read_wmt17(directory: str | Path) -> list[Rating]:
    """Ratings from the WMT17 metrics-task layout.

    ``directory/DA-seglevel.csv`` is space-separated with the header ``LP DATA SYSTEM SID HUMAN``;
    each row names the hypothesis on line ``SID`` (1-based) of the system output
    ``directory/{LP}/{DATA}.{SYSTEM}.{LP}`` and the reference on the same line of
    ``directory/references/{DATA}-{src}{tgt}-ref.{tgt}`` (or, if absent there,
    ``directory/{DATA}-{src}{tgt}-ref.{tgt}``) — the layout of WMT's ``txt/system-outputs/newstest2017``
    and ``txt/references`` folders side by side. A ``SYSTEM`` that joins several systems with ``+``
    (identical outputs) reads the first one's file if the joined name has none. The year is the
    four digits in ``DATA`` (``newstest2017`` → 2017).
    """
    directory = Path(directory)
    table = _require_file(directory / "DA-seglevel.csv", "WMT17 DA-seglevel.csv")
    cache: dict[Path, list[str]] = {}

    def line_of(file: Path, sid: int, line: int, what: str) -> str:
        if file not in cache:
            cache[file] = _read_lines(file)
        if sid > len(cache[file]):
            raise DataError(table, line, f"SID {sid} is beyond the {len(cache[file])} lines of the {what} {file}")
        return cache[file][sid - 1]

    records = []
    rows = _read_lines(table)
    header = rows[0].split() if rows else []
    if tuple(header) != WMT17_COLUMNS:
        raise DataError(table, 1, f"header must be {' '.join(WMT17_COLUMNS)!r}, got {' '.join(header)!r}")
    for line, text in enumerate(rows[1:], start=2):
        fields = text.split()
        if not fields:
            continue
        if len(fields) != len(WMT17_COLUMNS):
            raise DataError(table, line,
                            f"expected {len(WMT17_COLUMNS)} space-separated columns, got {len(fields)}")
        lp, data, system, sid, human = fields
        lp = _lp(lp, table, line)
        if not sid.isdigit() or int(sid) < 1:
            raise DataError(table, line, f"SID must be a positive integer, got {sid!r}")
        segment = int(sid)
        year = re.search(r"\d{4}", data)
        if year is None:
            raise DataError(table, line, f"DATA must name a test set with its year (newstest2017), got {data!r}")
        src, tgt = lp.split("-")
        output = _system_file(directory, lp, data, system)
        if output is None:
            raise DataError(table, line, f"system output not found: {directory / lp / f'{data}.{system}.{lp}'}")
        ref_name = f"{data}-{src}{tgt}-ref.{tgt}"
        candidates = (directory / "references" / ref_name, directory / ref_name)
        reference = next((p for p in candidates if p.is_file()), None)
        if reference is None:
            raise DataError(table, line, f"reference not found: {directory / 'references' / ref_name} "
                                         f"(nor {directory / ref_name})")
        records.append(Rating(
            lp=lp, year=int(year[0]), ref=line_of(reference, segment, line, "reference"),
            hyp=line_of(output, segment, line, "system output"), score=_score(human, table, line, "HUMAN"),
            system=system, segment_id=segment,
        ))
    return records


def _system_file(directory: Path, lp: str, data: str, system: str) -> Path | None:
    for name in dict.fromkeys([system, system.split("+")[0]]):
        path = directory / lp / f"{data}.{name}.{lp}"
        if path.is_file():
            return path
    return None


# --- auto-detection ------------------------------------------------------------------------------

# --- DA tables (COMET's schema): Parquet, or a hub dataset --------------------------------------

def ratings_from_da_table(table, source: str, year: int | None = None, lp: str | None = None) -> list[Rating]:
    """Ratings from a ``pyarrow.Table`` with the columns ``lp src mt ref score year`` (others ignored):
    ``mt`` is the hypothesis, ``score`` the z-normalised DA score (``raw``, the 0-100 rating, is not
    used). ``year`` / ``lp`` keep only that year's / language pair's rows. ``source`` names the table in
    errors, whose "line" is the 1-based row."""
    missing = [c for c in DA_TABLE_COLUMNS if c not in table.column_names]
    if missing:
        raise DataError(source, None, f"a DA table needs the columns {DA_TABLE_COLUMNS} (missing: {missing}), "
                                      f"got {table.column_names}")
    columns = {c: table.column(c).to_pylist() for c in DA_TABLE_COLUMNS}
    records = []
    for i, (pair, src, mt, ref, score, row_year) in enumerate(zip(*columns.values()), start=1):
        if (year is not None and row_year != year) or (lp is not None and pair != lp):
            continue
        records.append(Rating(lp=_lp(pair, source, i), year=_year(row_year, source, i), ref=_text(ref, source, i, "ref"),
                              hyp=_text(mt, source, i, "mt"), score=_score(score, source, i),
                              src=_text(src, source, i, "src")))
    return records


def read_da_table(path: str | Path, year: int | None = None, lp: str | None = None) -> list[Rating]:
    """Ratings from a Parquet file in the schema of the hub's DA datasets (:func:`ratings_from_da_table`),
    e.g. one saved by ``datasets``' ``Dataset.to_parquet``. Needs pyarrow (``torchmover[parquet]``)."""
    path = _require_file(Path(path), "ratings file")
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError('reading a Parquet ratings file needs pyarrow: pip install "torchmover[parquet]"') from None
    try:
        table = pq.read_table(path)
    except Exception as error:  # pyarrow's ArrowInvalid and kin: not a Parquet file
        raise DataError(path, None, f"not a readable Parquet file ({error})") from None
    return ratings_from_da_table(table, str(path), year, lp)


def read_hub_da(name: str = HUB_DA_DATASET, year: int | None = None, lp: str | None = None, *,
                split: str = "train") -> list[Rating]:
    """Ratings from a direct-assessment dataset on the Hugging Face hub in COMET's schema (default
    :data:`HUB_DA_DATASET`), through ``datasets.load_dataset`` (``torchmover[hub]``; downloaded once
    into its cache, then read offline), filtered to ``year`` / ``lp``."""
    try:
        import datasets
    except ImportError:
        raise ImportError(f'reading the hub dataset {name} needs datasets: pip install "torchmover[hub]"') from None
    table = datasets.load_dataset(name, split=split).with_format("arrow")[:]
    return ratings_from_da_table(table, f"{HUB_PREFIX}{name}", year, lp)


def filter_ratings(records: Sequence[Rating], year: int | None = None, lp: str | None = None) -> list[Rating]:
    """The records of ``year`` and ``lp`` (each ``None``: any)."""
    return [r for r in records if (year is None or r.year == year) and (lp is None or r.lp == lp)]


def read_ratings(path: str | Path, year: int | None = None, lp: str | None = None) -> list[Rating]:
    """Ratings from ``path`` in any supported layout, recognised as follows, then only those of
    ``year`` and ``lp`` where given (:func:`filter_ratings`; for JSON lines ``year`` is instead the year
    of the records without one).

    - a ``*.tsv`` file, or a directory of them: :func:`read_tsv`;
    - a ``*.jsonl`` / ``*.json`` file: :func:`read_jsonl` (``year`` for records without one);
    - a directory with ``DA-seglevel.csv`` (or that file itself): :func:`read_wmt17`;
    - a directory with ``DAseg.newstest{year}.human.{lp}`` files: :func:`read_wmt_daseg`;
    - a ``*.parquet`` file: :func:`read_da_table` (COMET's DA schema);
    - ``hub:NAME`` (e.g. ``hub:RicardoRei/wmt-da-human-evaluation``): :func:`read_hub_da`.
    """
    records = _read_any(path, year, lp)
    json_lines = not str(path).startswith(HUB_PREFIX) and Path(path).suffix.lower() in (".jsonl", ".json")
    return filter_ratings(records, None if json_lines else year, lp)


def _read_any(path: str | Path, year: int | None, lp: str | None) -> list[Rating]:
    if isinstance(path, str) and path.startswith(HUB_PREFIX):
        return read_hub_da(path[len(HUB_PREFIX):], year, lp)
    path = Path(path)
    if path.is_dir():
        if (path / "DA-seglevel.csv").is_file():
            return read_wmt17(path)
        if any(_DASEG.match(f.name) for f in path.iterdir()):
            return read_wmt_daseg(path, year, lp)
        if any(path.glob("*.tsv")):
            return read_tsv_dir(path)
        raise ValueError(f"{path}: unrecognised ratings directory: expected DA-seglevel.csv (WMT17), "
                         "DAseg.newstest{year}.human.{lp} files (WMT DA release) or *.tsv files")
    if path.name == "DA-seglevel.csv":
        return read_wmt17(path.parent)
    suffix = path.suffix.lower()
    if suffix == ".tsv":
        return read_tsv(path)
    if suffix in (".jsonl", ".json"):
        return read_jsonl(path, year)
    if suffix == ".parquet":
        return read_da_table(path, year, lp)
    _require_file(path, "ratings file")
    raise ValueError(f"{path}: unrecognised ratings file: expected .tsv, .jsonl, .parquet, DA-seglevel.csv, "
                     "a directory or hub:NAME")


# --- development split ---------------------------------------------------------------------------

def split_dev(records: Sequence[Rating], fraction: float = 0.1, seed: int = 0, *,
              keep_references_together: bool = True) -> tuple[list[Rating], list[Rating]]:
    """``(train, dev)``: about ``fraction`` of each language pair and year held out, deterministically.

    Each ``lp/year`` group contributes ``round(fraction * n_group)`` records to ``dev`` (approximately,
    when ``keep_references_together`` puts all ratings of one reference on the same side so that
    ``dev`` references are unseen in training). Records keep their input order on both sides; the
    same ``records`` and ``seed`` always give the same split.

    Example:
        >>> rs = [Rating("cs-en", 2016, f"ref {i}", "hyp", 0.0) for i in range(10)]
        >>> train, dev = split_dev(rs, 0.2, seed=1)
        >>> len(train), len(dev)
        (8, 2)
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ValueError(f"fraction must be a number in (0, 1), got {fraction!r}")
    in_dev = [False] * len(records)
    for name, indices in group_records(records).items():
        rng = random.Random(f"{seed}/{name}")  # a group's split does not depend on the other groups
        units: dict[object, list[int]] = defaultdict(list)
        for i in indices:
            units[records[i].ref if keep_references_together else i].append(i)
        order = list(units.values())
        rng.shuffle(order)
        target = round(fraction * len(indices))
        taken = 0
        for unit in order:
            if taken >= target or abs(taken + len(unit) - target) > abs(taken - target):
                continue
            for i in unit:
                in_dev[i] = True
            taken += len(unit)
    train = [r for r, d in zip(records, in_dev) if not d]
    dev = [r for r, d in zip(records, in_dev) if d]
    return train, dev
