"""A learner's order, read from the committed notebooks (issue 45): no chapter imports a module
whose chapter comes later, no notebook is over 70 cells, and every chapter ends with exercises
whose solutions are code cells tagged `solution` that assert their answer (nbval runs them, so a
wrong solution fails `make test`)."""

import ast
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9]*.ipynb"))
MAX_CELLS = 70
DEFAULT_EXP = re.compile(r"^#\|\s*default_exp\s+(\S+)", re.M)


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def text(cell: dict) -> str:
    return "".join(cell["source"])


def chapter_of_module() -> dict[str, str]:
    "Each txl_lib module -> the notebook (stem) that exports it; the top level as `txl_lib`."
    found = {}
    for path in NOTEBOOKS:
        for cell in cells(path):
            match = DEFAULT_EXP.search(text(cell))
            if match:
                name = match[1]
                found["txl_lib" if name == "__init__" else f"txl_lib.{name}"] = path.stem
    return found


def imported_modules(path: Path) -> set[str]:
    "Every txl_lib module a notebook's code imports (`import txl_lib` counts as the top level)."
    modules = set()
    for cell in cells(path):
        if cell["cell_type"] != "code":
            continue
        source = "\n".join(
            line for line in text(cell).splitlines() if not line.lstrip().startswith(("%", "!"))
        )
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("txl_lib"):
                modules.add(node.module)
            elif isinstance(node, ast.Import):
                modules |= {a.name for a in node.names if a.name.startswith("txl_lib")}
    return modules


def is_appendix(stem: str) -> bool:
    "An appendix holds machinery a learner may skip: any chapter may import it."
    return "_appendix_" in stem


def later_imports(path: Path) -> list[str]:
    chapters = chapter_of_module()
    return sorted(
        f"{module} (chapter {chapters[module]})"
        for module in imported_modules(path)
        if module in chapters and chapters[module] > path.stem and not is_appendix(chapters[module])
    )


def test_the_module_map_is_read_from_the_notebooks():
    chapters = chapter_of_module()
    assert chapters["txl_lib.attention"] == "04_score_decomposition"
    assert chapters["txl_lib"] == "12a_top_level" and len(chapters) >= 25


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_chapter_imports_a_later_chapters_module(path):
    assert later_imports(path) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_notebook_is_over_70_cells(path):
    assert len(cells(path)) <= MAX_CELLS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_chapter_ends_with_exercises_whose_solutions_assert(path):
    notebook = cells(path)
    heading = [
        i
        for i, c in enumerate(notebook)
        if c["cell_type"] == "markdown" and text(c).startswith("## Exercises")
    ]
    solutions = [
        i for i, c in enumerate(notebook) if "solution" in c.get("metadata", {}).get("tags", [])
    ]
    assert len(heading) == 1, "one '## Exercises' cell"
    assert solutions and min(solutions) > heading[0], "solution cells after the exercises"
    for i in solutions:
        cell = notebook[i]
        asserts = [n for n in ast.walk(ast.parse(text(cell))) if isinstance(n, ast.Assert)]
        assert cell["cell_type"] == "code" and asserts, f"cell {i}: a solution asserts its answer"
        assert cell["execution_count"] is not None, f"cell {i}: committed executed"


def test_the_appendix_is_the_last_chapter_and_holds_the_infrastructure():
    chapters = chapter_of_module()
    appendices = sorted(stem for stem in set(chapters.values()) if is_appendix(stem))
    assert appendices == ["13_appendix_infrastructure", "13a_appendix_serialization"]
    assert [p.stem for p in NOTEBOOKS[-2:]] == appendices  # the last chapters
    assert [chapters["txl_lib.infrastructure"], chapters["txl_lib.serialization"]] == appendices
    assert [later_imports(p) for p in NOTEBOOKS[-2:]] == [[], []]  # each imports earlier ones only


def test_a_later_import_is_found(tmp_path):
    # the checker itself, on a chapter 05a that imports chapter 05b's module and the top level
    fake = tmp_path / "05a_fake.ipynb"
    code = "from txl_lib.cache import InferenceCache\nfrom txl_lib.attention import rel_shift\n"
    code += "from txl_lib import train"
    fake.write_text(json.dumps({"cells": [{"cell_type": "code", "source": [code]}]}))
    assert later_imports(fake) == [
        "txl_lib (chapter 12a_top_level)",
        "txl_lib.cache (chapter 05b_frozen_layers)",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_names_the_kernel_jupyterlab_writes(path):
    "The kernelspec ipykernel installs, as JupyterLab saves it: a notebook opens unmodified."
    from ipykernel.kernelspec import get_kernel_dict

    installed = get_kernel_dict()
    kernelspec = json.loads(path.read_text(encoding="utf-8"))["metadata"]["kernelspec"]
    assert kernelspec == {
        "display_name": installed["display_name"],
        "language": installed["language"],
        "name": "python3",
    }
