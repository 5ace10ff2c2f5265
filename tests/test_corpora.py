"""Corpora (chapter 11), offline: a local HTTP server that honours Range requests serves a small
archive the test makes; download, resume, verification, atomicity, splits, local files and
folders, the original's enwik8 stream without newlines."""

import hashlib
import http.server
import threading
import zipfile

import pytest
import torch

from txl_lib.corpora import Source, SOURCES, download, load_splits, prepare

DATA = (
    bytes(range(32, 127)) * 100 + "é ü".encode("utf-8") * 50
)  # 9,500 + 250 bytes, non-ASCII included


class RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves the server's `files` {path: bytes}; honours `Range: bytes=N-` unless the server says
    not to."""

    def do_GET(self):
        body = self.server.files.get(self.path)
        self.server.requests.append((self.path, self.headers.get("Range")))
        if body is None:
            self.send_error(404)
            return
        start = (
            int(self.headers["Range"].split("=")[1].rstrip("-"))
            if self.headers.get("Range") and self.server.ranges
            else 0
        )
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        self.wfile.write(body[start:])

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.HTTPServer(("127.0.0.1", 0), RangeHandler)
    httpd.files, httpd.requests, httpd.ranges = {}, [], True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def archive_bytes(member: str, data: bytes) -> bytes:
    import io

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(member, data)
    return buffer.getvalue()


def source_for(server, data=DATA, digest=None):
    url = f"http://127.0.0.1:{server.server_port}/tiny8.zip"
    server.files["/tiny8.zip"] = archive_bytes("tiny8", data)
    return Source(
        "tiny8",
        url,
        "tiny8",
        len(data),
        digest or "sha256:" + hashlib.sha256(data).hexdigest(),
        (len(data) - 1000, 500, 500),
    )


def test_download_verify_split_and_reuse_the_cache(server, tmp_path):
    source = source_for(server)
    corpus = load_splits("tiny8", tmp_path, download=True, sources={"tiny8": source})
    assert [len(corpus.train), len(corpus.valid), len(corpus.test)] == [len(DATA) - 1000, 500, 500]
    decoded = "".join(
        corpus.vocab.decode(part) for part in (corpus.train, corpus.valid, corpus.test)
    )
    assert decoded.encode("latin-1") == DATA  # one symbol per byte, nothing lost
    assert len(corpus.vocab) == len(set(DATA))
    assert sorted(p.name for p in (tmp_path / "tiny8").iterdir()) == ["tiny8", "tiny8.zip"]
    server.shutdown()  # from now on, no network
    again = load_splits("tiny8", tmp_path, download=False, sources={"tiny8": source})
    assert torch.equal(again.train, corpus.train)


def test_an_interrupted_download_resumes_with_a_range_request(server, tmp_path):
    source = source_for(server)
    whole = server.files["/tiny8.zip"]
    part = tmp_path / "tiny8.zip.part"
    half = len(whole) // 2
    part.write_bytes(whole[:half])  # what an interrupted attempt left
    download(source.url, tmp_path / "tiny8.zip")
    assert server.requests[-1] == ("/tiny8.zip", f"bytes={half}-")
    assert (tmp_path / "tiny8.zip").read_bytes() == whole and not part.exists()


def test_a_server_without_ranges_restarts_the_part_file(server, tmp_path):
    source = source_for(server)
    server.ranges = False
    (tmp_path / "tiny8.zip.part").write_bytes(b"garbage" * 10)
    download(source.url, tmp_path / "tiny8.zip")
    assert (tmp_path / "tiny8.zip").read_bytes() == server.files["/tiny8.zip"]


def test_a_wrong_digest_keeps_nothing_extracted(server, tmp_path):
    source = source_for(server, digest="sha256:" + "0" * 64)
    with pytest.raises(ValueError, match="does not hold the pinned"):
        prepare(source, tmp_path, download_missing=True)
    assert sorted(p.name for p in (tmp_path / "tiny8").iterdir()) == [
        "tiny8.zip"
    ]  # no member, no temporary file


def test_a_corrupt_archive_is_refused(tmp_path):
    source = Source("tiny8", "http://127.0.0.1:9/tiny8.zip", "tiny8", 3, "sha256:00", (1, 1, 1))
    (tmp_path / "tiny8").mkdir()
    (tmp_path / "tiny8" / "tiny8.zip").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="does not hold the pinned"):
        prepare(source, tmp_path)
    assert sorted(p.name for p in (tmp_path / "tiny8").iterdir()) == ["tiny8.zip"]


def test_nothing_downloads_unless_asked(server, tmp_path):
    source = source_for(server)
    with pytest.raises(FileNotFoundError, match="--download"):
        load_splits("tiny8", tmp_path, sources={"tiny8": source})
    assert server.requests == [] and not (tmp_path / "tiny8").exists()


def test_standard_sources_have_the_standard_splits():
    for name in ("enwik8", "text8"):
        source = SOURCES[name]
        assert (
            source.splits == (90_000_000, 5_000_000, 5_000_000)
            and sum(source.splits) == source.size
        )


def test_local_files_and_folders(tmp_path):
    (tmp_path / "a.txt").write_text("hello world " * 200)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("goodbye " * 100)
    one = load_splits(str(tmp_path / "a.txt"))
    n = len("hello world " * 200)
    assert len(one.train) + len(one.valid) + len(one.test) == n and len(one.valid) == n // 20
    folder = load_splits(str(tmp_path))
    text = "".join(folder.vocab.decode(p) for p in (folder.train, folder.valid, folder.test))
    assert text == "hello world " * 200 + "\n" + "goodbye " * 100
    with pytest.raises(FileNotFoundError, match="no such corpus"):
        load_splits(str(tmp_path / "missing"))


def original_stream(part: bytes) -> list[int]:
    """The original's enwik8 pipeline on one split, transcribed: prep_enwik8.py writes the bytes
    as numbers with a line break for each newline byte; the original's Vocab reads the lines,
    strips and splits them, adds no end of line (add_eos=False)."""
    text = " ".join(str(c) if c != ord("\n") else "\n" for c in part)
    return [
        int(symbol) for line in text.splitlines(keepends=True) for symbol in line.strip().split()
    ]


def test_dropping_newlines_gives_the_original_s_enwik8_stream(server, tmp_path):
    data = b"<page>\n  <title>A</title>\n\n" * 300 + bytes(
        range(1, 256)
    )  # every byte value, newlines at ends
    source = source_for(server, data)
    kept = load_splits("tiny8", tmp_path, download=True, sources={"tiny8": source})
    dropped = load_splits("tiny8", tmp_path, sources={"tiny8": source}, drop_newlines=True)
    a, b = source.splits[0], source.splits[0] + source.splits[1]
    for ids, part in [
        (dropped.train, data[:a]),
        (dropped.valid, data[a:b]),
        (dropped.test, data[b:]),
    ]:
        assert list(dropped.vocab.decode(ids).encode("latin-1")) == original_stream(part)
    symbols = {s for part in (data[:a], data[a:b], data[b:]) for s in original_stream(part)}
    assert (
        len(dropped.vocab) == len(symbols) == len(kept.vocab) - 1 == 254
    )  # the original's count: no newline
    assert len(kept.test) - len(dropped.test) == data[b:].count(b"\n") > 0


def test_a_cached_corpus_that_changed_is_never_trusted(server, tmp_path):
    """Issue 31: an extracted file of the right size but other bytes (all zeros) was read as the
    corpus."""
    source = source_for(server)
    corpus = load_splits("tiny8", tmp_path, download=True, sources={"tiny8": source})
    extracted = tmp_path / "tiny8" / "tiny8"
    extracted.write_bytes(bytes(len(DATA)))  # the right size, the wrong bytes
    again = load_splits("tiny8", tmp_path, download=False, sources={"tiny8": source})
    assert (
        torch.equal(again.train, corpus.train) and extracted.read_bytes() == DATA
    )  # extracted anew
    extracted.write_bytes(bytes(len(DATA)))
    (tmp_path / "tiny8" / "tiny8.zip").unlink()  # and no archive to extract it from
    with pytest.raises(
        ValueError, match=r"tiny8 is not the pinned file: delete it and --download it again"
    ):
        load_splits("tiny8", tmp_path, download=False, sources={"tiny8": source})


def test_a_device_a_pipe_or_a_huge_file_is_refused_before_reading(tmp_path, monkeypatch):
    """Issue 31: --data /dev/zero ended in MemoryError and a FIFO hung; only regular files, of a
    bounded size."""
    import os

    import txl_lib.corpora as corpora

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        with pytest.raises(ValueError, match="is not a regular file"):
            load_splits(path)
    text = tmp_path / "big.txt"
    text.write_text("x" * 20)
    monkeypatch.setattr(corpora, "MAX_INT", 10)
    with pytest.raises(ValueError, match="holds 20 bytes, more than the 10 a corpus may have here"):
        load_splits(str(text))


def test_a_download_without_network_names_the_url_and_leaves_no_folder(tmp_path):
    "Issue 31: --download without network left an empty folder and a message without the URL."
    source = Source(
        "tiny8", "http://127.0.0.1:9/tiny8.zip", "tiny8", 10, "sha256:" + "0" * 64, (8, 1, 1)
    )
    with pytest.raises(
        OSError, match=r"could not download http://127.0.0.1:9/tiny8.zip .*fetch it into"
    ):
        load_splits("tiny8", tmp_path / "cache", download=True, sources={"tiny8": source})
    assert not (tmp_path / "cache").exists()


def test_a_download_never_writes_through_a_link_planted_at_its_part_file(server, tmp_path):
    """Issue 31's kind of fault, searched for elsewhere: the resumable .part file was opened through
    links."""
    source = source_for(server)
    folder = tmp_path / "tiny8"
    folder.mkdir()
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    (folder / "tiny8.zip.part").symlink_to(victim)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        load_splits("tiny8", tmp_path, download=True, sources={"tiny8": source})
    assert victim.read_text() == "keep me"
