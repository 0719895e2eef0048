"""Keep the tables of ``docs/`` equal to the results they come from, and every report equal to its JSON.

A table in a page of ``docs/`` is marked with the result and the table it copies::

    <!-- table: bench_peers#docs_cpu -->
    | system | pairs/s | ... |

(``bench/results/bench_peers.json``, its table ``docs_cpu``; the Markdown table follows the marker's
line). Commands (from the repository root)::

    python bench/docs_tables.py           # rewrite every marked table, and every report, from its JSON
    python bench/docs_tables.py --check   # exit 1 naming each table or report that differs

``tests/test_bench_harness.py`` runs the check.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

DOCS = harness.REPO / "docs"
RESULTS = harness.REPO / "bench" / "results"
MARKER = re.compile(r"^<!-- table: ([\w.-]+)#(\w+) -->$")


def marked_tables(text: str) -> list[tuple[int, int, str, str]]:
    """``(first, end, result, table)`` of each marked table of a page: lines ``first:end`` are the
    Markdown table after the marker (empty when the marker has no table after it)."""
    lines, found = text.split("\n"), []
    for k, line in enumerate(lines):
        m = MARKER.match(line.strip())
        if m:
            end = k + 1
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            found.append((k + 1, end, m.group(1), m.group(2)))
    return found


def expected_table(result: str, name: str, results: Path = RESULTS) -> str:
    path = results / f"{result}.json"
    if not path.is_file():
        raise SystemExit(f"a marker names {result}#{name}, but {path} does not exist")
    res = harness.load(path)
    if name not in res["tables"]:
        raise SystemExit(f"a marker names {result}#{name}, but {path.name} has no table {name!r} "
                         f"(it has {sorted(res['tables'])})")
    return harness.render_table(res["tables"][name])


def sync_page(text: str, results: Path = RESULTS) -> tuple[str, list[str]]:
    """The page with every marked table replaced by its JSON's, and the names of those that differed."""
    lines, differ = text.split("\n"), []
    for first, end, result, name in reversed(marked_tables(text)):
        table = expected_table(result, name, results).split("\n")
        if lines[first:end] != table:
            differ.append(f"{result}#{name}")
            lines[first:end] = table
    return "\n".join(lines), differ[::-1]


def stale_reports(results: Path = RESULTS) -> list[Path]:
    """The reports (``*.md``) that are not the rendering of their JSON."""
    return [path.with_suffix(".md") for path in sorted(results.glob("*.json"))
            if not path.with_suffix(".md").is_file()
            or path.with_suffix(".md").read_text(encoding="utf-8") != harness.render(harness.load(path))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything differs")
    args = parser.parse_args(argv)
    problems = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        synced, differ = sync_page(text)
        problems += [f"{page.relative_to(harness.REPO)}: table {d} differs from its JSON" for d in differ]
        if differ and not args.check:
            page.write_text(synced, encoding="utf-8")
    for report in stale_reports():
        problems.append(f"{report.relative_to(harness.REPO)} is not the rendering of its JSON")
        if not args.check:
            report.write_text(harness.render(harness.load(report.with_suffix(".json"))), encoding="utf-8")
    print("\n".join(problems) or "every marked table and report equals its JSON")
    return 1 if problems and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
