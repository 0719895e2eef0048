"""What the WMT benchmark scripts share: their command line's data and output directories."""
from __future__ import annotations

import argparse
from pathlib import Path

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
    import os

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
