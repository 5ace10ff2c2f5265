"""Chapter 06d's reader of the reference run's results, and chapter 00's comparison rule, against
hand-made files and a hand computation."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from txl_lib.real_text import FIELDS, claims_table, read_results
from txl_lib.utils import compare


def record(model, seed, bpc):
    return dict(
        model=model,
        seed=seed,
        params=10,
        train_chars=100,
        tgt_len=4,
        mem_len=None,
        folder="f",
        valid_bpc=bpc,
        test_bpc=bpc,
        test_head_bpc=bpc,
        test_bpc_by_memory=None,
        sliding=None,
        train_cpu_seconds=1.0,
    )


def test_records_are_grouped_by_model_in_seed_order(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(
        json.dumps({"runs": [record("b", 1, 2.0), record("a", 0, 1.0), record("b", 0, 3.0)]})
    )
    grouped = read_results(path)
    assert list(grouped) == ["b", "a"] and [r["seed"] for r in grouped["b"]] == [0, 1]


@pytest.mark.parametrize(
    "content, message",
    [
        ([], "must hold"),
        ({"runs": []}, "must hold"),
        ({"runs": [{"model": "xl"}]}, "lacks"),
        ({"runs": [{k: 0 for k in FIELDS if k != "test_bpc"}]}, "test_bpc"),
    ],
)
def test_a_malformed_results_file_is_one_clear_error(tmp_path, content, message):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=message):
        read_results(path)


def test_compare_follows_the_rule_of_twice_the_spread():
    a, b = [1.0, 1.2, 1.1], [2.0, 2.1, 1.9]  # std 0.1 each
    gap, spread, verdict = compare(a, b)
    assert (
        math.isclose(gap, -0.9)
        and math.isclose(spread, math.hypot(0.1, 0.1))
        and verdict == "measurable"
    )
    gap, spread, verdict = compare([1.0, 1.2], [1.05, 1.3], paired=True)  # differences -0.05, -0.1
    assert math.isclose(gap, -0.075) and math.isclose(spread, math.sqrt(2) * 0.025 / 1)
    assert verdict == "measurable"
    assert compare([1.0, 1.4], [1.1, 1.2])[2] == "no measurable difference"


@pytest.mark.parametrize(
    "a, b, paired",
    [([1.0], [2.0, 2.1], False), ([1.0, 1.1], [2.0], False), ([1.0, 1.2, 1.1], [2.0, 2.1], True)],
)
def test_compare_refuses_one_seed_and_unequal_pairs(a, b, paired):
    "One seed has no spread (NaN), and zip would silently drop the unpaired seeds."
    with pytest.raises(
        ValueError, match=f"compare needs at least 2 seeds a side.*got {len(a)} and"
    ):
        compare(a, b, paired=paired)


def test_the_readme_quotes_the_claims_the_last_chapter_printed():
    """Every row of the README's table of claims measured on Shakespeare is a line chapter 12a
    printed in its stored run."""
    root = Path(__file__).parents[1]
    notebook = json.loads((root / "notebooks" / "12a_top_level.ipynb").read_text())
    printed = "".join(
        text
        for cell in notebook["cells"]
        if "claims_table(" in "".join(cell["source"])
        for out in cell.get("outputs", [])
        for text in out.get("text", [])
    )
    rows = [line for line in printed.splitlines() if line.startswith("| ") and "---" not in line][
        1:
    ]
    assert len(rows) >= 9, printed[-500:]
    assert [row for row in rows if row not in (root / "README.md").read_text().splitlines()] == []


def test_claims_table_verdicts_on_a_run_built_by_hand(tmp_path):
    """A run whose numbers are chosen: each verdict as worked out by hand, RECL from tables with
    known knees."""
    bpc = {
        "xl": [2.0, 2.01, 2.02],
        "vanilla": [2.5, 2.51, 2.52],
        "lstm": [2.0, 2.03, 2.01],
        "lstm-time": [1.8, 1.81, 1.8],
    }
    runs = []
    for model, values in bpc.items():
        for seed, value in enumerate(values):
            by_memory = (
                {
                    "0": value + 0.3,
                    "64": value,
                    "128": value - 0.001 * (seed + 2),  # -0.003 ± 0.001
                    "256": value + [0.001, -0.001, 0.0][seed],
                    "512": value + 0.01,
                }
                if model == "xl"
                else None
            )
            runs.append({**record(model, seed, value), "test_bpc_by_memory": by_memory})
    (tmp_path / "results.json").write_text(
        json.dumps({"runs": runs, "contexts": {"contexts": [8, 16, 24]}})
    )
    knee = {"xl": 2, "lstm": 1, "vanilla": 0}  # the last context row at which the loss still falls
    tables = {
        f"{m}-seed{s}": torch.tensor([[3.0 - min(k, knee[m])] * 5 for k in range(3)])
        for m in knee
        for s in range(3)
    }
    save_file(tables, tmp_path / "context_losses.safetensors")
    assert [row["verdict"] for row in claims_table(tmp_path)] == [
        "reproduces",  # xl below vanilla by 0.5, spread 0.014
        "does not reproduce: no measurable difference",  # xl - lstm -0.003 ± 0.016
        "does not reproduce: measurably the other way",  # the lstm trained longer is better
        "reproduces",  # memory 0 is worse by 0.3
        "reproduces",  # 128: -0.003 ± 0.001
        "does not reproduce: no measurable difference",  # 256: 0 ± 0.001
        "does not reproduce: measurably the other way",  # 512: +0.01 in every seed
        "longer, by less than 80 %",  # RECL 24 against 16: +50 %
        "longer, by less than 450 %",
    ]  # 24 against 8: +200 %


def test_compare_calls_no_difference_no_difference():
    "Equal numbers have no spread, and no difference: not 'measurable'."
    assert compare([1.0, 1.0], [1.0, 1.0]) == (0.0, 0.0, "no measurable difference")
