"""Issue 17, the training and generation commands (chapters 00b, 11, 11a, 11b): a run folder
survives a crash between any two writes, a full disk and real kills (it resumes exactly, or
refuses clearly); a second run, a fresh run and a resume with other arguments cannot spoil a
run; bad data, devices and arguments are named before anything is written; a loss that is not
finite stops the run with its last checkpoint kept."""

import errno
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

import txl_lib.cli as cli
import txl_lib.utils
from txl_lib import from_pretrained
from txl_lib.cli import parse_args, run_lock, train_command
from txl_lib.corpora import load_splits
from txl_lib.generate_cli import generate_command
from txl_lib.model import TXLConfig, TransformerXL
from txl_lib.serialization import content_sha256, save_checkpoint
from txl_lib.data import LMOutput, token_loss
from txl_lib.training import stream_documents, train
from small_corpus import SMALL_CORPUS

SMALL = (
    f"--data {SMALL_CORPUS} --batch-size 4 --set n_layer=1 --set d_model=32 --set "
    "d_inner=64 --set tgt_len=16 --set mem_len=16 --eval-tokens 200 --quiet"
).split()


def command(out, *extra, steps=6):
    return SMALL + ["--steps", str(steps), "--out", str(out), *extra]


def state_weights(folder) -> dict:
    return torch.load(folder / "state.pt", weights_only=True)["model"]


def model_weights(folder) -> dict:
    """The weights of the run folder's model copy (config.json + model.safetensors), read by
    from_pretrained."""
    return from_pretrained(folder).state_dict()


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def folder_bytes(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 6-step run: the weights and losses every interrupted-then-resumed run must
    reach exactly."""
    out = tmp_path_factory.mktemp("reference") / "run"
    log = train_command(command(out))
    return model_weights(out), log["loss"]


class Crash(BaseException):
    """An abrupt stop between two writes: no `except Exception` catches it, as nothing catches a
    kill."""


def crash_after_renames(monkeypatch, n: int):
    "From now on, the n-th file renamed into place is the last thing the run does."
    real, count = os.replace, [0]

    def replace(source, target):
        real(source, target)
        count[0] += 1
        if count[0] == n:
            raise Crash(f"after rename {n}: {target}")

    monkeypatch.setattr(os, "replace", replace)


def resume_exactly_or_refuse(out, reference):
    """After a crash: --resume continues to the reference weights and losses, or refuses with a
    clear message."""
    try:
        log = train_command(command(out, "--resume"))
    except FileNotFoundError as e:
        assert "holds no state.pt: nothing to resume" in str(e)
        return "refused"
    weights, losses = reference
    assert same(model_weights(out), weights) and same(state_weights(out), weights)
    assert log["loss"] == losses
    assert not list(out.glob("*.tmp")) and not (out / "run.lock").exists()
    return "resumed"


@pytest.mark.parametrize(
    "n", [1, 2, 3, 4, 5, 6, 8, 11]
)  # 11: after the last step's state.pt, before its copies
def test_a_crash_between_any_two_writes_resumes_exactly(tmp_path, monkeypatch, reference, n):
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        crash_after_renames(
            patch, n
        )  # each save: state.pt, vocab.json, model.safetensors, config.json, log.json
        with pytest.raises(Crash):
            train_command(command(out, "--save-every", "2"))
    assert resume_exactly_or_refuse(out, reference) == "resumed"


@pytest.mark.parametrize("full_at", [1, 2, 3, 4])
def test_a_full_disk_keeps_the_last_checkpoint_and_resumes_exactly(
    tmp_path, monkeypatch, reference, full_at
):
    out, calls = tmp_path / "run", [0]

    class FullDisk:  # an open file on a full disk: every write fails
        def __init__(self, file):
            self.file = file

        def __enter__(self):
            return self

        def __exit__(self, *error):
            self.file.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.file, name)

    real_fdopen = os.fdopen

    def fdopen(*args, **kwargs):  # the one writer opens each file it writes (chapter 00)
        calls[0] += 1
        file = real_fdopen(*args, **kwargs)
        return FullDisk(file) if calls[0] >= full_at else file

    with (
        monkeypatch.context() as patch
    ):  # each save writes state.pt, then the model, vocab.json and log.json
        patch.setattr(txl_lib.infrastructure.os, "fdopen", fdopen)
        with pytest.raises(OSError, match="disk is full"):
            train_command(command(out, "--save-every", "2"))
    assert not list(out.glob("*.tmp"))
    expected = "refused" if full_at == 1 else "resumed"
    assert resume_exactly_or_refuse(out, reference) == expected


def test_real_kills_during_save_every_1_leave_a_run_that_resumes_exactly(tmp_path, reference):
    """A process that dies (os._exit) between two writes, then one killed with SIGKILL at a random
    moment."""
    out, env = tmp_path / "run", {**os.environ, "OMP_NUM_THREADS": "1"}
    script = (
        "import os, sys; from txl_lib import cli; real, count = os.replace, [0]\n"
        "def replace(a, b):\n    real(a, b); count[0] += 1\n    count[0] == 7 and os._exit(9)\n"
        "os.replace = replace; cli.main(argv=sys.argv[1:])"
    )
    died = subprocess.run(
        [sys.executable, "-c", script, *command(out, "--save-every", "1")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert died.returncode == 9, died.stderr[-2000:]
    assert (out / "run.lock").exists()  # left by the dead process: the next run takes it over
    killed = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "txl_lib",
            "train",
            *command(out, "--save-every", "1", "--resume", steps=6),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    first = (out / "state.pt").stat().st_mtime_ns
    while killed.poll() is None and (out / "state.pt").stat().st_mtime_ns == first:
        time.sleep(0.001)  # until the resumed run has saved once
    time.sleep(random.Random(0).uniform(0, 0.05))
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert resume_exactly_or_refuse(out, reference) == "resumed"


def test_a_second_run_into_a_folder_in_use_is_refused(tmp_path):
    out = tmp_path / "run"
    with run_lock(out):  # another run holds the folder
        before = folder_bytes(out)
        with pytest.raises(RuntimeError, match=f"in use by another run \\(pid {os.getpid()}"):
            train_command(command(out))
        assert folder_bytes(out) == before
    assert not out.exists()  # the lock's holder made the folder and left it empty


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / "run.lock").write_text(f"{dead.pid} somewhere\n")
    (out / "state.pt3f9a0c1e.tmp").write_bytes(
        b"half"
    )  # what killed saves left (the writer's names)
    (out / "model.safetensors5b7d2e90.tmp").write_bytes(b"half")
    (out / "notes.tmp").write_bytes(b"the user's own")  # not the run's: kept (issue 31)
    (out / "state.pt.mine.tmp").write_bytes(b"the user's own")
    train_command(command(out, steps=2))
    assert (
        sorted(p.name for p in out.iterdir())
        == (
            "config.json log.json model.safetensors notes.tmp state.pt state.pt.mine.tmp vocab.json"
        ).split()
    )


def test_a_fresh_run_never_spoils_a_run_already_in_the_folder(tmp_path, monkeypatch):
    out = tmp_path / "run"
    train_command(command(out, steps=2))
    before = folder_bytes(out)
    other = tmp_path / "other.txt"
    other.write_text("another corpus, another vocabulary. " * 40)
    with pytest.raises(FileExistsError, match="holds a run .*--overwrite"):
        train_command(command(out, steps=2) + ["--data", str(other)])
    with monkeypatch.context() as patch:  # --overwrite, and the new run dies in its first step
        patch.setattr(
            cli,
            "training_step",
            lambda *a, **k: (_ for _ in ()).throw(RuntimeError("out of memory")),
        )
        with pytest.raises(RuntimeError, match="out of memory"):
            train_command(command(out, "--overwrite", steps=2) + ["--data", str(other)])
    assert folder_bytes(out) == before  # the old run can still be sampled and resumed
    train_command(command(out, "--overwrite", steps=2) + ["--data", str(other)])
    assert json.loads((out / "vocab.json").read_text()) == sorted(set(other.read_text()))


def test_overwrite_never_leaves_a_model_beside_another_vocabulary(tmp_path, monkeypatch):
    out, other = tmp_path / "run", tmp_path / "other.txt"
    other.write_text("another corpus, another vocabulary. " * 40)
    train_command(command(out, steps=2))
    for n in (
        1,
        2,
        3,
        4,
    ):  # a kill after state.pt, vocab.json, model.safetensors, config.json of the new run
        with monkeypatch.context() as patch:
            crash_after_renames(patch, n)
            with pytest.raises(Crash):
                train_command(command(out, "--overwrite", steps=2) + ["--data", str(other)])
        vocab = json.loads((out / "vocab.json").read_text())
        try:  # either the model and the vocabulary it was saved with, or an error naming a file
            generate_command(["--checkpoint", str(out), "--tokens", "2", "--prompt", vocab[0]])
        except ValueError as error:
            assert re.search(r"(config|vocab)\.json differs from the \1\.json model", str(error))
            assert n in (2, 3)  # the kills after config.json or vocab.json, before the model
        else:
            assert from_pretrained(out).config.n_token == len(vocab) and n in (1, 4)


def test_a_run_of_an_earlier_version_loses_its_model_pt_at_the_first_save(tmp_path, reference):
    """A folder as the command wrote it before (state.pt, model.pt, vocab.json): a fresh run sees
    a run there, and a resumed one replaces model.pt by config.json + model.safetensors, so no
    two copies disagree."""
    out = tmp_path / "run"
    train_command(command(out, "--stop-after", "3"))
    save_checkpoint(out / "model.pt", from_pretrained(out), step=3)
    for name in ("model.safetensors", "config.json"):
        (out / name).unlink()
    with pytest.raises(
        FileExistsError, match=r"holds a run \(state.pt, vocab.json, log.json, model.pt\)"
    ):
        train_command(command(out))
    train_command(command(out, "--resume"))
    assert not (out / "model.pt").exists() and same(model_weights(out), reference[0])


def test_a_run_that_fails_before_its_first_checkpoint_leaves_no_folder(tmp_path):
    out = tmp_path / "a" / "b" / "run"
    with pytest.raises(FloatingPointError, match="nothing was saved"):
        train_command(command(out, "--lr", "1e6", "--warmup", "0", steps=30))
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--set", "n_layer=2"], "set .*n_layer=2"),
        (["--preset", "enwik8_base"], "preset 'enwik8_base'"),
        (["--batch-size", "3"], "--batch-size 3 \\(the run has 4\\)"),
        (["--steps", "3"], "steps 3 \\(the run has 6\\)"),
        (["--stop-after", "2"], "already at step 4"),
    ],
)
def test_resume_with_arguments_that_cannot_continue_the_run_is_refused(tmp_path, extra, message):
    out = tmp_path / "run"
    train_command(command(out, "--stop-after", "4"))
    before = folder_bytes(out)
    with pytest.raises(ValueError, match=message):
        train_command(command(out, "--resume") + extra)
    assert folder_bytes(out) == before


def test_resume_with_another_corpus_is_refused(tmp_path):
    out, text = tmp_path / "run", tmp_path / "text.txt"
    text.write_text("".join(f"line {i}: the quick brown fox\n" for i in range(200)))
    train_command(command(out, "--stop-after", "2"))
    with pytest.raises(ValueError, match=f"data '{text}' \\(the run has '{SMALL_CORPUS}'\\)"):
        train_command(command(out, "--resume") + ["--data", str(text)])


def test_resume_with_a_changed_rate_warns_and_continues_as_started(tmp_path, reference):
    out = tmp_path / "run"
    train_command(command(out, "--stop-after", "3"))
    with pytest.warns(UserWarning, match="--lr 0.5 is ignored: .* continues with 0.003"):
        log = train_command(command(out, "--resume", "--lr", "0.5"))
    assert same(model_weights(out), reference[0]) and log["loss"] == reference[1]


@pytest.mark.parametrize(
    "damage", [lambda b: b"", lambda b: b[: len(b) // 2], lambda b: b"not a torch file"]
)
def test_a_damaged_state_is_named_and_the_copies_do_not_matter(tmp_path, reference, damage):
    out = tmp_path / "run"
    train_command(command(out, "--stop-after", "3"))
    state = (out / "state.pt").read_bytes()
    (out / "state.pt").write_bytes(damage(state))
    with pytest.raises(ValueError, match=f"{out / 'state.pt'} is corrupt or truncated"):
        train_command(command(out, "--resume"))
    (out / "state.pt").write_bytes(state)
    for name in (
        "model.safetensors",
        "config.json",
        "log.json",
    ):  # copies for people: resume reads state.pt
        (out / name).write_bytes(damage((out / name).read_bytes()))
    train_command(command(out, "--resume"))
    assert same(model_weights(out), reference[0])


def test_a_damaged_model_or_vocabulary_is_named_by_the_generate_command(tmp_path):
    out = tmp_path / "run"
    train_command(command(out, steps=2))
    vocab = (out / "vocab.json").read_text()
    (out / "vocab.json").write_text(vocab[:9])
    with pytest.raises(ValueError, match=f"{out / 'vocab.json'} differs from the vocab.json"):
        generate_command(["--checkpoint", str(out)])
    (out / "vocab.json").write_text(vocab)
    (out / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes()[:100])
    with pytest.raises(
        ValueError,
        match=f"{out / 'model.safetensors'} is corrupt or truncated, or not a safetensors file",
    ):
        generate_command(["--checkpoint", str(out)])


def test_generate_reads_a_run_folder_and_names_a_state_file(tmp_path):
    out = tmp_path / "run"
    train_command(command(out, steps=2))
    from_folder = generate_command(["--checkpoint", str(out), "--prompt", "def ", "--tokens", "12"])
    assert from_folder == generate_command(  # the model file alone, with the run's vocabulary
        ["--checkpoint", str(out / "model.safetensors"), "--prompt", "def ", "--tokens", "12"]
    )
    (out / "config.json").unlink()  # a file the model was saved with: named as missing
    with pytest.raises(FileNotFoundError, match=f"{out / 'config.json'} is missing"):
        generate_command(["--checkpoint", str(out)])
    with pytest.raises(ValueError, match="state.pt \\(for --resume\\): pass the run folder"):
        generate_command(["--checkpoint", str(out / "state.pt")])


@pytest.mark.parametrize("clip", ["-1", "0"])
def test_the_command_refuses_the_clips_the_library_refuses(tmp_path, clip):
    with pytest.raises(ValueError, match="clip must be a finite number > 0"):
        train_command(command(tmp_path / "run", "--clip", clip))
    with pytest.raises(ValueError, match="clip must be a finite number > 0"):
        train(
            TransformerXL(TXLConfig.tiny(10)),
            stream_documents(torch.zeros(2, 40, dtype=torch.long)),
            1,
            8,
            clip=float(clip),
        )
    assert not (tmp_path / "run").exists()


def test_an_exploding_run_stops_and_keeps_its_last_good_checkpoint(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(
        FloatingPointError,
        match=r"loss is (nan|inf) at step \d+: stopped .* keeps the checkpoint of step \d+",
    ):
        train_command(command(out, "--lr", "1e6", "--warmup", "0", "--save-every", "1", steps=30))
    state = torch.load(out / "state.pt", weights_only=True)
    assert all(torch.isfinite(w).all() for w in state["model"].values())
    assert all(torch.isfinite(torch.tensor(state["log"]["loss"])))
    assert same(model_weights(out), state["model"])


def test_a_gradient_that_is_not_finite_is_refused_before_the_step():
    class InfiniteGradient(torch.nn.Module):
        "A finite loss whose gradient is not finite."

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))
            self.w.register_hook(lambda g: g * float("inf"))

        def forward(self, x, mems=None, targets=None):
            logits = self.w * torch.randn(*x.shape, 5, generator=torch.Generator().manual_seed(0))
            return LMOutput(logits, None if targets is None else token_loss(logits, targets), None)

    model = InfiniteGradient()
    with pytest.raises(FloatingPointError, match="gradient norm is .* at step 1"):
        train(model, stream_documents(torch.zeros(2, 20, dtype=torch.long)), 2, 8)
    assert model.w.item() == 1.0


def test_train_leaves_the_mode_as_it_found_it():
    model = TransformerXL(TXLConfig.tiny(10)).eval()
    train(model, stream_documents(torch.zeros(2, 40, dtype=torch.long)), 1, 8)
    assert not model.training


def test_the_model_call_takes_int32_ids_and_targets():
    torch.manual_seed(0)
    model = TransformerXL(TXLConfig.tiny(12)).eval()
    ids = torch.randint(12, (2, 9))
    a, b = (
        model(ids[:, :-1], targets=ids[:, 1:]),
        model(ids[:, :-1].int(), targets=ids[:, 1:].int()),
    )
    assert torch.equal(a.losses, b.losses) and torch.equal(a.logits, b.logits)


@pytest.mark.parametrize(
    "content", [b"\x89PNG\r\n\x1a\n" + bytes(200), "caf\u00e9".encode("latin-1") * 50]
)
def test_a_binary_file_is_named_before_anything_is_written(tmp_path, content):
    data = tmp_path / "data.bin"
    data.write_bytes(content)
    with pytest.raises(ValueError, match=f"{data} is not UTF-8 text"):
        train_command(command(tmp_path / "run") + ["--data", str(data)])
    assert not (tmp_path / "run").exists()


def test_a_git_checkout_is_read_without_its_git_folder(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / ".git" / "objects").mkdir(parents=True)
    (checkout / ".git" / "objects" / "pack").write_bytes(bytes(range(256)) * 4)
    (checkout / "README.md").write_text("a small text to learn from. " * 100)
    corpus = load_splits(str(checkout))
    assert (
        "".join(corpus.vocab.decode(p) for p in (corpus.train, corpus.valid, corpus.test))
        == (checkout / "README.md").read_text()
    )


@pytest.mark.parametrize("size", [1, 500])
def test_a_text_too_short_says_how_much_is_needed_and_writes_nothing(tmp_path, size):
    data, default = (
        tmp_path / "short.txt",
        ["--steps", "1", "--quiet", "--eval-split", "test"],
    )  # preset tiny, batch 16
    data.write_text("ab" * (size // 2) + "a" * (size % 2))
    with pytest.raises(
        ValueError, match=f"--data {data}: too little text, {size} symbols"
    ) as error:
        train_command(default + ["--data", str(data), "--out", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()
    least = int(str(error.value).split("at least ")[1].split(" characters")[0].replace(",", ""))
    data.write_text("ab" * (least // 2) + "a" * (least % 2))  # exactly enough: it trains
    train_command(default + ["--data", str(data), "--out", str(tmp_path / "run")])
    data.write_text("ab" * ((least - 1) // 2) + "a" * ((least - 1) % 2))
    with pytest.raises(ValueError, match="too little text"):
        train_command(default + ["--data", str(data), "--out", str(tmp_path / "run2")])


def test_stop_after_0_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--stop-after", "0"])
    assert "--stop-after must be >= 1" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_missing_device_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="--device cuda: not on this machine \\(0 CUDA device"):
        train_command(command(tmp_path / "run", "--device", "cuda"))
    with pytest.raises(ValueError, match="not a device name"):
        train_command(command(tmp_path / "run", "--device", "gpu"))
    assert not (tmp_path / "run").exists()


def test_the_program_prints_one_line_and_exits_1(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv=command(tmp_path / "run", "--resume"))
    assert exit_.value.code.startswith("error: ") and "nothing to resume" in exit_.value.code


@pytest.mark.parametrize(
    "changed",
    ["hgfedcba " * 3000, "abcdefgh " * 2999 + "xyz"],
    ids=["same vocabulary, other text", "another vocabulary"],
)
def test_resume_refuses_data_that_changed_and_changes_no_file(tmp_path, changed):
    """Issue 31: `--resume` with a --data file whose content changed is refused before any file is
    written."""
    data = tmp_path / "text.txt"
    data.write_text("abcdefgh " * 3000)
    run = ["--data", str(data), *"--preset tiny --steps 4 --eval-tokens 100 --quiet".split()]
    train_command(run + ["--stop-after", "2", "--out", str(tmp_path / "run")])
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    data.write_text(changed)
    with pytest.raises(ValueError, match="now holds other text than .* was trained on"):
        train_command(run + ["--out", str(tmp_path / "run"), "--resume"])
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before
    data.write_text("abcdefgh " * 3000)  # the run's own data: it resumes
    train_command(run + ["--out", str(tmp_path / "run"), "--resume"])
    assert torch.load(tmp_path / "run" / "state.pt", weights_only=True)["step"] == 4


def test_a_link_planted_at_run_lock_is_refused_and_its_target_untouched(tmp_path):
    """Issue 31: the lock is never opened through a symbolic link (it would truncate the file it
    points to)."""
    out, victim = tmp_path / "run", tmp_path / "precious.txt"
    out.mkdir()
    victim.write_text("keep me")
    (out / "run.lock").symlink_to(victim)
    with pytest.raises(ValueError, match="run.lock is a symbolic link"):
        train_command(command(out, steps=2))
    assert victim.read_text() == "keep me" and (out / "run.lock").is_symlink()
    assert sorted(p.name for p in out.iterdir()) == ["run.lock"]


def test_save_pretrained_replaces_a_planted_link_and_never_writes_through_it(tmp_path):
    """Issue 31: a link at a final name is replaced by a regular file; the file it pointed to is
    untouched."""
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").symlink_to(victim)
    TransformerXL(TXLConfig.tiny(n_token=10)).save_pretrained(folder)
    assert victim.read_text() == "keep me" and not (folder / "config.json").is_symlink()
    assert from_pretrained(folder).config == TXLConfig.tiny(n_token=10)


@pytest.mark.parametrize(
    "edit, lacks",
    [
        (lambda s: s.pop("optimizer"), "lacks ['optimizer']"),
        (lambda s: s["args"].pop("batch_size"), "lacks args['batch_size']"),
        (lambda s: s["processes"].clear(), "lacks one saved memory per process (1)"),
    ],
)
def test_a_hand_edited_state_is_one_error_naming_the_file(tmp_path, edit, lacks):
    """Issue 31: a state.pt with a field removed gave a KeyError or an IndexError from deep inside
    the resume."""
    out = tmp_path / "run"
    train_command(command(out, steps=2))
    state = torch.load(out / "state.pt", weights_only=True)
    edit(state)
    torch.save(state, out / "state.pt")  # its checksum no longer fits: refused as corrupt
    with pytest.raises(ValueError, match="state.pt is corrupt: its sha256 differs"):
        train_command(command(out, steps=4) + ["--resume"])
    state["sha256"] = content_sha256({k: v for k, v in state.items() if k != "sha256"})
    torch.save(state, out / "state.pt")  # consistent, and still not a whole run state
    with pytest.raises(ValueError, match=re.escape(f"state.pt {lacks}")):
        train_command(command(out, steps=4) + ["--resume"])


def test_sigterm_stops_a_run_like_ctrl_c_and_leaves_no_lock(tmp_path):
    """Issue 31: `kill` (SIGTERM) left run.lock behind; the program now exits through its cleanup,
    status 143."""
    out = tmp_path / "run"
    program = [
        sys.executable,
        "-m",
        "txl_lib",
        "train",
        *SMALL,
        "--steps",
        "100000",
        "--out",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    running = subprocess.Popen(program, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while (
        not (out / "run.lock").exists() and time.monotonic() < deadline and running.poll() is None
    ):
        time.sleep(0.05)
    time.sleep(0.5)  # inside the training loop
    running.send_signal(signal.SIGTERM)
    assert running.wait(timeout=120) == 128 + signal.SIGTERM, running.stderr.read()
    assert not (out / "run.lock").exists() and not list(out.glob("*.tmp"))


def test_an_empty_out_a_meta_device_and_a_missing_checkpoint_are_one_line_each(tmp_path, capsys):
    """Issue 31: --out '' trained into the current folder, --device meta failed deep inside
    autocast, and generate"""
    "named neither the missing file nor what it expected."
    with pytest.raises(SystemExit):
        parse_args(["--out", ""])
    assert "--out must name a folder for the run" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--device meta: not on this machine"):
        train_command(command(tmp_path / "run", steps=1) + ["--device", "meta"])
    assert not (tmp_path / "run").exists()
    with pytest.raises(
        FileNotFoundError, match=r"nothing does not exist: pass a run folder, or a model file"
    ):
        generate_command(["--checkpoint", str(tmp_path / "nothing")])


def test_files_a_run_writes_have_the_mode_open_gives(tmp_path):
    """Issue 31: the kept files once had mkstemp's 0600; they get the mode open() gives under the
    umask."""
    out = tmp_path / "run"
    train_command(command(out, steps=2))
    umask = os.umask(0o022)
    os.umask(umask)
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
        p.name: 0o666 & ~umask for p in out.iterdir()
    }
