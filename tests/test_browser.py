"""The reading experience in a real browser: the HTML book (`make html`) and JupyterLab, in headless Chromium.

Chromium comes from the system (Debian's `chromium`, which `.ci/run` installs); no browser is ever downloaded, and
the browser is kept off the network: its own background traffic is switched off and every request that is not for
our pages is aborted."""
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from txl_lib.book import build_book, read_chapters

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright (in .[dev]) for browser tests")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH: `apt-get install chromium` (as root) "
                                                         "to run the browser tests; .ci/run does it")
OFFLINE_FLAGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update", "--no-first-run",
                 "--disable-sync", "--disable-default-apps", "--disable-extensions", "--metrics-recording-only",
                 "--disable-domain-reliability", "--no-pings"]


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory):
    with playwright.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("profile")), executable_path=CHROMIUM, headless=True, args=OFFLINE_FLAGS,
            viewport={"width": 1100, "height": 900})
        yield context
        context.close()


def local_only(context, allowed: tuple[str, ...]):
    "Abort every request whose URL does not start with one of `allowed`."
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(allowed) else route.abort())


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return build_book(ROOT / "notebooks", tmp_path_factory.mktemp("html"))


def figures_in(chapter) -> int:
    import nbformat
    nb = nbformat.read(chapter.path, as_version=4)
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_the_html_book_in_chromium(browser_context, site):
    base = site.parent.as_uri() + "/"
    local_only(browser_context, (base,))
    page, errors = browser_context.new_page(), []
    page.on("console", lambda m: errors.append((page.url, m.text)) if m.type == "error"
            and (m.location or {}).get("url", "").startswith(base) else None)
    page.on("pageerror", lambda e: errors.append((page.url, str(e))))
    page.goto(site.as_uri())
    chapters = read_chapters(ROOT / "notebooks")
    assert page.locator("h1").first.inner_text() == "Transformer-XL, annotated"
    assert page.locator("table a").all_inner_texts() == [c.title for c in chapters]
    assert sum(p.stat().st_size for p in site.parent.iterdir()) < 20 * 2**20
    for chapter in chapters:
        page.goto(base + chapter.page)
        assert chapter.title in page.locator("h1").first.inner_text()
        if figures_in(chapter):
            widths = page.locator(".jp-RenderedImage img").evaluate_all("els => els.map(e => e.naturalWidth)")
            assert widths and min(widths) > 0, f"{chapter.page}: a figure did not render"
        assert page.locator('nav.book a[href="index.html"]').count() == 2
        if chapter.number == "05":
            (ROOT / "build").mkdir(exist_ok=True)
            page.screenshot(path=str(ROOT / "build" / "chapter05.png"), full_page=False)
    page.goto(base + chapters[0].page)
    page.locator('nav.book a[rel="next"]').first.click()
    assert page.url.endswith(chapters[1].page)
    assert errors == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, process, log: Path, seconds: float = 60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"jupyter lab did not answer at {url} within {seconds} s")


def test_jupyterlab_renders_chapter_01(browser_context, tmp_path):
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")       # lab may autosave: never on the sources
    port, token = free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    server = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
                               f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path / 'notebooks'}",
                               "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                               "--LabApp.extension_manager=readonly", "--allow-root"],
                              env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "lab.log", "wb"))
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
