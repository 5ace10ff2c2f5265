"""The public API is typed and documented in the style the book renders (mkdocs.yml: Google): every
function `import txl_lib` gives, and every method of the interface its classes share, has annotated
parameters and return, and a docstring whose `Args:` names each parameter and whose `Returns:` says
what comes back; every config field is described in its class's `Attributes:`; an override says
which method it follows. `make lint` runs the type checker over the library."""

import dataclasses
import inspect
import re
import subprocess
from pathlib import Path

import pytest
import torch

import txl_lib
from txl_lib.model import PretrainedModel

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = [getattr(txl_lib, name) for name in txl_lib.__all__]
CLASSES = [obj for obj in PUBLIC if inspect.isclass(obj)]
FUNCTIONS = [obj for obj in PUBLIC if inspect.isfunction(obj)]


def section(doc: str, title: str) -> str:
    "The text of the Google section `title` of `doc` ('' if it has none)."
    found = re.search(rf"^{title}:\n((?:[ \t]+\S.*\n?|\n)+)", doc, re.M)
    return found[1] if found else ""


def documented_names(doc: str, title: str) -> set[str]:
    "The names a Google section lists (`name: text`, `**name: text`)."
    return set(re.findall(r"^\s{4}\**(\w+)(?: \(.*?\))?:", section(doc, title), re.M))


def interface_methods(cls: type) -> list:
    """The methods of `cls` a user calls: every public one of a class that is not a model, and of a
    model those of the door all models share (PretrainedModel and its mixins)."""
    shared = [k for k in PretrainedModel.__mro__ if k.__module__.startswith("txl_lib")]
    names = (
        [n for k in shared for n in vars(k) if not n.startswith("_")]
        if issubclass(cls, torch.nn.Module)
        else [n for n in vars(cls) if not n.startswith("_")]
    )
    found = []
    for name in names:
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        member = inspect.getattr_static(cls, name, None)
        func = getattr(member, "__func__", member)
        if owner is not None and owner.__module__.startswith("txl_lib"):
            if inspect.isfunction(func) and not name.startswith("check"):  # validators
                found.append((f"{owner.__name__}.{name}", func, owner))
    return found


def problems_of(qualname: str, func) -> list[str]:
    "What `func` lacks: annotations, Args naming each parameter, Returns."
    sig, doc = inspect.signature(func), inspect.getdoc(func) or ""
    params = [p for p in sig.parameters.values() if p.name not in ("self", "cls")]
    problems = [
        f"{qualname}: parameter {p.name} is not annotated"
        for p in params
        if p.annotation is inspect.Parameter.empty
    ]
    if sig.return_annotation is inspect.Signature.empty:
        problems.append(f"{qualname}: the return is not annotated")
    if is_preset(func):  # a config's preset: its one line names each parameter
        missing = {p.name for p in params if f"`{p.name}`" not in doc}
        return problems + [f"{qualname}: the docstring does not name {sorted(missing)}"] * bool(
            missing
        )
    if missing := {p.name for p in params} - documented_names(doc, "Args"):
        problems.append(f"{qualname}: Args does not describe {sorted(missing)}")
    if sig.return_annotation not in (None, "None") and not section(doc, "Returns"):
        problems.append(f"{qualname}: no Returns section")
    return problems


def is_preset(func) -> bool:
    "A classmethod of a config class that returns that class (`TXLConfig.tiny`)."
    owner = getattr(txl_lib, func.__qualname__.split(".")[0], None)
    member = inspect.getattr_static(owner, func.__name__, None) if owner else None
    return (
        isinstance(member, classmethod)
        and dataclasses.is_dataclass(owner)
        and (inspect.signature(func).return_annotation == owner.__name__)
    )


def test_every_public_function_is_typed_and_documented():
    problems = [p for f in FUNCTIONS for p in problems_of(f.__name__, f)]
    assert problems == []


def test_every_interface_method_is_typed_and_documented():
    seen, problems = set(), []
    for cls in [PretrainedModel, *CLASSES]:  # the door every model shares, then each class
        for qualname, func, owner in interface_methods(cls):
            if qualname in seen:
                continue
            seen.add(qualname)
            base = next(
                (k for k in owner.__mro__[1:] if func.__name__ in vars(k) and k is not object), None
            )
            doc = inspect.getdoc(func) or ""
            if base is not None and base.__module__.startswith("txl_lib"):  # an override
                if not doc.startswith(f"As `{base.__name__}.{func.__name__}`"):
                    problems.append(f"{qualname} overrides {base.__name__}: say so (As `...`)")
            else:
                problems += problems_of(qualname, func)
    assert problems == []
    assert {"PretrainedModel.forward", "GenerationMixin.generate", "TransformerXL.forward"} <= seen


@pytest.mark.parametrize(
    "cls", [c for c in CLASSES if dataclasses.is_dataclass(c)], ids=lambda c: c.__name__
)
def test_every_config_field_is_described(cls):
    own = {f.name for f in dataclasses.fields(cls)} - {
        f.name
        for base in cls.__mro__[1:]
        if dataclasses.is_dataclass(base)
        for f in dataclasses.fields(base)
    }
    assert own, f"{cls.__name__} adds no field"
    assert own <= documented_names(inspect.getdoc(cls) or "", "Attributes")


def test_the_section_reader_is_not_fooled():
    "The checks above fail on what they must refuse: a parameter missing from Args, no Returns."

    def half_documented(a: int, b: int) -> int:
        """Something.

        Args:
            a: The first.
        """
        return a + b

    assert problems_of("f", half_documented) == [
        "f: Args does not describe ['b']",
        "f: no Returns section",
    ]


def test_make_lint_runs_the_type_checker_over_the_library():
    dry = subprocess.run(["make", "-n", "lint"], cwd=ROOT, capture_output=True, text=True)
    assert dry.returncode == 0 and re.search(r"/mypy\s*$", dry.stdout, re.M), dry.stdout
    mypy_settings = (ROOT / "pyproject.toml").read_text().split("[tool.mypy]")[1]
    assert re.search(r'^files = \["txl_lib"\]$', mypy_settings.split("\n[")[0], re.M)
