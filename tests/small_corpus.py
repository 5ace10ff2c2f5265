"""A small text corpus for the command-line tests: the first 200,000 characters of Shakespeare's
works (chapter 00a's `load_corpus`), written once per machine, atomically."""

import os
import tempfile
from pathlib import Path

from txl_lib.data import load_corpus


def small_corpus() -> str:
    path = Path(tempfile.gettempdir()) / f"txl_lib-tests-{os.getuid()}" / "shakespeare-200k.txt"
    if not path.is_file():
        path.parent.mkdir(exist_ok=True)
        scratch = path.with_name(f".{path.name}.{os.getpid()}")
        scratch.write_text(load_corpus("shakespeare")[:200_000], encoding="utf-8")
        os.replace(scratch, path)
    return str(path)


SMALL_CORPUS = small_corpus()
