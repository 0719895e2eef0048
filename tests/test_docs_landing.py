"""The site's landing page carries the README's tour: every Python example of the README's tour is on
docs/index.md as written (both run as doctests), so the two cannot drift apart."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pycon_blocks(text: str) -> list[str]:
    return re.findall(r"```pycon\n(.*?)```", text, flags=re.S)


def test_the_landing_page_carries_the_readmes_tour():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    tour = readme[readme.index("## A tour"):readme.index("## Results")]
    blocks = pycon_blocks(tour)
    assert len(blocks) >= 3
    assert blocks == pycon_blocks((ROOT / "docs" / "index.md").read_text(encoding="utf-8"))
