"""The chapter table of the README lists every notebook, in order, under its own title (its first heading)."""
import re
from pathlib import Path

from txl_lib.book import index_page, navigation, read_chapters

ROOT = Path(__file__).resolve().parent.parent


def test_readme_chapter_table_matches_the_notebooks():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## Chapters"):readme.index("## Quick start")]
    linked = re.findall(r"^\| [0-9a-z]+ \| \[([^\]]+)\]\((notebooks/[^)]+\.ipynb)\)", table, flags=re.M)
    expected = [(c.title, f"notebooks/{c.path.name}") for c in read_chapters(ROOT / "notebooks")]
    assert linked == expected
    assert readme.index("## Chapters") < readme.index("## Quick start")        # the first section of the README


def test_navigation_and_index_link_every_chapter_in_order():
    chapters = read_chapters(ROOT / "notebooks")
    index = index_page(chapters)
    assert re.findall(r'href="([^"]+)"', index) == [c.page for c in chapters]
    first, last = navigation(chapters, 0), navigation(chapters, len(chapters) - 1)
    assert 'rel="prev"' not in first and f'href="{chapters[1].page}" rel="next"' in first
    assert 'rel="next"' not in last and f'href="{chapters[-2].page}" rel="prev"' in last
