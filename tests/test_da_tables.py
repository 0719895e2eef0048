"""Ratings in COMET's DA schema (lp, src, mt, ref, score, raw, annotators, domain, year): a Parquet file
made here, and the hub reader (datasets.load_dataset stubbed with an in-memory dataset of that schema)."""
import sys

import pytest

from torchmover.cli import main
from torchmover.evaluation.data import DataError, Rating, read_da_table, read_ratings

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = {  # the hub dataset's columns and types
    "lp": ["de-en", "de-en", "en-de", "zh-en"],
    "src": ["Die Katze sitzt.", "Der Hund bellt.", "The cat sits.", "猫坐着。"],
    "mt": ["The cat sits.", "The dog is barking.", "Die Katze sitzt.", "Cat sit."],
    "ref": ["The cat is sitting.", "The dog barks.", "Die Katze sitzt.", "The cat is sitting."],
    "score": [0.31, -0.2, 1.1, -0.9],
    "raw": [75.0, 60.5, 98.0, 20.0],
    "annotators": [2, 1, 3, 1],
    "domain": ["news", "news", "news", "social"],
    "year": [2021, 2022, 2022, 2022],
}


def parquet(tmp_path, rows=ROWS, name="da.parquet"):
    path = tmp_path / name
    pq.write_table(pa.table(rows), path)
    return path


def test_a_parquet_da_table_reads_mt_as_the_hypothesis(tmp_path):
    records = read_ratings(parquet(tmp_path))
    assert records[0] == Rating(lp="de-en", year=2021, ref="The cat is sitting.", hyp="The cat sits.", score=0.31,
                                src="Die Katze sitzt.")
    assert [r.lp for r in records] == ROWS["lp"]


@pytest.mark.parametrize("year, lp, expected", [(2022, None, [-0.2, 1.1, -0.9]), (None, "de-en", [0.31, -0.2]),
                                                (2022, "de-en", [-0.2]), (2020, None, [])])
def test_year_and_lp_filters(tmp_path, year, lp, expected):
    assert [r.score for r in read_ratings(parquet(tmp_path), year, lp)] == expected


def test_a_missing_column_and_a_bad_row_are_named(tmp_path):
    rows = {k: v for k, v in ROWS.items() if k != "mt"}
    with pytest.raises(DataError, match=r"needs the columns .* \(missing: \['mt'\]\)"):
        read_da_table(parquet(tmp_path, rows))
    rows = {**ROWS, "lp": ["de-en", "German", "en-de", "zh-en"]}
    with pytest.raises(DataError, match=r"da.parquet:2: language pair must look like"):
        read_da_table(parquet(tmp_path, rows))
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="not a readable Parquet file"):
        read_ratings(tmp_path / "junk.parquet")
    with pytest.raises(FileNotFoundError, match="ratings file not found"):
        read_ratings(tmp_path / "missing.parquet")


def test_the_hub_reader_goes_through_datasets(monkeypatch):
    datasets = pytest.importorskip("datasets")
    calls = []

    def load_dataset(name, split):
        calls.append((name, split))
        return datasets.Dataset.from_dict(ROWS)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    records = read_ratings("hub:RicardoRei/wmt-da-human-evaluation", 2022, "en-de")
    assert calls == [("RicardoRei/wmt-da-human-evaluation", "train")]
    assert [(r.hyp, r.score, r.year) for r in records] == [("Die Katze sitzt.", 1.1, 2022)]


def test_the_hub_reader_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match=r'pip install "torchmover\[hub\]"'):
        read_ratings("hub:RicardoRei/wmt-da-human-evaluation")


def test_correlate_reads_a_parquet_table_with_filters(tmp_path, tiny_model_dir, capsys):
    rows = {k: v * 3 for k, v in ROWS.items()}
    rows["mt"] = [f"{t} {i}" for i, t in enumerate(rows["mt"])]
    rows["score"] = [float(i) for i in range(12)]
    model = ["--model", str(tiny_model_dir), "--layer", "2", "--no-progress", "--n-boot", "10"]
    assert main(["correlate", "--data", str(parquet(tmp_path, rows)), "--lp", "de-en", *model]) == 0
    table = capsys.readouterr().out
    assert "de-en/2021" in table and "de-en/2022" in table and "en-de" not in table
    with pytest.raises(SystemExit):
        main(["correlate", "--data", str(parquet(tmp_path, rows)), "--lp", "fr-en", *model])
    assert "no ratings in" in (err := capsys.readouterr().err) and err.rstrip().endswith("with --lp fr-en")
