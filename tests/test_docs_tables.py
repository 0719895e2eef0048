"""Every Markdown table of the documentation site and the README renders as a table: MyST (like GitHub)
shows a table whose separator row has a different number of cells than its header as raw pipe text,
and Sphinx does not warn about it, so the ``-W`` build alone does not catch one."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
_SEPARATOR_CELL = re.compile(r"^\s*:?-+:?\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def cells(line: str) -> list[str]:
    """The cells of a table row: split on the pipes that are not escaped (``\\|``), outer pipes removed."""
    parts = re.split(r"(?<!\\)\|", line.strip())
    if parts and parts[0].strip() == "":
        parts = parts[1:]
    if parts and parts[-1].strip() == "":
        parts = parts[:-1]
    return parts


def tables(text: str):
    """Yield ``(first line number, [(line number, row), ...])`` for every block of consecutive lines
    starting with ``|`` outside fenced code."""
    block, in_fence = [], False
    for number, line in enumerate(text.splitlines() + [""], start=1):
        if _FENCE.match(line):
            in_fence = not in_fence
        if not in_fence and line.lstrip().startswith("|"):
            block.append((number, line))
            continue
        if block:
            yield block[0][0], block
            block = []


def table_problems(text: str) -> list[str]:
    """What keeps each table of ``text`` from rendering: a missing separator row, or a row (the separator
    included) with a different number of cells than the header."""
    problems = []
    for first, rows in tables(text):
        if len(rows) < 2 or not all(_SEPARATOR_CELL.match(c) for c in cells(rows[1][1])):
            problems.append(f"line {first}: a table's second row is not a separator (|---|---|)")
            continue
        width = len(cells(rows[0][1]))
        for number, row in rows[1:]:
            if len(cells(row)) != width:
                problems.append(f"line {number}: {len(cells(row))} cells, the header has {width}")
    return problems


def test_the_check_catches_a_short_separator():
    assert table_problems("| a | b | c |\n|---|---|\n| 1 | 2 | 3 |\n") == ["line 2: 2 cells, the header has 3"]
    assert table_problems("| a | b |\n| 1 | 2 |\n") == [
        "line 1: a table's second row is not a separator (|---|---|)"]
    assert table_problems("| a | `x \\| y` |\n|---|:--:|\n| 1 | 2 |\n") == []
    assert table_problems("```\n| a | b |\n|---|\n```\n") == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_table_renders(page):
    assert table_problems(page.read_text(encoding="utf-8")) == []
