"""The training and generation commands (chapters 11a, 11b): a few steps on pydoc, exact resume, two DDP processes
on gloo against one process on the same global batch, and bad arguments."""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from txl_lib.cli import build_config, parse_args, train_command
from txl_lib.generate import generate_command
from txl_lib.model import load_checkpoint

SMALL = ["--data", "pydoc", "--batch-size", "4", "--set", "n_layer=1", "--set", "d_model=32", "--set", "d_inner=64",
         "--set", "tgt_len=16", "--set", "mem_len=16", "--eval-tokens", "500"]


def weights(folder):
    return torch.load(folder / "model.pt", weights_only=True)["model"]


def test_a_few_steps_then_resume_equals_one_uninterrupted_run(tmp_path, capsys):
    straight = train_command(SMALL + ["--steps", "8", "--eval-every", "4", "--out", str(tmp_path / "a")])
    train_command(SMALL + ["--steps", "8", "--eval-every", "4", "--out", str(tmp_path / "b"), "--stop-after", "5"])
    state = torch.load(tmp_path / "b" / "state.pt", weights_only=True)
    assert state["step"] == 5 and state["position"] == 5 and state["processes"][0]["mems"] is not None
    resumed = train_command(SMALL + ["--steps", "8", "--eval-every", "4", "--out", str(tmp_path / "b"), "--resume"])
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["loss"] == straight["loss"] and resumed["final_bits"] == straight["final_bits"]
    assert [s for s, _ in straight["eval"]] == [4, 8]
    assert "final:" in capsys.readouterr().out
    model, step = load_checkpoint(tmp_path / "a" / "model.pt")
    assert step == 8 and model.config.n_layer == 1
    assert sorted(json.loads((tmp_path / "a" / "log.json").read_text())) == ["eval", "final_bits", "loss"]


def test_generate_command_continues_a_prompt(tmp_path):
    train_command(SMALL + ["--steps", "2", "--out", str(tmp_path / "run")])
    text = generate_command(["--checkpoint", str(tmp_path / "run" / "model.pt"), "--prompt", "def ", "--tokens", "9"])
    assert text.startswith("def ") and len(text) == 13
    (tmp_path / "other.json").write_text(json.dumps(["a", "b"]))
    with pytest.raises(ValueError, match="not the same run"):
        generate_command(["--checkpoint", str(tmp_path / "run" / "model.pt"), "--vocab", str(tmp_path / "other.json")])


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_two_gloo_processes_equal_one_process_on_the_same_global_batch(tmp_path):
    args = SMALL + ["--steps", "6", "--save-every", "3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, "-m", "txl_lib.train", *args, "--out", str(tmp_path / "one")], env=env,
                         capture_output=True, text=True)
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          free_port(), "-m", "txl_lib.train", *args, "--out", str(tmp_path / "two")], env=env,
                         capture_output=True, text=True)
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-2000:] + two.stderr[-2000:]
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    state = torch.load(tmp_path / "two" / "state.pt", weights_only=True)
    assert state["world"] == 2 and [p["mems"][0].size(0) for p in state["processes"]] == [2, 2]   # 2 streams each
    assert two.stdout.count("final:") == 1                              # rank 0 alone evaluates and reports
    with pytest.raises(ValueError, match="same number"):                # resuming with another world size
        train_command(args + ["--out", str(tmp_path / "two"), "--resume", "--steps", "9"])


@pytest.mark.parametrize("overrides, message", [
    (["n_layer"], "KEY=VALUE"), (["n_token=5"], "other than n_token"), (["bogus=1"], "KEY=VALUE"),
    (["n_layer=four"], "not a Python literal"), (["dropout=2.0"], "dropout"),
])
def test_bad_overrides(overrides, message):
    with pytest.raises(ValueError, match=message):
        build_config("tiny", overrides, 50)


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--batch-size", "-1"], ["--stop-after", "-2"],
                                  ["--preset", "huge"]])
def test_bad_arguments_exit_with_a_message(argv, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_an_uneven_batch_split_is_refused(tmp_path):
    from txl_lib.cli import local_streams
    with pytest.raises(ValueError, match="divisible"):
        local_streams(torch.arange(100), 5, 0, 2)


def test_bfloat16_autocast_trains(tmp_path):
    log = train_command(SMALL + ["--steps", "3", "--bf16", "--out", str(tmp_path / "bf16")])
    assert len(log["loss"]) == 3 and all(0 < loss < 10 for loss in log["loss"]) and log["final_bits"] < 10
