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
