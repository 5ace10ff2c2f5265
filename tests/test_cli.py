"""The training and generation commands (chapters 11a, 11b): a few steps on a small text, exact
resume, two DDP processes on gloo (an uneven split) against one process on the same global
batch, the whole test split against one long forward pass, the reference page's commands as
written, and bad arguments."""

import json
import math
import os
import shlex
import subprocess
import sys

from pathlib import Path

import pytest
import torch

from txl_lib import from_pretrained
from txl_lib.cli import build_config, local_streams, parse_args, stream_shares, train_command
from txl_lib.corpora import load_splits
from txl_lib.data import batchify
from txl_lib.generate_cli import generate_command, parse_args as generate_args
from txl_lib.serialization import save_checkpoint
from small_corpus import SMALL_CORPUS

SMALL = (
    f"--data {SMALL_CORPUS} --batch-size 4 --set n_layer=1 --set d_model=32 --set "
    "d_inner=64 --set tgt_len=16 --set mem_len=16 --eval-tokens 500"
).split()


def weights(folder):
    """The weights of a run folder's model copy (config.json + model.safetensors), as
    from_pretrained reads them."""
    return from_pretrained(folder).state_dict()


def test_a_few_steps_then_resume_equals_one_uninterrupted_run(tmp_path, capsys):
    straight = train_command(
        SMALL + ["--steps", "8", "--eval-every", "4", "--out", str(tmp_path / "a")]
    )
    train_command(
        SMALL
        + ["--steps", "8", "--eval-every", "4", "--out", str(tmp_path / "b"), "--stop-after", "5"]
    )
    state = torch.load(tmp_path / "b" / "state.pt", weights_only=True)
    assert (
        state["step"] == 5 and state["position"] == 5 and state["processes"][0]["mems"] is not None
    )
    resumed = train_command(
        SMALL + ["--steps", "8", "--eval-every", "4", "--out", str(tmp_path / "b"), "--resume"]
    )
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["loss"] == straight["loss"] and resumed["final_bits"] == straight["final_bits"]
    assert [s for s, _ in straight["eval"]] == [4, 8]
    assert "final:" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "config.json",
        "log.json",
        "model.safetensors",
        "state.pt",
        "vocab.json",
    ]
    model = from_pretrained(tmp_path / "a")
    assert model.config == run_config(SMALL, tmp_path / "a")
    assert same(
        model.state_dict(), torch.load(tmp_path / "a" / "state.pt", weights_only=True)["model"]
    )
    assert sorted(json.loads((tmp_path / "a" / "log.json").read_text())) == [
        "eval",
        "final_bits",
        "final_split",
        "final_symbols",
        "loss",
    ]


def run_config(argv, folder):
    "The config the command line makes, with the vocabulary size of the run's vocab.json."
    return build_config(
        "tiny", parse_args(argv).set, len(json.loads((folder / "vocab.json").read_text()))
    )


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_generate_command_continues_a_prompt(tmp_path):
    train_command(SMALL + ["--steps", "2", "--out", str(tmp_path / "run")])
    text = generate_command(
        ["--checkpoint", str(tmp_path / "run"), "--prompt", "def ", "--tokens", "9"]
    )
    assert text.startswith("def ") and len(text) == 13
    (tmp_path / "other.json").write_text(json.dumps(["a", "b"]))
    with pytest.raises(
        ValueError, match="other.json differs from the vocab.json model.safetensors"
    ):
        generate_command(
            ["--checkpoint", str(tmp_path / "run"), "--vocab", str(tmp_path / "other.json")]
        )


def test_generate_reads_the_model_pt_of_an_earlier_version_s_run(tmp_path):
    run, older = tmp_path / "run", tmp_path / "older"
    train_command(SMALL + ["--steps", "2", "--out", str(run)])
    older.mkdir()  # what the command wrote before config.json + model.safetensors
    save_checkpoint(older / "model.pt", from_pretrained(run), step=2)
    (older / "vocab.json").write_text((run / "vocab.json").read_text())
    argv = ["--prompt", "def ", "--tokens", "12"]
    expected = generate_command(["--checkpoint", str(run), *argv])
    assert generate_command(["--checkpoint", str(older / "model.pt"), *argv]) == expected
    assert generate_command(["--checkpoint", str(older), *argv]) == expected


TWO_PROCESSES = [
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc_per_node",
    "2",
]


COUNT_THREADS = """
import os, sys, threading
from pathlib import Path
from txl_lib.cli import train_command
def native():  # the process's threads that Python did not start
    return len(os.listdir("/proc/self/task")) - threading.active_count()
before = native()
train_command(sys.argv[1:])
Path(__file__).with_name(f"threads_{os.environ['RANK']}").write_text(f"{before} {native()}")
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_two_gloo_processes_equal_one_process_and_leave_no_thread_behind(tmp_path):
    """Two processes (3 + 2 streams: uneven) train the weights one process trains on the same global
    batch; and no thread of the process group outlives the run (a gloo thread still alive when
    Python shuts down can abort the process: see setup_distributed)."""
    args = SMALL + "--steps 6 --save-every 3 --batch-size 5".split()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    script = tmp_path / "count_threads.py"  # train_command, counting threads before and after
    script.write_text(COUNT_THREADS)
    one = subprocess.run(
        [sys.executable, "-m", "txl_lib", "train", *args, "--out", str(tmp_path / "one")],
        env=env,
        capture_output=True,
        text=True,
    )
    two = subprocess.run(
        [*TWO_PROCESSES, str(script), *args, "--out", str(tmp_path / "two")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-2000:] + two.stderr[-2000:]
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    state = torch.load(tmp_path / "two" / "state.pt", weights_only=True)
    assert state["world"] == 2 and [p["mems"][0].size(0) for p in state["processes"]] == [3, 2]
    assert two.stdout.count("final:") == 1  # rank 0 alone evaluates and reports
    counts = [(tmp_path / f"threads_{rank}").read_text().split() for rank in (0, 1)]
    assert all(before == after for before, after in counts), counts  # (before, after) per rank
    with pytest.raises(
        ValueError, match=r"processes 1 \(the run has 2\)"
    ):  # resuming with another world size
        train_command(args + ["--out", str(tmp_path / "two"), "--resume", "--steps", "9"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["n_layer"], "KEY=VALUE"),
        (["n_token=5"], "a config field but n_token"),
        (["bogus=1"], "KEY=VALUE"),
        (["n_layer=four"], "not a Python literal"),
        (["dropout=2.0"], "dropout"),
    ],
)
def test_bad_overrides(overrides, message):
    with pytest.raises(ValueError, match=message):
        build_config("tiny", overrides, 50)


@pytest.mark.parametrize(
    "argv",
    [
        ["--steps", "0"],
        ["--batch-size", "-1"],
        ["--stop-after", "-2"],
        ["--preset", "huge"],
        ["--eval-split", "train"],
    ],
)
def test_bad_arguments_exit_with_a_message(argv, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_the_processes_share_the_batch_s_streams_exactly():
    ids = torch.arange(1000)
    for batch, world in [(22, 4), (8, 2), (7, 3), (5, 5)]:
        shares = stream_shares(batch, world)
        assert sum(shares) == batch and max(shares) - min(shares) <= 1
        together = torch.cat([local_streams(ids, batch, rank, world) for rank in range(world)])
        assert torch.equal(together, batchify(ids, batch))
    with pytest.raises(ValueError, match="without a stream"):
        local_streams(ids, 3, 0, 4)


def test_the_whole_test_split_equals_one_long_forward_pass(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("".join(f"line {i}: the quick brown fox {i * 7 % 13}\n" for i in range(120)))
    settings = (
        "--batch-size 4 --set n_layer=1 --set d_model=32 --set d_inner=64 --set tgt_len=8 "
        "--set mem_len=8 --steps 3 --eval-split test --eval-tgt-len 5 --eval-mem-len 64"
    ).split()
    log = train_command(["--data", str(text), *settings, "--out", str(tmp_path / "run")])
    model = from_pretrained(tmp_path / "run")
    streams = batchify(load_splits(str(text)).test, 4)  # 4 streams, each shorter than 64 + 5
    with torch.no_grad():  # memory covers everything: no segments
        loss = model.eval()(streams[:, :-1], targets=streams[:, 1:]).losses
    assert (
        log["final_split"] == "test" and log["final_symbols"] == loss.numel() == streams.numel() - 4
    )
    assert log["final_bits"] == pytest.approx(loss.mean().item() / math.log(2), abs=1e-5)


def readme_commands(section: str = "## Training from the command line") -> list[list[str]]:
    """The commands of the reference page's first bash block after `section` (docs/reference.md,
    which the README links), continuation lines joined, comments dropped."""
    readme = (Path(__file__).parents[1] / "docs" / "reference.md").read_text()
    block = readme.split(section, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [
        shlex.split(line, comments=True)
        for line in block.replace("\\\n", " ").splitlines()
        if line.strip()
    ]


def test_every_command_of_the_reference_page_parses_and_its_batch_splits():
    commands = readme_commands()
    assert len(commands) >= 5
    for argv in commands:
        if argv[:4] == ["python", "-m", "txl_lib", "generate"]:
            generate_args(argv[4:])
            continue
        module = argv.index("-m") + 1
        assert argv[module : module + 2] == ["txl_lib", "train"], argv
        args = parse_args(argv[module + 2 :])
        world = int(argv[argv.index("--nproc_per_node") + 1]) if argv[0] == "torchrun" else 1
        assert sum(stream_shares(args.batch_size, world)) == args.batch_size
        build_config(args.preset, args.set, 205)


@pytest.mark.parametrize(
    "argv, message", [(["--lr", "nan"], "lr must be a finite"), (["--clip", "0"], "clip must be")]
)
def test_bad_rates_are_refused_before_anything_is_written(tmp_path, argv, message):
    with pytest.raises(ValueError, match=message):
        train_command(SMALL + argv + ["--out", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


def test_bfloat16_autocast_trains(tmp_path):
    log = train_command(SMALL + ["--steps", "3", "--bf16", "--out", str(tmp_path / "bf16")])
    assert (
        len(log["loss"]) == 3
        and all(0 < loss < 10 for loss in log["loss"])
        and log["final_bits"] < 10
    )


KINDS = {
    "attn_type=1": ["--set", "attn_type=1"],
    "attn_type=2": ["--set", "attn_type=2"],
    "attn_type=3": ["--set", "attn_type=3", "--set", "d_head=8"],  # 4 heads of 8 = d_model 32
    "knn_layer=1": (
        "--set n_layer=2 --set knn_layer=1 --set knn_capacity=24 --set knn_top_k=4"
    ).split(),
    "cutoffs=(20,)": ["--set", "cutoffs=(20,)", "--set", "div_val=2"],
}
MODEL_OF_KIND = {
    "attn": "PositionVariantLM",
    "knn_": "KNNTransformerXL",
    "cuto": "AdaptiveTransformerXL",
}


def test_set_picks_the_config_of_the_chapter_its_fields_come_from():
    from txl_lib.cli import build_config

    chosen = [
        type(build_config("tiny", fields, 50)).__name__
        for fields in (
            [],
            ["attn_type=0"],
            ["attn_type=2"],
            ["cutoffs=(20,)", "div_val=2"],
            ["knn_layer=1"],
        )
    ]
    assert chosen == ["TXLConfig", "TXLConfig", "VariantConfig", "AdaptiveConfig", "KNNConfig"]
    with pytest.raises(
        ValueError, match=r"mixes the fields of \['VariantConfig', 'AdaptiveConfig'\]"
    ):
        build_config("tiny", ["attn_type=1", "cutoffs=(20,)"], 50)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_of_model_trains_and_resumes_exactly(tmp_path, kind):
    """The original's attention types (08), the adaptive softmax (09) and the KNN memory (10), by
    chapter 10a's build_model."""
    argv = SMALL + KINDS[kind] + ["--steps", "6", "--quiet"]
    straight = train_command(argv + ["--out", str(tmp_path / "a")])
    train_command(argv + ["--out", str(tmp_path / "b"), "--stop-after", "3"])
    saved = torch.load(tmp_path / "b" / "state.pt", weights_only=True)["processes"][0]
    if kind.startswith("knn"):  # the store is full at step 3: resuming without it would differ
        assert saved["store"]["length"].tolist() == [24] * 4
    resumed = train_command(argv + ["--out", str(tmp_path / "b"), "--resume"])
    model = from_pretrained(tmp_path / "b")
    assert model.config == run_config(argv, tmp_path / "b")
    assert type(model).__name__ == MODEL_OF_KIND[kind[:4]]
    assert resumed["loss"] == straight["loss"] and resumed["final_bits"] == straight["final_bits"]
    assert same(weights(tmp_path / "a"), weights(tmp_path / "b"))


def test_a_wrong_typed_set_value_is_one_line_and_exit_status_1():
    "Issue 31: `--set same_length=1` raised a TypeError that printed a traceback."
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "txl_lib",
            "train",
            "--data",
            SMALL_CORPUS,
            "--set",
            "same_length=1",
            "--steps",
            "1",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == "error: --set: same_length must be a bool, got int"


def test_each_installed_console_script_runs_a_small_job_and_exits_0(tmp_path):
    "txl-train, txl-generate and txl-bench, as pip installed them: exit status 0, output once."
    scripts = Path(sys.executable).parent
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = tmp_path / "run"
    small = f"--data {SMALL_CORPUS} --steps 2 --batch-size 4 --eval-tokens 200 --set n_layer=1"
    small = [*small.split(), "--quiet"]
    jobs = {
        "txl-train": [*small, "--out", str(run)],
        "txl-generate": ["--checkpoint", str(run), "--prompt", "The ", "--tokens", "5"],
        "txl-bench": ["--quick", "--lengths", "48", "--repeats", "1"],
    }
    done = {}
    for script, argv in jobs.items():  # in order: generate reads the run train writes
        done[script] = subprocess.run(
            [scripts / script, *argv], capture_output=True, text=True, env=env, timeout=300
        )
        assert done[script].returncode == 0, (script, done[script].stderr[-2000:])
    assert "final:" in done["txl-train"].stdout and (run / "model.safetensors").is_file()
    assert (
        done["txl-generate"].stdout.count("The ") == 1
    )  # the text once, not echoed by the wrapper
    assert "ms per token:" in done["txl-bench"].stdout


def test_the_package_imports_where_fcntl_does_not_exist():
    "Windows has no fcntl: no module may need it to import (the run lock imports it on use)."
    code = (
        "import sys; sys.modules['fcntl'] = None; "  # as on Windows: `import fcntl` fails
        "import txl_lib, txl_lib.cli, txl_lib.__main__; print('imported')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "imported", done.stderr[-2000:]
