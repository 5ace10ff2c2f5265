"""The book (`make html`: MkDocs, mkdocs.yml and docs/hooks.py) from the outside: every chapter a
page in reading order, an API page per module, the notebook's machinery (nbdev directives,
nbval markers, prompts, hidden cells) out of the text, display maths handed to MathJax,
figures kept, every page under 1 MB. The README's chapter table lists the notebooks. The site
is built once per test run (`built_book`, shared with tests/test_browser.py and across workers)."""

import ast
import fcntl
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
# gitignored; `make html` writes build/html/. One build per test run, which every worker reads: the
# first worker to ask builds it under a lock, the others wait for it (`built_book`).
BOOK_DIR = ROOT / "build" / "book-test"
RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID", f"pid {os.getpid()}")


def _load_hooks():
    spec = importlib.util.spec_from_file_location("book_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _load_hooks()


@functools.cache
def built_book() -> Path:
    """The book built into build/book-test/ as `make html` builds it (strict: a warning fails), once
    per test run: a worker that finds this run's build under the lock reads it."""
    BOOK_DIR.parent.mkdir(parents=True, exist_ok=True)
    built_for = BOOK_DIR.parent / "book-test.run"  # the run the folder was built for
    with open(BOOK_DIR.parent / "book-test.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (built_for.is_file() and built_for.read_text() == RUN_ID):
            built_for.unlink(missing_ok=True)
            build_book()
            built_for.write_text(RUN_ID)
    return BOOK_DIR


def build_book():
    "mkdocs build into BOOK_DIR; a failure fails the test that asked, with mkdocs's error."
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


# ---- issue 46: one page per module, documented config fields, the home link, readable search
# excerpts, figures sharp on HiDPI
# --------------------------------------------------------------------------------------------


def _canonical(anchor: str, modules: list[str]) -> str:
    "Where an API heading's object is defined: `txl_lib.x.Name.f` for `txl_lib.Name.f`."
    import importlib

    module = max((m for m in modules if anchor == m or anchor.startswith(m + ".")), key=len)
    if anchor == module:
        return anchor
    first, *rest = anchor[len(module) + 1 :].split(".")
    top = getattr(importlib.import_module(module), first, None)
    if getattr(top, "__qualname__", None) and getattr(top, "__module__", None):
        return ".".join([top.__module__, top.__qualname__, *rest])
    return anchor


def test_one_api_page_per_module_and_nothing_documented_twice(site):
    """The package's page repeated every member of the modules it imports (three entries for
    `from_pretrained`): each object now has one entry, on the page of the module that defines it."""
    modules = hooks.modules(ROOT / "txl_lib")
    assert sorted(p.stem for p in (site / "api").glob("*.html")) == sorted(modules)
    sidebar = [
        Path(a["href"]).stem
        for a in parsed(site / "index.html").select("nav.md-nav--primary a.md-nav__link[href]")
        if a["href"].startswith("api/")
    ]
    assert sorted(sidebar) == sorted(modules)  # each module once in the navigation
    entries: dict[str, list[str]] = {}
    for module in modules:
        for heading in parsed(site / "api" / f"{module}.html").select("article .doc-heading[id]"):
            entries.setdefault(_canonical(heading["id"], modules), []).append(heading["id"])
    assert len(entries) > 100
    twice = {name: anchors for name, anchors in entries.items() if len(anchors) > 1}
    assert twice == {}, f"documented more than once: {twice}"


def _defining_module(name: str) -> str:
    "The txl_lib module that defines top-level `name` (a constant has no __module__: its source)."
    import txl_lib

    obj = getattr(txl_lib, name)
    if getattr(obj, "__module__", "").startswith("txl_lib."):
        return obj.__module__
    return next(
        f"txl_lib.{p.stem}"
        for p in sorted((ROOT / "txl_lib").glob("[!_]*.py"))
        if re.search(rf"^{name}\b\s*(?::[^=\n]+)?=", p.read_text(encoding="utf-8"), flags=re.M)
    )


def test_the_package_page_links_each_top_level_name_to_its_one_entry(site):
    import txl_lib

    soup = parsed(site / "api" / "txl_lib.html")
    links = {a.get_text(): a["href"] for a in soup.select("article table a") if "#" in a["href"]}
    for name in txl_lib.__all__:
        module = _defining_module(name)
        assert links.get(name) == f"{module}.html#{module}.{name}", name
        assert parsed(site / "api" / f"{module}.html").find(id=f"{module}.{name}") is not None
    # the home page's "API reference" link is the package's page (it went to txl_lib.utils)
    home = parsed(site / "index.html").find("article")
    assert [a["href"] for a in home.find_all("a") if a.get_text() == "API reference"] == [
        "api/txl_lib.html"
    ]


def _config_classes() -> list[type]:
    "Every dataclass of txl_lib whose name ends in Config, from the module that defines it."
    import dataclasses
    import importlib
    import inspect

    found = []
    for module in hooks.modules(ROOT / "txl_lib")[1:]:
        for name, cls in inspect.getmembers(importlib.import_module(module), inspect.isclass):
            if name.endswith("Config") and cls.__module__ == module:
                found.append(cls) if dataclasses.is_dataclass(cls) else None
    return found


def test_every_config_field_has_a_description_under_its_heading(site):
    """Each field a config class declares is an entry of its API page with a description (the
    class's `Attributes:` section, moved under the field's heading by docs/griffe_fields.py), and
    the class's text does not list the fields again. Before, each field was a heading with nothing
    under it."""
    import dataclasses

    configs = _config_classes()
    assert {c.__name__ for c in configs} >= {"TXLConfig", "LSTMConfig", "KNNConfig"}
    bare = []
    for config in configs:
        module, soup = config.__module__, parsed(site / "api" / f"{config.__module__}.html")
        own = [
            f.name for f in dataclasses.fields(config) if f.name in vars(config)["__annotations__"]
        ]
        assert own, config
        for field in own:
            heading = soup.find(id=f"{module}.{config.__name__}.{field}")
            contents = heading and heading.parent.find(
                "div", class_="doc-contents", recursive=False
            )
            if contents is None or not contents.get_text(strip=True):
                bare.append(f"{config.__name__}.{field}")
        text = soup.find(id=f"{module}.{config.__name__}").parent.find(
            "div", class_="doc-contents", recursive=False
        )
        tables = [
            t
            for t in text.find_all("table")
            if t.find_parent("div", class_="doc-object") is text.parent
        ]
        assert tables == [], f"{config.__name__}: its fields listed twice (a table and headings)"
    assert bare == [], f"config fields with no description on their API page: {bare}"


def test_the_books_name_in_the_header_links_home_from_every_page(site):
    "The logo hides below 1220 px; the name, shown at every width, links to the home page too."
    pages = [p for p in site.rglob("*.html") if p.name != "404.html"]
    assert len(pages) > 40
    for page in pages:
        soup = parsed(page)
        link = soup.select_one(".md-header__topic a.book-home")
        assert link is not None and "Transformer-XL" in link.get_text(), page
        assert (page.parent / link["href"]).resolve() == (site / "index.html").resolve(), page
        logo = soup.select_one("a.md-header__button.md-logo")["href"]
        assert (page.parent / logo).resolve() == (site / "index.html").resolve(), page


def _normal(text: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", text)).split())


def as_read(paragraph) -> str:
    "A paragraph's text with each inline equation as text (docs/hooks.py's tex_text), tags out."
    words = []
    for piece in paragraph.find_all(string=True):
        maths = piece.find_parent("span", class_="arithmatex")
        if piece.find_parent(attrs={"hidden": True}) is not None:
            continue
        if maths is None:
            words.append(piece)
        elif piece is maths.find(string=True):
            words.append(hooks.tex_text(maths.get_text().strip()[2:-2]))
    return _normal("".join(words))


def test_search_excerpts_read_equations_as_text(site):
    """A paragraph with inline maths is in the search index whole, each equation as text
    (`q<sub>i</sub>`): MathJax's TeX stayed out of the index by leaving a hole in every sentence."""
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    checked = 0
    for path in hooks.chapters(ROOT / "notebooks"):
        docs = [d for d in index["docs"] if d["location"].startswith(f"chapters/{path.stem}.html")]
        indexed = _normal(" ".join(d["text"] for d in docs))
        article = chapter_page(site, path).find("article")
        for paragraph in article.find_all("p"):
            if paragraph.find("span", class_="arithmatex") is None:
                continue
            expected = as_read(paragraph)
            assert expected in indexed, f"{path.stem}: not in the search index as read: {expected}"
            checked += 1
        for display in article.select("div.arithmatex"):
            assert _normal(hooks.tex_text(display.get_text().strip()[2:-2])) in indexed, path.stem
    assert checked > 50


def test_equations_as_text():
    assert (
        hooks.tex_text(r"\mathbf{q}_{i}^\top \mathbf{k}_j")
        == "q<sub>i</sub><sup>⊤</sup> k<sub>j</sub>"
    )
    assert hooks.tex_text(r"K = M + T") == "K = M + T"
    assert hooks.tex_text(r"\frac{1}{\sqrt{d}} \le \mathbb{R}^{E}") == "1/√d ≤ ℝ<sup>E</sup>"
    assert (
        hooks.tex_text(r"\underbrace{a + b}_{(a)} \cdot c_{t-1}") == "a + b (a) · c<sub>t-1</sub>"
    )
    assert hooks.tex_text(r"j < i") == "j &lt; i"  # HTML, as the index holds it
    assert hooks.tex_text(r"\begin{aligned} a &= b \\ c &= d \end{aligned}") == "a = b ; c = d"


def test_a_retina_figure_is_drawn_at_half_its_pixels(tmp_path):
    """A figure stored at twice its size (matplotlib's retina format: the PNG's metadata gives the
    width and height to draw it at) keeps that size on its page: sharp on a HiDPI screen."""
    import base64
    import zlib

    def png(width: int, height: int) -> str:
        def chunk(kind: bytes, data: bytes) -> bytes:
            body = kind + data
            return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

        header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])
        rows = b"".join(b"\0" + b"\0" * width for _ in range(height))
        data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
        return base64.b64encode(data + chunk(b"IEND", b"")).decode()

    figure = nbformat.v4.new_code_cell("plot()")
    figure.outputs = [
        nbformat.v4.new_output(
            "display_data",
            data={"image/png": png(600, 400), "text/plain": "<Figure>"},
            metadata={"image/png": {"width": 300, "height": 200}},
        )
    ]
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("# Demo\n> a figure"), figure]
    )
    path = tmp_path / "99_demo.ipynb"
    nbformat.write(nb, path)
    markdown, figures = hooks.chapter_markdown(path)
    assert len(figures) == 1
    assert re.search(r'\)\{ \.nb-figure width="300" height="200" \}', markdown), markdown


def _png_size(data: bytes) -> tuple[int, int]:
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_every_figure_of_the_book_is_sharp_on_a_2x_screen(site):
    "Each figure's file has at least twice the pixels of the size its page draws it at."
    soft = []
    for path in hooks.chapters(ROOT / "notebooks"):
        for img in chapter_page(site, path).select("article img"):
            if img["src"].endswith(".svg"):  # drawn sharp at any size
                continue
            width, _ = _png_size((site / "chapters" / img["src"]).read_bytes())
            if not img.get("width") or width < 2 * int(img["width"]):
                soft.append(f"{path.stem}/{Path(img['src']).name}")
    assert soft == [], f"figures drawn at their own pixel size (soft on HiDPI): {soft}"
