import codecs
import contextlib
import dataclasses
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from torchmover.evaluation.data import (
    DataError, Rating, group_records, read_jsonl, read_ratings, read_tsv, read_tsv_dir, read_wmt17,
    read_wmt_daseg, split_dev,
)

FIXTURES = Path(__file__).parent / "fixtures"
TSV = FIXTURES / "tsv"
HEADER = "lp\tyear\tref\thyp\tscore\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@contextlib.contextmanager
def error_at(path: Path, line: int | None, match: str):
    """Expect a DataError (a ValueError) at ``path:line`` whose message contains ``match``."""
    with pytest.raises(DataError, match=match) as info:
        yield
    error = info.value
    assert isinstance(error, ValueError) and error.path == str(path) and error.line == line
    assert str(error).startswith(f"{path}:{line}:" if line is not None else f"{path}:")


# --- Rating --------------------------------------------------------------------------------------

def test_rating_is_frozen_with_group():
    r = Rating("cs-en", 2016, "ref", "hyp", 0.5)
    assert r.group == "cs-en/2016" and r.system is None and r.segment_id is None and r.src is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.score = 1.0


def test_group_records_sorted_by_name():
    rs = [Rating("de-en", 2016, "r", "h", 0), Rating("cs-en", 2016, "r", "h", 0), Rating("de-en", 2016, "r", "h", 0)]
    assert group_records(rs) == {"cs-en/2016": [1], "de-en/2016": [0, 2]}


# --- TSV -----------------------------------------------------------------------------------------

def test_read_tsv_keeps_quotes_verbatim():
    records = read_tsv(TSV / "wmt15.cs-en.tsv")
    assert len(records) == 3
    first = records[0]
    assert first == Rating("cs-en", 2015, '"We will not give up," the mayor told reporters on Monday.',
                           '" we will not give up , " said the mayor to journalists on Monday .', 0.412)
    assert [r.score for r in records] == [0.412, -0.1375, 0.05]


def test_read_tsv_directory_reads_all_files_sorted():
    records = read_tsv(TSV)
    assert records == read_tsv_dir(TSV)
    assert [r.group for r in records] == ["cs-en/2015"] * 3 + ["de-en/2016"] * 2
    assert records[-1].hyp == 'She said, the decision was "long overdue".'


def test_read_tsv_optional_columns_and_blank_lines(tmp_path):
    path = write(tmp_path / "x.tsv", "system\tlp\tyear\tref\thyp\tscore\tsegment_id\textra\n"
                                     "online-A\tro-en\t2016\tA dog.\tThe dog.\t-1e-2\t7\tignored\n\n")
    (r,) = read_tsv(path)
    assert (r.system, r.segment_id, r.lp, r.score) == ("online-A", 7, "ro-en", -0.01)


def test_read_tsv_splits_lines_as_every_line_aligned_reader_does(tmp_path):
    """Before, a lone ``\\r`` split the row ("expected 5 tab-separated columns, got 3"), a line of
    whitespace was an error, and a text over 131,072 characters a ``_csv.Error`` traceback."""
    long = "word " * 40_000
    path = tmp_path / "r.tsv"
    path.write_bytes((HEADER + "cs-en\t2015\ta\rcat\tthe cat\t0.1\r\n \t \n\n"
                      f"cs-en\t2015\t{long}\tthe\u2028dog\t0.2\n").encode())
    records = read_tsv(path)
    assert [(r.ref, r.hyp, r.score) for r in records] == [("a\rcat", "the cat", 0.1), (long, "the\u2028dog", 0.2)]


@pytest.mark.parametrize("body, line, match", [
    ("cs-en\t2015\tref\thyp\n", 2, "expected 5 tab-separated columns, got 4"),
    ("cs-en\t2015\tref\thyp\t0.1\n" "cs-en\t2015\tref\thyp\tgood\n", 3, "score must be a number, got 'good'"),
    ("cs-en\t2015\tref\thyp\tnan\n", 2, "score must be finite"),
    ("cs-en\tlast year\tref\thyp\t0.1\n", 2, "year must be an integer"),
    ("Czech\t2015\tref\thyp\t0.1\n", 2, "language pair must look like 'cs-en'"),
    ("cs-en\t2015\tref\twith\ttab\t0.1\n", 2, "expected 5 tab-separated columns, got 6"),
])
def test_read_tsv_malformed_rows(tmp_path, body, line, match):
    path = write(tmp_path / "bad.tsv", HEADER + body)
    with error_at(path, line, match):
        read_tsv(path)


def test_read_tsv_bad_header_and_empty_file(tmp_path):
    path = write(tmp_path / "h.tsv", "lp\tyear\treference\thyp\tscore\n")
    with error_at(path, 1, r"missing: \['ref'\]"):
        read_tsv(path)
    empty = write(tmp_path / "e.tsv", "")
    with error_at(empty, 1, "empty file"):
        read_tsv(empty)


def test_read_tsv_missing_file_and_empty_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.tsv"):
        read_tsv(tmp_path / "nope.tsv")
    with pytest.raises(FileNotFoundError, match=r"no \*.tsv files"):
        read_tsv_dir(tmp_path)


# --- JSON lines ----------------------------------------------------------------------------------

def test_read_jsonl_year_from_key_or_argument():
    records = read_jsonl(FIXTURES / "ratings.jsonl", year=2016)
    assert [r.group for r in records] == ["fi-en/2015", "fi-en/2015", "ro-en/2016"]
    assert records[2] == Rating("ro-en", 2016, '"It was a difficult match," the coach admitted.',
                                '"It was a hard match", admitted the coach.', -0.05, system="uedin-nmt",
                                segment_id=17)


def test_read_jsonl_without_year_names_the_line_and_how_to_give_it():
    path = FIXTURES / "ratings.jsonl"
    with error_at(path, 4, r"no 'year' key: give the year of the records without one \(the command line's "
                           r"--year, or read_jsonl\(path, year=\.\.\.\)\)"):  # line 3 is blank
        read_jsonl(path)


@pytest.mark.parametrize("key, position", [("candidate", 4), ("reference", 0)])
def test_read_jsonl_names_a_text_that_is_not_valid_unicode(tmp_path, key, position):
    """A JSON escape holds a lone surrogate; before, it reached the tokenizer and failed there as
    ``hyps[2] is not valid Unicode``, naming neither the file nor the line."""
    record = {"lang": "de-en", "year": 2016, "candidate": "the cat", "reference": "a cat", "score": 0.1}
    bad = json.dumps({**record, key: "the \ud800 cat" if key == "candidate" else "\udfff"})
    path = write(tmp_path / "r.jsonl", json.dumps(record) + "\n" + bad + "\n")
    with error_at(path, 2, rf"{key} is not valid Unicode: lone surrogate '\\ud[8f]\w\w' at position {position}"):
        read_jsonl(path)


@pytest.mark.parametrize("text, match", [
    ('{"lang": "de-en", "candidate": "a", "reference": "b", "score": 0.1', "invalid JSON"),
    ('["de-en", "a", "b", 0.1]', "expected a JSON object, got list"),
    ('{"lang": "de-en", "candidate": "a", "score": 0.1}', r"missing keys \['reference'\]"),
    ('{"lang": "de-en", "candidate": "a", "reference": "b", "score": "high"}', "score must be a number"),
    ('{"lang": "de-en", "candidate": "a", "reference": "b", "score": true}', "score must be a number"),
    ('{"lang": "de-en", "candidate": 3, "reference": "b", "score": 0.1}', "candidate must be a string"),
    ('{"lang": "de-en", "candidate": "a", "reference": "b", "score": 0.1, "year": 2015.5}', "year must be an integer"),
    ('{"lang": "de-en", "candidate": "a", "reference": "b", "score": 0.1, "segment_id": "x"}', "segment_id"),
])
def test_read_jsonl_malformed_rows(tmp_path, text, match):
    good = '{"lang": "de-en", "candidate": "a", "reference": "b", "score": 0.1}'
    path = write(tmp_path / "bad.jsonl", good + "\n" + text + "\n")
    with error_at(path, 2, match):
        read_jsonl(path, year=2016)


# --- WMT DAseg -----------------------------------------------------------------------------------

def test_read_wmt_daseg():
    records = read_wmt_daseg(FIXTURES / "daseg", 2016, "cs-en")
    assert len(records) == 3
    assert records[2] == Rating("cs-en", 2016, '"I don\'t know," he said.', '" I do not know , " he said .', 0.1,
                                segment_id=3, src="„Nevím,\" řekl.")
    assert [r.segment_id for r in records] == [1, 2, 3]
    assert read_wmt_daseg(FIXTURES / "daseg") == records  # every (year, lp) found


def copy_daseg(tmp_path) -> Path:
    return Path(shutil.copytree(FIXTURES / "daseg", tmp_path / "daseg"))


def test_read_wmt_daseg_mismatched_line_counts_names_files(tmp_path):
    d = copy_daseg(tmp_path)
    with open(d / "DAseg.newstest2016.mt-system.cs-en", "a", encoding="utf-8") as f:
        f.write("An extra line.\n")
    with pytest.raises(DataError, match=r"not line-aligned.*DAseg.newstest2016.source.cs-en: 3.*"
                                        r"DAseg.newstest2016.mt-system.cs-en: 4"):
        read_wmt_daseg(d, 2016, "cs-en")


def test_read_wmt_daseg_bad_score_and_missing_file(tmp_path):
    d = copy_daseg(tmp_path)
    human = write(d / "DAseg.newstest2016.human.cs-en", "0.1\n\n0.3\n")
    with error_at(human, 2, "score must be a number, got ''"):
        read_wmt_daseg(d, 2016, "cs-en")
    (d / "DAseg.newstest2016.source.cs-en").unlink()
    with pytest.raises(FileNotFoundError, match="DAseg.newstest2016.source.cs-en"):
        read_wmt_daseg(d, 2016, "cs-en")
    with pytest.raises(FileNotFoundError, match="for year=2015"):
        read_wmt_daseg(d, 2015)


def test_read_wmt_daseg_line_separators_inside_text(tmp_path):
    d = copy_daseg(tmp_path)
    write(d / "DAseg.newstest2016.mt-system.cs-en", "a\u2028b\r\nsecond\nthird")  # no final newline
    assert [r.hyp for r in read_wmt_daseg(d, 2016, "cs-en")] == ["a\u2028b", "second", "third"]


# --- WMT17 ---------------------------------------------------------------------------------------

def test_read_wmt17():
    records = read_wmt17(FIXTURES / "wmt17")
    assert [(r.lp, r.year, r.system, r.segment_id) for r in records] == [
        ("cs-en", 2017, "online-A.0", 2), ("cs-en", 2017, "uedin-nmt.4955", 1),
        ("cs-en", 2017, "online-A.0+uedin-nmt.4955", 3), ("de-en", 2017, "online-B.0", 1)]
    assert records[0] == Rating("cs-en", 2017, "Police are looking for witnesses.",
                                "The police search for witnesses.", 0.3012, system="online-A.0", segment_id=2)
    assert records[2].hyp == "The shop closed at six."  # joined systems read the first one's output
    assert records[3].ref == "Many fans travelled to the final."  # reference found in the root


def copy_wmt17(tmp_path) -> Path:
    return Path(shutil.copytree(FIXTURES / "wmt17", tmp_path / "wmt17"))


@pytest.mark.parametrize("row, match", [
    ("cs-en newstest2017 online-A.0 2", "expected 5 space-separated columns, got 4"),
    ("cs-en newstest2017 online-A.0 2 high", "HUMAN must be a number"),
    ("cs-en newstest2017 online-A.0 0 0.1", "SID must be a positive integer"),
    ("cs-en newstest2017 online-A.0 9 0.1", r"SID 9 is beyond the 3 lines of the reference"),
    ("cs-en newstest2017 online-Z.0 1 0.1", r"system output not found: .*newstest2017.online-Z.0.cs-en"),
    ("ru-en newstest2017 online-A.0 1 0.1", r"system output not found"),
    ("cs-en newstest online-A.0 1 0.1", "DATA must name a test set with its year"),
])
def test_read_wmt17_malformed_rows(tmp_path, row, match):
    d = copy_wmt17(tmp_path)
    table = write(d / "DA-seglevel.csv", "LP DATA SYSTEM SID HUMAN\ncs-en newstest2017 online-A.0 1 0.5\n" + row + "\n")
    with error_at(table, 3, match):
        read_wmt17(d)


def test_read_wmt17_missing_reference_system_line_and_header(tmp_path):
    d = copy_wmt17(tmp_path)
    (d / "newstest2017-deen-ref.en").unlink()
    table = d / "DA-seglevel.csv"
    with error_at(table, 5, r"reference not found: .*newstest2017-deen-ref.en"):
        read_wmt17(d)
    write(d / "cs-en" / "newstest2017.online-A.0.cs-en", "Only one line.\n")
    with error_at(table, 2, "SID 2 is beyond the 1 lines of the system output"):
        read_wmt17(d)
    write(table, "LP SYSTEM SID HUMAN\n")
    with error_at(table, 1, "header must be"):
        read_wmt17(d)
    table.unlink()
    with pytest.raises(FileNotFoundError, match="DA-seglevel.csv"):
        read_wmt17(d)


def test_read_wmt17_a_lone_carriage_return_inside_a_line_keeps_the_alignment(tmp_path):
    """Only ``\\n`` or ``\\r\\n`` ends a line: a lone ``\\r`` inside an output line was read as a line
    end, and every later SID silently paired with the line before its own."""
    d = copy_wmt17(tmp_path)
    output = d / "cs-en" / "newstest2017.online-A.0.cs-en"
    lines = output.read_text(encoding="utf-8").split("\n")
    output.write_bytes(("\n".join([lines[0] + "\rstill line one", *lines[1:]])).encode())
    assert read_wmt17(d)[0].hyp == "The police search for witnesses."  # SID 2, as before


def test_every_reader_names_an_undecodable_line_and_drops_a_byte_order_mark(tmp_path):
    """A byte-order mark that starts a file (as some Windows editors write) is not text: it made a
    TSV's header lack ``lp`` and stayed in a text file's first line. An undecodable byte is a
    DataError naming the file and its line (it was the codec's message alone)."""
    tsv = write(tmp_path / "r.tsv", HEADER + "de-en\t2016\tthe cat\tthe cat\t0.5\n")
    tsv.write_bytes(codecs.BOM_UTF8 + tsv.read_bytes())
    assert read_tsv(tsv)[0].lp == "de-en"
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_bytes(codecs.BOM_UTF8 + b'{"lang": "de-en", "candidate": "a", "reference": "b", "score": 1}\n')
    assert read_jsonl(jsonl, year=2016)[0].hyp == "a"
    d = copy_daseg(tmp_path)
    reference = d / "DAseg.newstest2016.reference.cs-en"
    first = read_wmt_daseg(d, 2016, "cs-en")[0].ref
    reference.write_bytes(codecs.BOM_UTF8 + reference.read_bytes())
    assert read_wmt_daseg(d, 2016, "cs-en")[0].ref == first
    readers = ((tsv, lambda: read_tsv(tsv)), (jsonl, lambda: read_jsonl(jsonl, year=2016)),
               (reference, lambda: read_wmt_daseg(d, 2016, "cs-en")))
    for path, read in readers:
        path.write_bytes(path.read_bytes().replace(b"\n", b"\n\xfc", 1))
        with error_at(path, 2, "not valid UTF-8 \\(byte 0xfc\\)"):
            read()


# --- read_ratings --------------------------------------------------------------------------------

def test_read_ratings_detects_every_layout():
    assert read_ratings(TSV) == read_tsv_dir(TSV)
    assert read_ratings(TSV / "wmt16.de-en.tsv") == read_tsv(TSV / "wmt16.de-en.tsv")
    assert read_ratings(FIXTURES / "ratings.jsonl", year=2016) == read_jsonl(FIXTURES / "ratings.jsonl", 2016)
    assert read_ratings(FIXTURES / "daseg") == read_wmt_daseg(FIXTURES / "daseg", 2016, "cs-en")
    assert read_ratings(FIXTURES / "wmt17") == read_wmt17(FIXTURES / "wmt17")
    assert read_ratings(FIXTURES / "wmt17" / "DA-seglevel.csv") == read_wmt17(FIXTURES / "wmt17")


def test_read_ratings_unknown_layouts(tmp_path):
    with pytest.raises(ValueError, match="unrecognised ratings directory"):
        read_ratings(tmp_path)
    with pytest.raises(ValueError, match="unrecognised ratings file"):
        read_ratings(write(tmp_path / "ratings.xlsx", "x"))
    with pytest.raises(FileNotFoundError):
        read_ratings(tmp_path / "missing.csv")


# --- split_dev -----------------------------------------------------------------------------------

def corpus():
    rs = []
    for lp, n in (("cs-en", 40), ("de-en", 20), ("fi-en", 10)):
        rs += [Rating(lp, 2016, f"{lp} reference {i // 2}", f"hyp {i}", float(i)) for i in range(n)]
    return rs


def test_split_dev_is_stratified_deterministic_and_a_partition():
    rs = corpus()
    train, dev = split_dev(rs, 0.2, seed=3, keep_references_together=False)
    assert Counter(r.lp for r in dev) == {"cs-en": 8, "de-en": 4, "fi-en": 2}
    assert sorted(train + dev, key=rs.index) == rs
    assert train == [r for r in rs if r not in dev]  # input order kept
    assert split_dev(rs, 0.2, seed=3, keep_references_together=False) == (train, dev)
    assert split_dev(rs, 0.2, seed=4, keep_references_together=False)[1] != dev


def test_split_dev_keeps_references_together():
    rs = corpus()
    train, dev = split_dev(rs, 0.2, seed=0)
    assert {r.ref for r in train}.isdisjoint({r.ref for r in dev})
    assert Counter(r.lp for r in dev) == {"cs-en": 8, "de-en": 4, "fi-en": 2}  # pairs of 2 fit exactly


def test_split_dev_group_split_independent_of_other_groups():
    rs = corpus()
    only_cs = [r for r in rs if r.lp == "cs-en"]
    assert split_dev(only_cs, 0.3, seed=1)[1] == [r for r in split_dev(rs, 0.3, seed=1)[1] if r.lp == "cs-en"]


@pytest.mark.parametrize("fraction", [0, 1, -0.1, 1.5, "0.1", True])
def test_split_dev_rejects_bad_fraction(fraction):
    with pytest.raises(ValueError, match="fraction must be a number in"):
        split_dev(corpus(), fraction)
