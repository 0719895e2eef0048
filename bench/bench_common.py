"""What the WMT benchmark scripts share: their command line's data and output directories, a seeded
sample of WMT pairs, agreement statistics between two score lists, and a markdown report writer that
records the machine's load."""
from __future__ import annotations

import argparse
import dataclasses
import os
import random
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def wmt_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of ``doc``, with ``--data`` (the WMT15-16 ``*.tsv``
    directory, by default ``../shared/data/wmt15-16`` next to the repository) and ``--out`` (the
    results directory, by default ``bench/results``)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "wmt15-16",
                        help="WMT15-16 *.tsv directory (default: ../shared/data/wmt15-16 next to the repository)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="output directory")
    return parser


def load_average() -> str:
    """The machine's load average (1/5/15 min), e.g. ``0.55/1.06/1.26``."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def write_report(out: Path, name: str, title: str, command: str, notes: list[str], table: list[str],
                 load_before: str) -> None:
    """Write (and print) a markdown report ``out/name``: the title, the command, the notes as a list
    (the load average before and now added), then the table."""
    notes = notes + [f"Load average (1/5/15 min) before {load_before}, after {load_average()}: other "
                     "processes share the machine when it is high."]
    report = "\n".join([f"# {title}", "", f"`{command}`", "", *(f"- {n}" for n in notes), "", *table, ""])
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(report, encoding="utf-8")
    print(report)


def load_sample(data_dir: Path, n: int, seed: int = 0) -> list[dict]:
    """``n`` rows spread evenly over every ``*.tsv`` of ``data_dir`` (sorted), seeded per file."""
    files = sorted(data_dir.glob("*.tsv"))
    if not files:
        raise SystemExit(f"--data {data_dir}: no *.tsv files")
    rows = []
    for k, path in enumerate(files):
        from torchmover.data import read_tsv  # here, not at import: the MoverScore shim stubs transformers

        file_rows = [dataclasses.asdict(r) for r in read_tsv(path)]
        take = n // len(files) + (k < n % len(files))
        rows += random.Random(f"{seed}-{path.name}").sample(file_rows, take)
    return rows


def pearson(x, y) -> float:
    return float(np.corrcoef(np.asarray(x, float), np.asarray(y, float))[0, 1])


def spearman(x, y) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic)


def agreement(a, b) -> dict:
    """Pearson r, Spearman ρ and the max / mean / median absolute difference of two score lists, and
    where the largest difference is."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    d = np.abs(a - b)
    return {"pearson": pearson(a, b), "spearman": spearman(a, b), "max_abs": float(d.max()),
            "mean_abs": float(d.mean()), "median_abs": float(np.median(d)), "argmax": int(d.argmax())}
