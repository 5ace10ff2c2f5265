"""The book (`make html`: MkDocs, mkdocs.yml and docs/hooks.py) from the outside: every chapter a
page in reading order, an API page per module, the notebook's machinery (nbdev directives,
nbval markers, prompts, hidden cells) out of the text, display maths handed to MathJax,
figures kept, every page under 1 MB. The README's chapter table lists the notebooks. The site
is built once per session (`built_book`, shared with tests/test_browser.py)."""

import ast
import functools
import html
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
# gitignored; `make html` writes build/html/. One folder per pytest-xdist worker: two builds never
# share one.

BOOK_DIR = ROOT / "build" / f"book-test-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"


def _load_hooks():
    spec = importlib.util.spec_from_file_location("book_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _load_hooks()


@functools.cache
def built_book() -> Path:
    """Build the book once per session into build/book-test/, as `make html` does (strict: a warning
    fails)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--quiet",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(BOOK_DIR),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if run.returncode:
        pytest.fail(
            "mkdocs build failed (pip install -e .[docs]; npm is needed once for "
            f"MathJax):\n{run.stderr[-3000:]}"
        )
    return BOOK_DIR


@pytest.fixture(scope="session")
def site() -> Path:
    return built_book()


@functools.cache
def parsed(page: Path):
    "A built page, parsed once per session."
    from bs4 import BeautifulSoup

    return BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")


def chapter_page(site: Path, path: Path):
    return parsed(site / "chapters" / f"{path.stem}.html")


def text_outside(node, skip) -> str:
    "The text of `node`, less what lies inside a tag for which `skip(tag)` holds."
    return " ".join(
        s
        for s in node.find_all(string=True)
        if not any(skip(p) for p in s.parents) and s.parent.name not in ("script", "style")
    )


def inline_code(tag) -> bool:  # `code` in the prose, where a chapter may name a directive or a tag
    return tag.name == "code" and tag.find_parent("pre") is None


def maths_or_code(tag) -> bool:  # what MathJax typesets, and code, may hold dollars
    return tag.name in ("pre", "code") or "arithmatex" in (tag.get("class") or [])


# ---- the reading order
# ------------------------------------------------------------------------------------------


def test_readme_chapter_table_matches_the_notebooks():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## Chapters") : readme.index("## Quick start")]
    linked = re.findall(
        r"^\| [0-9a-z]+ \| \[([^\]]+)\]\((notebooks/[^)]+\.ipynb)\)", table, flags=re.M
    )
    expected = [
        (hooks.heading(p)[0], f"notebooks/{p.name}") for p in hooks.chapters(ROOT / "notebooks")
    ]
    assert linked == expected
    assert readme.index("## Chapters") < readme.index(
        "## Quick start"
    )  # the first section of the README


def test_every_chapter_is_a_page_in_reading_order_with_previous_and_next(site):
    chapters = hooks.chapters(ROOT / "notebooks")
    assert [p.stem for p in chapters] == sorted(
        p.stem for p in (ROOT / "notebooks").glob("[0-9]*.ipynb")
    )
    pages = [f"chapters/{p.stem}.html" for p in chapters]
    for i, path in enumerate(chapters):
        soup = chapter_page(site, path)
        assert soup.find("article").find("h1").get_text().strip("¶ ") == hooks.heading(path)[0]
        sidebar = [
            a["href"]
            for a in soup.select("nav.md-nav--primary a.md-nav__link[href]")
            if "chapters/" in a["href"] or a["href"].endswith(".html")
        ]
        in_order = [h for h in sidebar if re.search(r"\d\d[a-z]?_\w+\.html$", h)]
        assert [Path(h).name for h in in_order] == [
            Path(p).name for p in pages
        ]  # the whole order, on every page
        previous = soup.select_one("a.md-footer__link--prev")["href"]
        following = soup.select_one("a.md-footer__link--next")["href"]
        assert Path(previous).name == (Path(pages[i - 1]).name if i else "index.html")
        assert i + 1 == len(pages) or Path(following).name == Path(pages[i + 1]).name


def test_the_home_page_lists_every_chapter(site):
    soup = parsed(site / "index.html")
    links = [(a.get_text(), a["href"]) for a in soup.select("article table a")]
    assert links == [
        (hooks.heading(p)[0], f"chapters/{p.stem}.html") for p in hooks.chapters(ROOT / "notebooks")
    ]


def test_the_home_page_shows_each_chapters_whole_subtitle(site):
    "Each row ends where the notebook's quote under its title ends (the quote may span lines)."
    rows = parsed(site / "index.html").select("article table tbody tr")
    notebooks = hooks.chapters(ROOT / "notebooks")
    assert len(rows) == len(notebooks)
    for row, path in zip(rows, notebooks):
        sources = [
            "".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
        ]
        title = next(source for source in sources if source.startswith("# "))
        quote = [line for line in title.splitlines() if line.startswith(">")]
        last_word = re.findall(r"\w+", quote[-1])[-1]
        shown = row.find_all("td")[-1].get_text(" ", strip=True)
        assert re.search(rf"\b{last_word}\W*$", shown), (path.stem, shown)


# ---- what the pages hold
# -----------------------------------------------------------------------------------------


MACHINERY = [
    (re.compile(r"(?:^|\s)#\| ?[a-z][\w-]*"), "an nbdev directive"),
    (re.compile(r"NBVAL"), "an nbval comment"),
    (re.compile(r"nbval-[a-z-]+"), "an nbval tag"),
    (re.compile(r"\b(?:In|Out)\s*\[\s*\d*\s*\]:"), "a prompt"),
]


def test_no_directive_marker_or_prompt_in_the_text(site):
    for path in hooks.chapters(ROOT / "notebooks"):
        text = text_outside(chapter_page(site, path).find("article"), inline_code)
        for pattern, what in MACHINERY:
            found = pattern.search(text)
            assert found is None, (
                f"{path.stem}: {what} in the text: "
                f"...{text[max(0, found.start() - 60) : found.end() + 60]}..."
            )


def test_every_page_is_under_1_mb(site):
    pages = list(site.rglob("*.html"))
    assert len(pages) > len(hooks.chapters(ROOT / "notebooks"))
    sizes = {p.relative_to(site).as_posix(): p.stat().st_size for p in pages}
    assert max(sizes.values()) < 2**20, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]


def _display_maths(path) -> int:
    nb = hooks.book_cells(nbformat.read(path, as_version=4))
    return sum(
        len(re.findall(r"\$\$.+?\$\$", c.source, flags=re.S))
        for c in nb.cells
        if c.cell_type == "markdown"
    )


def test_display_maths_is_handed_to_mathjax_and_no_raw_dollars_remain(site):
    counted = 0
    for path in hooks.chapters(ROOT / "notebooks"):
        soup = chapter_page(site, path)
        assert len(soup.select("article div.arithmatex")) == _display_maths(path), path.stem
        assert "$$" not in text_outside(soup.find("article"), maths_or_code), (
            f"{path.stem}: raw $$ left in the text"
        )
        counted += _display_maths(path)
    assert counted > 0  # the series has display equations to check


def _figures(path) -> int:
    nb = hooks.book_cells(nbformat.read(path, as_version=4))
    return sum(
        any(k.startswith("image/") for k in o.get("data", {}))
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
    )


def test_every_figure_of_a_chapter_is_on_its_page_with_alt_text(site):
    total = 0
    for path in hooks.chapters(ROOT / "notebooks"):
        figures = chapter_page(site, path).select("article img")
        assert len(figures) == _figures(path), path.stem
        for img in figures:
            assert (site / "chapters" / img["src"]).stat().st_size > 0 and img["alt"].strip()
        total += len(figures)
    assert total > 0


def test_every_solution_is_folded_away_on_its_page_and_asserts(site):
    # issue 45: a cell tagged `solution` is a closed <details> block holding the cell's code
    total = 0
    for path in hooks.chapters(ROOT / "notebooks"):
        cells = nbformat.read(path, as_version=4).cells
        solutions = [c for c in cells if "solution" in c.metadata.get("tags", [])]
        folded = chapter_page(site, path).select("article details.solution")
        assert len(folded) == len(solutions), path.stem
        for block in folded:
            assert block.get("open") is None and block.summary.get_text().strip() == "Solution"
            assert "assert" in block.select_one("pre").get_text()
        total += len(folded)
    assert total >= 26


def test_an_api_page_per_module_documents_what_it_defines(site):
    modules = hooks.modules(ROOT / "txl_lib")
    expected = {
        "txl_lib." + p.stem for p in (ROOT / "txl_lib").glob("*.py") if not p.stem.startswith("_")
    }
    assert expected <= set(modules) and "txl_lib.book" not in modules
    for module in modules:
        source = (
            ROOT
            / "txl_lib"
            / ("__init__.py" if module == "txl_lib" else f"{module.split('.')[1]}.py")
        )
        tree = ast.parse(source.read_text(encoding="utf-8"))
        documented = [
            n.name
            for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.ClassDef))
            and not n.name.startswith(("_", "check_"))  # validators stay out of the API
            and ast.get_docstring(n)
        ]
        html = (site / "api" / f"{module}.html").read_text(encoding="utf-8")
        ids = set(re.findall(r'id="([^"]+)"', html))
        assert module in ids
        missing = [name for name in documented if f"{module}.{name}" not in ids]
        assert missing == [], f"{module}: no entry for {missing}"
        for name in documented[:3]:  # the docstring itself is on the page
            docstring = ast.get_docstring(
                next(n for n in tree.body if getattr(n, "name", None) == name)
            )
            assert (
                re.sub(r"[`*]", "", docstring.split()[0]).rstrip(",.:;") in html
            )  # markdown renders `x` as <code>


# ---- the hook's rules, on a notebook made here
# --------------------------------------------------------------------


def test_hidden_cells_directives_and_markers_leave_the_book_title_first():
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("#| default_exp demo"),
            nbformat.v4.new_code_cell("#| hide\nimport secret_setup"),
            nbformat.v4.new_markdown_cell("# Demo\n> a subtitle"),
            nbformat.v4.new_code_cell("import hidden_by_tag", metadata={"tags": ["hide"]}),
            nbformat.v4.new_code_cell("#| export\ndef shown(): return 1"),
            nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nshown()"),
            nbformat.v4.new_markdown_cell(
                "so\n$$x =\ny$$\nthen, in [chapter 03](03_relative_positions.ipynb)"
            ),
        ]
    )
    cells = [(c.cell_type, c.source) for c in hooks.book_cells(nb).cells]
    assert cells == [
        ("markdown", "# Demo\n> a subtitle"),
        ("code", "def shown(): return 1"),
        ("code", "shown()"),
        ("markdown", "so\n\n$$x =\ny$$\n\nthen, in [chapter 03](03_relative_positions.md)"),
    ]


def test_display_maths_in_a_list_item_stays_in_the_item():
    assert (
        hooks.display_math_apart("1. one $$a$$ two\n   more")
        == "1. one\n\n    $$a$$\n\n    two\n   more"
    )
    assert (
        hooks.display_math_apart("- item\n\nplain $$b$$") == "- item\n\nplain\n\n$$b$$\n\n"
    )  # out of the list


def test_the_api_reference_lists_every_config_field_and_no_validator(site):
    "What a user sets and calls is on the API pages; the checks at the door are not."
    import dataclasses

    from txl_lib import AdaptiveConfig, KNNConfig, LSTMConfig, TXLConfig, VariantConfig

    for config in (TXLConfig, VariantConfig, AdaptiveConfig, KNNConfig, LSTMConfig):
        module = config.__module__
        ids = set(re.findall(r'id="([^"]+)"', (site / "api" / f"{module}.html").read_text()))
        own = [
            f.name for f in dataclasses.fields(config) if f.name in vars(config)["__annotations__"]
        ]
        assert [f for f in own if f"{module}.{config.__name__}.{f}" not in ids] == [], config
    pages = "".join(p.read_text() for p in (site / "api").glob("*.html"))
    assert re.findall(r'id="txl_lib\.\w+\.check_\w+"', pages) == []


def test_each_chapter_page_links_to_its_notebook_which_the_site_holds(site):
    for path in hooks.chapters(ROOT / "notebooks"):
        links = [a["href"] for a in chapter_page(site, path).select("article a[href$='.ipynb']")]
        assert path.name in links, (path.name, links)
        assert (site / "chapters" / path.name).read_bytes() == path.read_bytes()


def test_the_search_index_holds_no_tex_and_no_cell_of_imports_alone(site):
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    texts = " ".join(
        doc["text"] for doc in index["docs"] if doc["location"].startswith("chapters/")
    )
    assert "<pre><code>def rel_shift(" in texts  # code cells that teach stay searchable
    assert not re.search(r"\\\(|\\\[|\\begin\{", texts)  # equations' TeX stays out
    import_cells = []
    for path in hooks.chapters(ROOT / "notebooks"):  # the cells a reader sees holding imports alone
        for cell in nbformat.read(path, as_version=4).cells:
            lines = [line for line in cell.source.splitlines() if line.strip()]
            shown = [line for line in lines if not line.startswith("#|")]
            if cell.cell_type == "code" and "#| hide" not in lines and shown:
                if all(line.startswith(("import ", "from ")) for line in shown):
                    import_cells.append(html.escape("\n".join(shown), quote=False))
    assert len(import_cells) > 10
    assert [code for code in import_cells if f"<pre><code>{code}</code></pre>" in texts] == []
