"""Chapter 08b's reader of the reference run's results, and chapter 00's comparison rule, against
hand-made files and a hand computation."""

import json
import math
import statistics
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from txl_lib.claims import claims_table
from txl_lib.real_text import FIELDS, read_results
from txl_lib.utils import compare
from txl_lib.infrastructure import write_manifest


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
    write_manifest(tmp_path)  # a stored result is read only under its listed sha256
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
    write_manifest(tmp_path)
    with pytest.raises(ValueError, match=message):
        read_results(path)


def test_a_results_file_unlike_its_manifest_is_refused(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"runs": [record("a", 0, 1.0)]}))
    write_manifest(tmp_path)
    path.write_text(json.dumps({"runs": [record("a", 0, 1.5)]}))  # another number, same shape
    with pytest.raises(ValueError, match="results.json differs from the sha256"):
        read_results(path)


# Student's t, 97.5 % quantile, by closed forms: 2 degrees of freedom (2p - 1) / sqrt(2p(1 - p));
# 4 degrees 2 sqrt(cos(arccos(sqrt(a)) / 3) / sqrt(a) - 1) with a = 4p(1 - p)
P = 0.975
T_2 = (2 * P - 1) / math.sqrt(2 * P * (1 - P))
ALPHA = 4 * P * (1 - P)
T_4 = 2 * math.sqrt(math.cos(math.acos(math.sqrt(ALPHA)) / 3) / math.sqrt(ALPHA) - 1)


def welch_df(a, b):
    "Welch-Satterthwaite, transcribed: (va + vb)^2 / (va^2 / (na - 1) + vb^2 / (nb - 1))."
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    return (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))


def test_compare_paired_is_the_t_interval_of_the_per_seed_differences():
    assert math.isclose(T_2, 4.302652729749464, rel_tol=1e-12)  # the tables' values
    assert math.isclose(T_4, 2.7764451051977987, rel_tol=1e-12)
    base = [1.0, 2.0, 3.0]  # a large spread between seeds, which pairing removes
    a, b = [x - d for x, d in zip(base, [0.2, 0.25, 0.3])], base
    d = [x - y for x, y in zip(a, b)]
    half = T_2 * statistics.stdev(d) / math.sqrt(3)
    c = compare(a, b, minimum=0.1, paired=True)
    assert math.isclose(c.difference, statistics.mean(d), rel_tol=1e-9)
    assert math.isclose(c.high - c.difference, half, rel_tol=1e-6)
    assert math.isclose(c.difference - c.low, half, rel_tol=1e-6)
    assert c.minimum == 0.1 and c.verdict == "better"  # [-0.37, -0.13], lower is better
    assert compare(a, b, minimum=0.1, paired=True, lower_is_better=False).verdict == "worse"
    assert compare(b, a, minimum=0.1, paired=True).verdict == "worse"
    assert compare(a, b, minimum=0.1).verdict == "inconclusive"  # unpaired: the seeds' spread
    assert c.shown() == "-0.250 [-0.374, -0.126]: better"


def test_compare_unpaired_is_welchs_interval():
    a = [-1.0, 0.0, 1.0]  # variance 1
    x = math.sqrt(5 / 3)
    b = [5 - x, 5.0, 5.0, 5.0, 5 + x]  # variance 5/6: va/na = 2 vb/nb, Welch's df is 4 (pooled 6)
    assert math.isclose(welch_df(a, b), 4.0, rel_tol=1e-12)
    se = math.sqrt(statistics.variance(a) / 3 + statistics.variance(b) / 5)
    c = compare(a, b, minimum=1.0)
    assert math.isclose(c.difference, -5.0, rel_tol=1e-9)
    assert math.isclose(c.high - c.difference, T_4 * se, rel_tol=1e-6)
    assert math.isclose(c.difference - c.low, T_4 * se, rel_tol=1e-6)
    assert c.verdict == "better"
    # a constant b (one published number): Welch's df is len(a) - 1 = 2, the one-sample interval
    c = compare([0.95, 0.99, 1.0], [0.97] * 3, minimum=0.01, lower_is_better=False)
    s = statistics.stdev([0.95, 0.99, 1.0])
    assert math.isclose(c.high - c.difference, T_2 * s / math.sqrt(3), rel_tol=1e-6)
    assert c.verdict == "inconclusive"


@pytest.mark.parametrize(
    "d, minimum, verdict",
    [
        ([-0.2, -0.25, -0.3], 0.1, "better"),  # [-0.37, -0.13]: excludes 0, beyond the minimum
        ([0.2, 0.25, 0.3], 0.1, "worse"),
        ([0.001, -0.001, 0.0], 0.01, "no meaningful difference"),  # [-0.0025, +0.0025]
        ([0.01, 0.011, 0.012], 0.05, "no meaningful difference"),  # excludes 0, but tiny
        ([-0.1, -0.2, -0.3], 0.05, "inconclusive"),  # [-0.45, +0.05]: 0 inside
        ([-0.2, -0.25, -0.3], 0.3, "inconclusive"),  # excludes 0, not beyond the minimum
    ],
)
def test_compare_reaches_each_verdict(d, minimum, verdict):
    c = compare(d, [0.0] * len(d), minimum, paired=True)
    half = T_2 * statistics.stdev(d) / math.sqrt(len(d))
    low, high = statistics.mean(d) - half, statistics.mean(d) + half  # the rule, by hand
    assert (-minimum < low and high < minimum) == (verdict == "no meaningful difference")
    assert ((low > 0 or high < 0) and abs(statistics.mean(d)) > minimum) == (
        verdict in ("better", "worse")
    )
    assert c.verdict == verdict


@pytest.mark.parametrize(
    "a, b, paired, minimum",
    [
        ([1.0, 1.1], [2.0, 2.1, 2.2], False, 0.1),  # 2 seeds: refused, even beside 3
        ([1.0, 1.1, 1.2], [2.0, 2.1], False, 0.1),
        ([1.0], [2.0, 2.1, 2.2], False, 0.1),
        ([1.0, 1.2, 1.1, 1.3], [2.0, 2.1, 2.2], True, 0.1),  # zip would drop the unpaired seed
        ([1.0, 1.2, 1.1], [2.0, 2.1, 2.2], False, 0.0),  # no minimum effect
        ([1.0, 1.2, 1.1], [2.0, 2.1, 2.2], True, -0.1),
        ([1.0, 1.2, 1.1], [2.0, 2.1, 2.2], False, float("nan")),
    ],
)
def test_compare_refuses_two_seeds_unequal_pairs_and_no_minimum(a, b, paired, minimum):
    with pytest.raises(
        ValueError, match=f"compare needs at least 3 values a side.*got {len(a)} and {len(b)}"
    ):
        compare(a, b, minimum, paired=paired)


def test_the_readme_quotes_the_claims_the_last_chapter_printed():
    """Every row of the README's table of claims measured on Shakespeare is a line chapter 12b
    printed in its stored run."""
    root = Path(__file__).parents[1]
    notebook = json.loads((root / "notebooks" / "12b_claims.ipynb").read_text())
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


def ablation_record(model, seed, bpc, window, sliding, cpu_seconds=1.0):
    return dict(
        model=model,
        seed=seed,
        lr=1e-3,
        init="uniform",
        params=10,
        train_chars=100,
        mem_len=0,
        folder="f",
        valid_bpc=bpc,
        test_bpc=bpc,
        test_bpc_by_memory=None,
        sliding=dict(chars=16, window=4, segment_bpc=window, sliding_bpc=sliding),
        train_cpu_seconds=cpu_seconds,
    )


def test_claims_table_verdicts_on_runs_built_by_hand(tmp_path):
    """Two runs whose numbers are chosen: each verdict as worked out by hand (Welch's 95 % interval,
    minimum 0.01 bpc), RECL from tables with known knees (minimum 16 characters)."""
    bpc = {
        "xl": [2.0, 2.001, 2.002],  # standard deviation 0.001
        "xl-memory0": [2.2, 2.21, 2.22],
        "vanilla": [2.5, 2.51, 2.52],
        "xl-memory128": [2.001, 2.002, 2.003],  # +0.001, interval ±0.0023: inside ±0.01
        "xl-memory256": [1.9, 2.05, 2.2],  # +0.049, interval ±0.37
        "vanilla-time": [1.95, 1.96, 1.97],  # -0.041 below xl, interval ±0.025
        "lstm": [2.0, 2.03, 2.01],  # xl -0.012, interval ±0.038
        "lstm-time": [2.0, 2.001, 2.002],
        "shaw-memory": [2.3, 2.31, 2.32],  # xl -0.309 below it
    }
    window = {"xl": [2.1, 2.101, 2.102], "vanilla": [2.7, 2.71, 2.72]}
    cpu = {"vanilla-time": 2.0, "lstm-time": 1.05}  # seconds; xl and the rest 1.0
    runs = [
        ablation_record(
            m, s, v, window.get(m, [None] * 3)[s], [2.6, 2.61, 2.62][s], cpu.get(m, 1.0)
        )
        for m, values in bpc.items()
        for s, v in enumerate(values)
    ]
    ablation, long_run = tmp_path / "ablation", tmp_path / "real_text"
    ablation.mkdir(), long_run.mkdir()
    speed = dict(L=3800, recompute=3.8e9, segment=2.5e6, cached=1e6)  # 1,520x and 3,800x less work
    (ablation / "results.json").write_text(json.dumps({"runs": runs, "speed": speed}))
    contexts = {"contexts": [8, 16, 24, 32, 40]}
    xl_records = [record("xl", s, 2.0) for s in range(3)]
    (long_run / "results.json").write_text(json.dumps({"runs": xl_records, "contexts": contexts}))
    knee = {"xl": 4, "lstm": 1, "vanilla": 0}  # the last context row at which the loss still falls
    tables = {
        f"{m}-seed{s}": torch.tensor([[5.0 - min(k, knee[m])] * 5 for k in range(5)])
        for m in knee
        for s in range(3)
    }
    save_file(tables, long_run / "context_losses.safetensors")
    write_manifest(ablation), write_manifest(long_run)
    assert [row["verdict"] for row in claims_table(ablation, long_run)] == [
        "reproduces",  # relative positions alone: -0.3 against vanilla
        "reproduces",  # the memory, trained: -0.209
        "reproduces",  # the sinusoids against Shaw et al.'s learned table, both with memory
        "does not reproduce: no meaningful difference",  # memory 128
        "inconclusive: more seeds would decide",  # memory 256: the seeds disagree
        "reproduces",  # xl below vanilla by 0.509
        # vanilla, trained twice xl's time, is better by 0.041: the time could explain it
        "untested: vanilla-time trained 200% of the time",
        "reproduces",  # xl's segments 2.101 against vanilla's sliding window 2.61
        "inconclusive: more seeds would decide",  # lstm: the interval holds 0
        "does not reproduce: no meaningful difference",  # lstm-time: equal, in 105 % of the time
        "reproduces",  # RECL 40 against 16: +24 characters, +150 %
        "longer, by less than 450 %",  # 40 against 8: +32 characters, +400 %
        # 1,520x projecting the memory again (the original's procedure), 3,800x with the cache
        "at least 1,874x less work with the inference cache only (counted; timed in chapter 07)",
    ]


def test_compare_calls_no_difference_no_meaningful_difference():
    "Equal numbers have no spread, and no difference: an interval of width 0 at 0."
    for paired in (False, True):
        c = compare([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], 0.01, paired=paired)
        assert (c.difference, c.low, c.high) == (0.0, 0.0, 0.0)
        assert c.verdict == "no meaningful difference"
