"""The reading experience in a real browser: the book (`make html`, MkDocs) and JupyterLab, in
headless Chromium.

Chromium comes from the system (Debian's `chromium`, which `.ci/run` installs); no browser is ever
downloaded, and the browser is kept off the network: its own background traffic is switched off and
every request that is not for our pages is aborted."""

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from test_book import (  # one build of the book per session, shared with tests/test_book.py
    as_read,
    built_book,
    hooks,
    parsed,
)

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip(
    "playwright.sync_api", reason="pip install playwright (in .[dev]) for browser tests"
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium on PATH: `apt-get install chromium` (as root) "
    "to run the browser tests; .ci/run does it",
)
OFFLINE_FLAGS = (
    "--no-sandbox --disable-background-networking --disable-component-update "
    "--no-first-run --disable-sync --disable-default-apps "
    "--disable-extensions --metrics-recording-only --disable-domain-reliability --no-pings"
).split()


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory):
    with playwright.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("profile")),
            executable_path=CHROMIUM,
            headless=True,
            args=OFFLINE_FLAGS,
            viewport={"width": 1100, "height": 900},
        )
        yield context
        context.close()


def local_only(context, allowed: tuple[str, ...]):
    "Abort every request whose URL does not start with one of `allowed`."
    context.route(
        "**/*",
        lambda route: route.continue_() if route.request.url.startswith(allowed) else route.abort(),
    )


@pytest.fixture(scope="module")
def site():
    return built_book()


def first_chapter_with(pattern: str):
    "The first chapter whose notebook source matches `pattern` (a regular expression)."
    return next(
        p
        for p in hooks.chapters(ROOT / "notebooks")
        if re.search(pattern, p.read_text(encoding="utf-8"))
    )


def open_offline(browser_context, site):
    """A page that may load only the book's own files, and the list of everything else it tried to
    load."""
    blocked, errors = [], []
    base = site.as_uri() + "/"
    browser_context.route(
        "**/*",
        lambda route: (
            route.continue_()
            if route.request.url.startswith(base)
            else (blocked.append(route.request.url), route.abort())
        ),
    )
    page = browser_context.new_page()
    page.on("console", lambda m: errors.append((page.url, m.text)) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append((page.url, str(e))))
    return page, blocked, errors


def test_the_book_in_chromium_offline_maths_figures_search(browser_context, site):
    page, blocked, errors = open_offline(browser_context, site)
    page.set_viewport_size({"width": 1300, "height": 900})  # wide enough for the sidebar
    (ROOT / "build").mkdir(exist_ok=True)

    maths = first_chapter_with(r"\$\$")  # an equation rendered by the bundled MathJax
    page.goto((site / "chapters" / f"{maths.stem}.html").as_uri())
    page.locator("article mjx-container svg").first.wait_for(state="visible", timeout=30_000)
    display = page.locator("article div.arithmatex")
    assert (
        display.count() > 0
        and page.locator("article div.arithmatex mjx-container").count() == display.count()
    )
    assert display.first.bounding_box()["height"] > 10
    prose = page.locator("article").evaluate(
        "el => { const c = el.cloneNode(true); c.querySelectorAll('pre, code, "
        "mjx-container').forEach(n => n.remove()); return c.textContent }"
    )
    assert not re.search(r"\$\$|\\\[|\\\(", prose), (
        "maths left as LaTeX source"
    )  # all of it typeset
    display.first.scroll_into_view_if_needed()
    page.screenshot(path=str(ROOT / "build" / "book_equation.png"))

    figures = first_chapter_with(r'"image/png"')  # a figure, loaded from its file
    page.goto((site / "chapters" / f"{figures.stem}.html").as_uri())
    images = page.locator("article img")
    images.first.scroll_into_view_if_needed()
    widths = images.evaluate_all("els => els.map(e => e.complete ? e.naturalWidth : 0)")
    assert widths and min(widths) > 0, f"{figures.stem}: a figure did not load"
    page.screenshot(path=str(ROOT / "build" / "book_figure.png"))

    chapters = hooks.chapters(ROOT / "notebooks")  # the sidebar and previous / next
    page.goto((site / "chapters" / f"{chapters[0].stem}.html").as_uri())
    sidebar = page.locator("nav.md-nav--primary").first.inner_text()
    assert page.locator("nav.md-nav--primary").first.is_visible()
    assert all(hooks.heading(p)[0] in sidebar for p in chapters)
    page.locator("a.md-footer__link--next").click()
    assert page.url.endswith(f"chapters/{chapters[1].stem}.html")

    word = "recurrence"  # search, from the file system
    expected = [p.stem for p in chapters if word in hooks.heading(p)[0].lower()]
    page.locator("input.md-search__input").click()
    page.keyboard.type(word)
    results = page.locator(".md-search-result__item a")
    results.first.wait_for(state="visible", timeout=30_000)
    hrefs = results.evaluate_all("els => els.map(e => e.getAttribute('href'))")
    assert expected and any(expected[0] in h for h in hrefs), hrefs
    page.screenshot(path=str(ROOT / "build" / "book_search.png"))

    assert blocked == [], f"the book tried to reach the network: {blocked}"
    assert errors == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, process, log: Path, seconds: float = 60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"jupyter lab exited with {process.returncode}: {log.read_text()[-2000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"jupyter lab did not answer at {url} within {seconds} s")


def test_jupyterlab_renders_chapter_01(browser_context, tmp_path):
    shutil.copytree(
        ROOT / "notebooks", tmp_path / "notebooks"
    )  # lab may autosave: never on the sources
    port, token = free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
    }
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={tmp_path / 'notebooks'}",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",
            "--allow-root",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "lab.log", "wb"),
    )
    try:
        wait_for(f"{base}/api/status?token={token}", server, tmp_path / "lab.log")
        local_only(browser_context, (base,))
        page = browser_context.new_page()
        page.goto(f"{base}/lab/tree/01_context_fragmentation.ipynb?token={token}")
        heading = page.locator(".jp-Notebook .jp-RenderedHTMLCommon h1").first
        heading.wait_for(state="visible", timeout=60_000)
        assert "Context fragmentation" in heading.inner_text()
        figure = page.locator(".jp-Notebook .jp-RenderedImage img").first
        figure.scroll_into_view_if_needed(timeout=30_000)
        figure.wait_for(state="visible", timeout=30_000)
        assert figure.evaluate("e => e.naturalWidth") > 0
        (ROOT / "build").mkdir(exist_ok=True)
        page.screenshot(path=str(ROOT / "build" / "jupyterlab_chapter01.png"))
        page.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


EQUATIONS = "article div.arithmatex > mjx-container > svg"  # each display equation, drawn


def equation_sizes(page) -> list:
    "[width, height] in CSS pixels of each display equation of the open page, once MathJax drew it."
    page.locator("article div.arithmatex mjx-container svg").first.wait_for(state="attached")
    return page.locator(EQUATIONS).evaluate_all(
        "els => els.map(e => e.getBoundingClientRect()).map(r => [r.width, r.height])"
    )


def too_small(sizes: dict) -> dict:
    "The chapters with an equation drawn under 20 x 10 px (Material's CSS once made them 1 x 1)."
    return {name: s for name, s in sizes.items() if not s or any(w < 20 or h < 10 for w, h in s)}


def test_every_display_equation_is_drawn_on_a_phone(browser_context, site):
    """At 390 px (a phone) each display equation of the chapters that have them is an SVG of real
    size (at 700 px and below Material's CSS once shrank them to 1 x 1 px); 1280 px is checked with
    the figures below."""
    page, blocked, errors = open_offline(browser_context, site)
    page.set_viewport_size({"width": 390, "height": 900})
    sizes = {}
    for chapter in hooks.chapters(ROOT / "notebooks"):
        if "$$" in chapter.read_text("utf-8"):
            page.goto((site / "chapters" / f"{chapter.stem}.html").as_uri())
            sizes[chapter.stem] = equation_sizes(page)
    assert sizes and too_small(sizes) == {}, f"display equations drawn too small at 390 px: {sizes}"
    assert blocked == [] and errors == []


@pytest.mark.parametrize("width, height", [(1280, 700), (1280, 900), (1600, 900)])
def test_nothing_covers_an_entry_of_the_sidebar(browser_context, site, width, height):
    """Each entry of the left sidebar that its scroll area shows can be clicked at its top edge, on
    a long chapter before and after scrolling it (Material's sticky title covered the first)."""
    page, blocked, errors = open_offline(browser_context, site)
    page.set_viewport_size({"width": width, "height": height})
    page.goto((site / "chapters" / "06_model.html").as_uri())
    covered = {}
    for scroll in (0, 4000):
        page.evaluate(f"window.scrollTo(0, {scroll})")
        page.wait_for_timeout(200)
        covered[scroll] = page.evaluate(
            """() => {
            const area = document.querySelector('.md-sidebar--primary .md-sidebar__scrollwrap')
              .getBoundingClientRect();
            const links = [...document.querySelectorAll('.md-sidebar--primary a.md-nav__link')];
            const shown = links.map(a => [a, a.getBoundingClientRect()]).filter(([a, r]) =>
              r.width > 0 && r.top + 2 >= area.top && r.top + 2 <= area.bottom);
            return shown.filter(([a, r]) =>
              !a.contains(document.elementFromPoint(r.left + r.width / 2, r.top + 2)))
              .map(([a, r]) => a.innerText.trim());
            }"""
        )
    assert covered == {0: [], 4000: []}, f"sidebar entries covered at {width} x {height}: {covered}"
    assert blocked == [] and errors == []


# ---- issue 46: the home link, one entry per object, config fields, search excerpts, HiDPI figures


@pytest.mark.parametrize("width", [1000, 1300])
def test_the_books_name_and_logo_lead_home_from_file_urls(browser_context, site, width):
    """From a chapter and from an API page opened from the file system, the book's name in the
    header leads to the home page (at 1000 px Material hides its logo: the name is the only way);
    the home page's "API reference" link opens the package's page, whose names open their
    entries."""
    page, blocked, errors = open_offline(browser_context, site)
    page.set_viewport_size({"width": width, "height": 900})
    home = (site / "index.html").as_uri()
    for start in (site / "chapters" / "06_model.html", site / "api" / "txl_lib.model.html"):
        page.goto(start.as_uri())
        page.locator(".md-header__topic a.book-home").first.click()
        page.wait_for_url(home)
        if width >= 1220:  # Material shows its logo from 76.25em
            page.goto(start.as_uri())
            page.locator("a.md-header__button.md-logo").click()
            page.wait_for_url(home)
    page.locator("article a", has_text="API reference").click()
    page.wait_for_url((site / "api" / "txl_lib.html").as_uri())
    page.locator("article table a", has_text="from_pretrained").first.click()
    page.wait_for_url("**/api/txl_lib.pretrained.html#txl_lib.pretrained.from_pretrained")
    assert page.locator('[id="txl_lib.pretrained.from_pretrained"]').is_visible()
    assert blocked == [] and errors == []


def search(page, query: str):
    "Type `query` into the book's search box; the result links (href), once they show."
    page.locator("input.md-search__input").click()
    page.keyboard.type(query)
    results = page.locator(".md-search-result__item a")
    results.first.wait_for(state="visible", timeout=30_000)
    return results


def test_searching_an_api_name_finds_each_object_once(browser_context, site):
    "`from_pretrained` is one function and one method: two results (the package page made three)."
    page, blocked, errors = open_offline(browser_context, site)
    page.set_viewport_size({"width": 1300, "height": 900})
    page.goto((site / "index.html").as_uri())
    hrefs = search(page, "from_pretrained").evaluate_all(
        "els => els.map(e => e.getAttribute('href'))"
    )
    entries = [
        h.split("#")[1] for h in hrefs if "#" in h and h.split("#")[1].endswith(".from_pretrained")
    ]
    assert sorted(entries) == [
        "txl_lib.model.SaveLoadMixin.from_pretrained",
        "txl_lib.pretrained.from_pretrained",
    ], hrefs
    assert blocked == [] and errors == []


def test_each_config_field_shows_its_description(browser_context, site):
    "On each config class's API page, every field's heading has a description under it, shown."
    from test_book import _config_classes

    page, blocked, errors = open_offline(browser_context, site)
    page.set_viewport_size({"width": 1300, "height": 900})
    bare = {}
    for config in _config_classes():
        page.goto((site / "api" / f"{config.__module__}.html").as_uri())
        anchor = f"{config.__module__}.{config.__name__}."
        bare[config.__name__] = page.evaluate(
            """anchor => [...document.querySelectorAll('.doc-attribute > .doc-heading[id]')]
              .filter(h => h.id.startsWith(anchor) && !h.id.slice(anchor.length).includes('.'))
              .filter(h => { const d = h.parentElement.querySelector(':scope > .doc-contents');
                             return !d || !d.innerText.trim()
                                    || d.getBoundingClientRect().height < 1; })
              .map(h => h.id.slice(anchor.length))""",
            anchor,
        )
    assert len(bare) >= 3 and {k: v for k, v in bare.items() if v} == {}, bare
    assert blocked == [] and errors == []


def test_search_excerpts_show_equations_as_text(browser_context, site):
    """A search that finds a section with inline maths shows its text whole, each equation as text
    (`e<sub>x<sub>i</sub></sub> + U<sub>i</sub>`), with no TeX and no hole where one was."""
    page, blocked, errors = open_offline(browser_context, site)
    page.set_viewport_size({"width": 1300, "height": 900})
    chapter, paragraph = next(  # the first paragraph of the book with inline maths
        (path, p)
        for path in hooks.chapters(ROOT / "notebooks")
        for p in parsed(site / "chapters" / f"{path.stem}.html").select("article p")
        if p.select("span.arithmatex")
    )
    heading = paragraph.find_previous(["h1", "h2", "h3"])
    expected = as_read(paragraph)
    page.goto((site / "index.html").as_uri())
    query = " ".join(re.findall(r"[A-Za-z]{4,}", heading.get_text())[:3])
    results = search(page, query)
    anchor = [f"/chapters/{chapter.stem}.html", f"#{heading['id']}" if heading.name != "h1" else ""]
    texts = results.evaluate_all(  # a result's address carries the query: page.html?h=word#section
        "(els, [path, hash]) => els.map(e => [new URL(e.href), e.textContent])"
        ".filter(([u, text]) => u.pathname.endsWith(path) && u.hash === hash).map(([u, t]) => t)",
        anchor,
    )
    assert texts, f"no result for {anchor} searching {query!r}"
    shown = " ".join(texts[0].split())
    assert not re.search(r"\\\(|\\\[|\\[a-z]+\{", shown), f"TeX in the excerpt: {shown}"
    assert expected[:150] in shown, f"the excerpt {shown[:300]!r} does not read {expected[:150]!r}"
    page.screenshot(path=str(ROOT / "build" / "book_search_maths.png"))
    page.goto((site / "chapters" / f"{chapter.stem}.html").as_uri())  # the text is the index's only
    copies = page.locator(".search-only").evaluate_all(
        "els => els.map(e => e.getClientRects().length)"
    )
    assert copies and not any(copies), "the search's copy of an equation shows on the page"
    assert blocked == [] and errors == []


def test_each_chapter_on_a_2x_desktop_code_fits_figures_are_sharp_equations_drawn(
    browser_context, site
):
    """At 1280 px on a display of device pixel ratio 2, one visit per chapter checks that code
    reflowed to 100 columns fits the text column and outputs wrap (nothing hidden sideways), that
    each figure has two image pixels or more per CSS pixel it is drawn at (a retina PNG drawn at
    half its pixels, or an SVG), and that each display equation is an SVG of real size."""
    page, blocked, errors = open_offline(browser_context, site)
    cdp = browser_context.new_cdp_session(page)
    cdp.send(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1280, "height": 900, "deviceScaleFactor": 2, "mobile": False},
    )
    hidden, soft, sizes = {}, {}, {}
    for chapter in hooks.chapters(ROOT / "notebooks"):
        text = chapter.read_text(encoding="utf-8")
        page.goto((site / "chapters" / f"{chapter.stem}.html").as_uri())
        assert page.evaluate("devicePixelRatio") == 2
        overflow = page.locator("article pre > code").evaluate_all(  # the element that scrolls
            "els => els.map(e => e.scrollWidth - e.clientWidth)"
        )
        if any(px > 1 for px in overflow):
            hidden[chapter.stem] = max(overflow)
        if "$$" in text:
            sizes[chapter.stem] = equation_sizes(page)
        if '"image/' not in text:
            continue
        drawn = page.locator("article img").evaluate_all(
            """els => Promise.all(els.map(e => e.decode().then(() =>
                [e.src.split('/').pop(), e.naturalWidth, e.getBoundingClientRect().width])))"""
        )
        low = [
            name
            for name, pixels, css in drawn
            if not name.endswith(".svg") and pixels < 2 * css - 1
        ]
        if low:
            soft[chapter.stem] = low
    assert hidden == {}, f"code blocks wider than the text column (px hidden): {hidden}"
    assert soft == {}, f"figures with under 2 pixels per CSS pixel at 2x: {soft}"
    assert sizes and too_small(sizes) == {}, (
        f"display equations drawn too small at 1280 px: {sizes}"
    )
    assert blocked == [] and errors == []
