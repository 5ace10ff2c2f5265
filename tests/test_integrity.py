"""Issue 43: every byte a load trusts is checksummed, no state is shared, every error names its
flag or field. One test per finding of the hostile run on ecaf7e6, each failing on that code."""

import dataclasses
import json
import os
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from txl_lib import TXLConfig, TransformerXL, from_pretrained
from txl_lib.cli import train_command
from txl_lib.data import IGNORE
from txl_lib.generate_cli import generate_command, load_run
from txl_lib.serialization import save_checkpoint
from loading import load_checkpoint
from txl_lib.training import evaluate
from small_corpus import SMALL_CORPUS

SMALL = (
    f"--data {SMALL_CORPUS} --batch-size 4 --set n_layer=1 --set d_model=32 --set "
    "d_inner=64 --set tgt_len=16 --set mem_len=16 --eval-tokens 200 --quiet"
).split()
TINY = dict(n_token=20, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=8)


def run(out, *extra, steps=2):
    return train_command(SMALL + ["--steps", str(steps), "--out", str(out), *extra])


def folder_bytes(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def flip_a_bit_of(path: Path, tensor: torch.Tensor):
    "One bit of one float of `tensor`, found by its bytes inside the file at `path`."
    data, raw = bytearray(path.read_bytes()), tensor.detach().contiguous().numpy().tobytes()
    at = bytes(data).find(raw)
    assert at > 0
    data[at + 5] ^= 0x01
    path.write_bytes(bytes(data))


def test_1_a_flipped_bit_in_state_pt_is_refused_and_nothing_is_written(tmp_path):
    out = tmp_path / "run"
    run(out, "--stop-after", "1", steps=3)
    state = torch.load(out / "state.pt", weights_only=True)
    flip_a_bit_of(out / "state.pt", state["model"]["u"])
    assert not torch.equal(
        torch.load(out / "state.pt", weights_only=True)["model"]["u"], state["model"]["u"]
    )
    before = folder_bytes(out)
    with pytest.raises(ValueError, match="state.pt is corrupt: its sha256 differs"):
        run(out, "--resume", steps=3)
    assert folder_bytes(out) == before


def test_2_the_config_stored_in_model_safetensors_is_checksummed(tmp_path):
    TransformerXL(TXLConfig(**TINY, mem_len=32)).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    stored = b'\\"mem_len\\": 32'  # inside the JSON header, as an escaped JSON string
    assert data.count(stored) == 1  # the edit keeps the length: the header stays valid
    weights.write_bytes(data.replace(stored, stored.replace(b"32", b"33")))
    with pytest.raises(ValueError, match="model.safetensors is corrupt: its stored config differs"):
        from_pretrained(weights)  # the file alone
    weights.write_bytes(data)
    (tmp_path / "config.json").unlink()  # the folder's copy: named as missing, never skipped
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        from_pretrained(tmp_path)


def test_3_two_threads_evaluating_one_model_get_the_numbers_one_thread_gets():
    torch.manual_seed(0)
    model = TransformerXL(TXLConfig(**TINY, mem_len=8)).eval()
    with torch.no_grad():
        for p in model.parameters():  # larger weights: the memory length matters
            p.add_(0.3 * torch.randn_like(p))
    seq = torch.randint(20, (2, 97))
    alone = {M: evaluate(model, seq[:, :-1], seq[:, 1:], 8, M).bits_per_token for M in (0, 64)}
    assert alone[0] != alone[64]
    found, errors = {0: [], 64: []}, []

    def evaluate_often(M):
        try:
            for _ in range(15):
                found[M].append(evaluate(model, seq[:, :-1], seq[:, 1:], 8, M).bits_per_token)
        except Exception as e:  # noqa: BLE001 -- a crash in a thread must fail the test
            errors.append(e)

    threads = [threading.Thread(target=evaluate_often, args=(M,)) for M in (0, 64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and found == {0: [alone[0]] * 15, 64: [alone[64]] * 15}
    assert model.config.mem_len == 8


@pytest.mark.parametrize("edit", ["foreign", "one symbol"])
def test_4_a_vocabulary_not_saved_with_the_model_is_refused(tmp_path, edit):
    out = tmp_path / "run"
    run(out)
    vocab = json.loads((out / "vocab.json").read_text())
    other = sorted(chr(0x4E00 + i) for i in range(len(vocab)))  # another of the same size
    changed = other if edit == "foreign" else vocab[:-1] + [chr(ord(vocab[-1]) + 1)]  # order kept
    (out / "vocab.json").write_text(json.dumps(changed))
    with pytest.raises(
        ValueError, match="vocab.json differs from the vocab.json model.safetensors"
    ):
        load_run(str(out))


@pytest.mark.parametrize("tokens", ["1", "3"])
def test_5_too_few_eval_tokens_are_refused_before_training(tmp_path, tokens, capsys):
    with pytest.raises(SystemExit) as exit:
        train_command(
            SMALL + ["--steps", "2", "--eval-tokens", tokens, "--out", str(tmp_path / "r")]
        )
    assert exit.value.code == 2 and "--eval-tokens must be >= 4" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_6_sizes_beyond_this_machine_are_refused_naming_the_field_before_allocating(tmp_path):
    with pytest.raises(ValueError, match="n_token=2000000000, .* more than this machine's memory"):
        TransformerXL(TXLConfig(n_token=2 * 10**9, d_model=1024))
    with pytest.raises(ValueError, match="d_model=1000000000.* more than this machine's memory"):
        run(tmp_path / "big", "--set", "d_model=1000000000")
    TransformerXL(TXLConfig(**TINY)).save_pretrained(tmp_path / "m")
    with open(tmp_path / "m" / "model.safetensors", "r+b") as f:  # sparse: no disk used
        f.truncate(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") + 2**30)
    with pytest.raises(ValueError, match="GiB, more than this machine's memory"):
        from_pretrained(tmp_path / "m")


def test_7_messages_name_what_happened(tmp_path, capsys):
    TransformerXL(TXLConfig(**TINY)).save_pretrained(tmp_path / "m")
    assert isinstance(from_pretrained(tmp_path / "m" / "model.safetensors"), TransformerXL)
    (tmp_path / "m" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors is missing"):
        from_pretrained(tmp_path / "m")
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"model": Payload()}, tmp_path / "evil.pt")  # torch's format, a GLOBAL inside
    save_checkpoint(tmp_path / "good.pt", TransformerXL(TXLConfig(**TINY)))
    (tmp_path / "cut.pt").write_bytes((tmp_path / "good.pt").read_bytes()[:200])
    for name, fragment in [
        ("evil.pt", r"holds pickled code \(posix.system\)"),
        ("cut.pt", "corrupt"),
    ]:
        with pytest.raises(ValueError, match=fragment) as caught:
            load_checkpoint(tmp_path / name)
        assert "weights_only=False" not in str(caught.value)
    assert not marker.exists()
    (tmp_path / "a-file").write_text("")
    for argv, fragment in [
        (SMALL + ["--seed", str(2**40)], "--seed must be in [0, 4294967295]"),
        (SMALL + ["--out", str(tmp_path / "a-file")], "a-file is a file, expected a folder"),
        (
            SMALL + ["--out", str(tmp_path / "a-file" / "run")],
            "a-file is a file, expected a folder",
        ),
    ]:
        with pytest.raises(SystemExit):
            train_command(argv)
        assert fragment in capsys.readouterr().err
    for argv, fragment in [
        (["--prompt", ""], "--prompt must hold at least one character"),
        (["--seed", str(2**40)], "--seed must be in [0, 4294967295]"),
    ]:
        with pytest.raises(SystemExit):
            generate_command(["--checkpoint", str(tmp_path / "m"), *argv])
        assert fragment in capsys.readouterr().err


def test_8_readers_of_a_folder_being_saved_see_one_save_at_a_time(tmp_path):
    """A writer saves two different models (configs and vocabularies) in turn while readers load:
    every read is one whole save, never a mix, never an error."""
    saves = [
        (
            TransformerXL(TXLConfig(**TINY, mem_len=mem_len)),
            [chr(97 + i + shift) for i in range(20)],
        )
        for mem_len, shift in ((8, 0), (9, 1))
    ]
    saves[0][0].save_pretrained(tmp_path, vocab=saves[0][1])
    stop, problems, reads = threading.Event(), [], []

    def write():
        i = 0
        while not stop.is_set():
            i += 1
            saves[i % 2][0].save_pretrained(tmp_path, vocab=saves[i % 2][1])

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(150):
            try:
                vocab, model = load_run(str(tmp_path))
            except Exception as e:  # noqa: BLE001 -- any error is a finding
                problems.append(repr(e))
                continue
            which = model.config.mem_len - 8
            reads.append(which)
            if vocab.itos != saves[which][1] or not torch.equal(model.u, saves[which][0].u):
                problems.append(f"a mixed read: the model of save {which}, another vocabulary")
    finally:
        stop.set()
        writer.join()
    assert not problems, problems[:3]
    assert len(reads) == 150


def test_9_a_config_cannot_change_under_the_models_built_from_it():
    config = TXLConfig(**TINY)
    a, b = TransformerXL(config), TransformerXL(config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.config.mem_len = -1
    assert b.config == config and dataclasses.replace(config, mem_len=9).mem_len == 9


def test_10_a_loss_over_no_scored_target_is_nan_as_pytorchs_never_0():
    model = TransformerXL(TXLConfig(**TINY))
    x = torch.randint(20, (2, 5))
    out = model(x, targets=torch.full_like(x, IGNORE))
    pytorchs = F.cross_entropy(out.logits.flatten(0, 1), torch.full((10,), IGNORE))
    assert out.loss.isnan() and pytorchs.isnan()


def test_11_a_hand_edited_state_is_refused(tmp_path):
    out = tmp_path / "run"
    run(out, "--stop-after", "1", steps=3)
    for field, value in [("step", -3), ("position", 10**9)]:
        state = torch.load(out / "state.pt", weights_only=True)
        state[field] = value
        torch.save(state, out / "edited.pt")
        os.replace(out / "edited.pt", out / "state.pt")
        with pytest.raises(ValueError, match="state.pt is corrupt: its sha256 differs"):
            run(out, "--resume", steps=3)


def test_12_an_init_std_that_makes_the_logits_infinite_is_refused():
    with pytest.raises(ValueError, match=r"init_std must be a number in \(0, 1\], got 1e\+300"):
        TXLConfig(**TINY, init_std=1e300)


def strip_manifest(weights: Path):
    "The file as the previous version wrote it: no file list in the metadata."
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(weights, "pt") as f:
        metadata = f.metadata()
    tensors = load_file(weights)
    save_file(tensors, weights, metadata={k: v for k, v in metadata.items() if k != "files"})


def test_a_model_of_the_previous_version_still_loads_its_config_unverified_with_a_warning(tmp_path):
    saved = TransformerXL(TXLConfig(**TINY)).eval()
    saved.save_pretrained(tmp_path)
    strip_manifest(tmp_path / "model.safetensors")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config, indent=4))  # reformatted: the same
    x = torch.randint(20, (1, 7))
    assert torch.equal(from_pretrained(tmp_path)(x).logits, saved(x).logits)
    (tmp_path / "config.json").write_text(json.dumps({**config, "mem_len": 9}))
    with pytest.raises(ValueError, match="config.json differs from the config stored in"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").unlink()  # as the previous version's cut save could leave it
    for path in (tmp_path, tmp_path / "model.safetensors"):
        with pytest.warns(UserWarning, match="config is loaded unverified"):
            assert torch.equal(from_pretrained(path)(x).logits, saved(x).logits)


def test_damaged_metadata_is_one_error_naming_the_file(tmp_path):
    from safetensors.torch import load_file, save_file

    TransformerXL(TXLConfig(**TINY)).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    for metadata in ({"config": "5", "files": "{}"}, {"config": "{}", "files": "[1]"}, {"x": "y"}):
        save_file(tensors, tmp_path / "model.safetensors", metadata=metadata)
        with pytest.raises(ValueError, match="model.safetensors holds no config and file list"):
            from_pretrained(tmp_path)


def test_with_config_of_a_compiled_model_edits_nothing():
    from txl_lib.training import with_config

    model = TransformerXL(TXLConfig(**TINY, mem_len=8))
    view = with_config(torch.compile(model), mem_len=32)  # compiles nothing until called
    assert view.config.mem_len == 32 and model.config.mem_len == 8 and view.u is model.u


def test_a_run_state_of_the_previous_version_resumes_with_a_warning(tmp_path):
    out = tmp_path / "run"
    run(out, "--stop-after", "1", steps=2)
    state = torch.load(out / "state.pt", weights_only=True)
    del state["sha256"]
    state["format"] = 2  # as the previous version wrote it
    torch.save(state, out / "state.pt")
    with pytest.warns(UserWarning, match="of an earlier version: loaded \\(partly\\) unverified"):
        run(out, "--resume", steps=2)
    assert torch.load(out / "state.pt", weights_only=True)["format"] == 3


# Issue 44: the review of the move to one serialization module and checks at the doors


def test_a_checkpoint_whose_checksum_was_removed_or_covers_changed_weights_is_refused(tmp_path):
    from txl_lib.serialization import content_sha256

    path = save_checkpoint(tmp_path / "m.pt", TransformerXL(TXLConfig.tiny(n_token=10)), step=1)
    payload = torch.load(path, weights_only=True)
    stripped = {k: v for k, v in payload.items() if k != "sha256"}  # format 3 without its sha256
    torch.save(stripped, tmp_path / "stripped.pt")
    with pytest.raises(ValueError, match="stripped.pt is corrupt: its sha256 is missing"):
        load_checkpoint(tmp_path / "stripped.pt")
    first = {k: payload[k] for k in ("config", "model", "step")}  # the first format: weights only
    first["sha256"] = content_sha256(first["model"])
    first["model"] = {**first["model"], "u": first["model"]["u"] + 1.0}  # changed after saving
    torch.save(first, tmp_path / "first.pt")
    with pytest.raises(ValueError, match="first.pt is corrupt: its sha256 differs"):
        load_checkpoint(tmp_path / "first.pt")


def test_adaptive_targets_in_no_cluster_score_nan_not_a_silent_zero():
    from txl_lib.adaptive import ProjectedAdaptiveLogSoftmax

    softmax = ProjectedAdaptiveLogSoftmax(40, 8, 8, cutoffs=(10, 25), div_val=2)
    for p in softmax.parameters():  # alone, its projections are left uninitialised
        torch.nn.init.normal_(p, 0.0, 0.5)
    nll = softmax(torch.randn(4, 8), torch.tensor([3, IGNORE, 40, -5]))
    assert torch.isfinite(nll[0]) and nll[1] == 0 and torch.isnan(nll[2:]).all()


def test_a_vocabulary_given_as_a_generator_is_refused_not_saved_empty(tmp_path):
    model = TransformerXL(TXLConfig.tiny(n_token=3))
    with pytest.raises(ValueError, match="vocab must be None or 3 strings"):
        model.save_pretrained(tmp_path / "m", vocab=(s for s in "abc"))
    assert not (tmp_path / "m").exists()


def test_weights_that_are_not_tensors_are_one_error_naming_the_file(tmp_path):
    from txl_lib.convert import from_original
    from txl_lib.serialization import save_checksummed

    model = TransformerXL(TXLConfig.tiny(n_token=10))
    state = {**model.state_dict(), "u": 1.0}
    payload = {"config": dataclasses.asdict(model.config), "model": state, "step": 0}
    save_checksummed(tmp_path / "odd.pt", payload)  # consistent, and not a state dict
    with pytest.raises(ValueError, match="odd.pt holds no state dict"):
        load_checkpoint(tmp_path / "odd.pt")
    with pytest.raises(TypeError, match="config must be a TXLConfig"):
        from_original(model.state_dict(), dict(n_token=10))
