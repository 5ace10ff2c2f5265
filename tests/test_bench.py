"""The benchmark's correctness part, counted arithmetic and JSON schema (never its speed), the
inference cache it relies on, and the reference page's speed tables against the run stored in
chapter 07."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from txl_lib import bench, bench_steps
from txl_lib.bench import (
    MODES,
    bench_model,
    cached_logits,
    check_same_function,
    count_flops,
    readers,
    recompute_logits,
)
from txl_lib.bench_steps import saved_tensor_bytes
from txl_lib.cache import InferenceCache
from txl_lib.model import TXLConfig, TransformerXL


def test_quick_benchmark_writes_the_documented_records(tmp_path):
    out = tmp_path / "bench.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "txl_lib",
            "bench",
            "--quick",
            "--train",
            "--json",
            str(out),
            "--threads",
            "1",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    records = json.loads(out.read_text())
    meta = [r for r in records if r["mode"] == "meta"]
    assert len(meta) == 1 and {"device", "torch", "threads"} <= meta[0].keys()
    assert meta[0]["max_logit_difference"] <= 1e-4 and meta[0]["threads"] == 1
    timed = [r for r in records if r["mode"] in MODES]
    assert {(r["L"], r["mode"]) for r in timed} == {
        (L, m)
        for L in (48, 96)
        for m in ("recompute", "segment", "segment_uncached", "generate", "generate_uncached")
    }
    for r in timed:
        floor = (
            {"batch", "floor_ms_per_token", "floor_ratio"}
            if r["mode"].startswith("generate")
            else set()
        )
        assert set(r) == {
            "L",
            "mode",
            "ms_per_token",
            "ms_range",
            "flops_per_token",
            "gflop_per_s",
            "speedup",
            "speedup_range",
            "efficiency",
            *floor,
        }
        assert 0 < r["ms_range"][0] <= r["ms_per_token"] <= r["ms_range"][1]
        assert r["speedup_range"][0] <= r["speedup"] <= r["speedup_range"][1]
        assert r["efficiency"] == pytest.approx(r["speedup"] / r["L"])
        assert r["gflop_per_s"] == pytest.approx(r["flops_per_token"] / r["ms_per_token"] / 1e6)
        if r["mode"] == "recompute":
            assert r["speedup"] == 1
    train = {r["implementation"]: r for r in records if r["mode"] == "train"}
    assert set(train) == {"hf", "ours", "ours_checkpointed"}
    assert all(train[name]["max_loss_difference"] < 1e-4 for name in ("ours", "ours_checkpointed"))
    assert train["ours_checkpointed"]["saved_mb"] < train["ours"]["saved_mb"]


def test_counted_flops_follow_the_cost_formula():
    """The counter against the matrix products of one call written out by hand: E = 64, F = 128, H·D
    = 64, V = 256."""
    E, F, HD, V, n_layer, L, T, B = 64, 128, 64, 256, 2, 40, 8, 2
    model = bench_model(n_layer=n_layer, d_model=E, n_head=2, d_head=32, d_inner=F)
    flops = count_flops(readers(model, L, T, B))
    dense = 4 * E * HD + 2 * E * F  # per position: q, k, v, output projections, feed-forward

    def attention(queries, keys):  # content and position scores (one zero column more: chapter
        return (3 * keys + 1) * queries * HD  # 05 pads W_r·R, not the scores), weighted values

    def per_token(call, predicted):  # a multiply-add is two floating-point operations
        return 2 * call / (B * predicted)

    positions = lambda K: n_layer * K * E * HD  # W_r·R: once per call, shared by the batch
    segment = B * (n_layer * (T * dense + attention(T, L)) + T * E * V)
    assert flops["segment"] == per_token(segment, T)  # W_r·R comes from the cache
    memory = B * n_layer * 2 * (L - T) * E * HD  # k, v of the memory again (no queries: chapter 05)
    assert flops["segment_uncached"] == per_token(segment + memory + positions(L), T)
    # the cached step's one query sees every key: scored without the zero column (chapter 05a)
    generate = B * (n_layer * (dense + 3 * (L + 1) * HD) + E * V)
    assert flops["generate"] == per_token(generate, 1)
    uncached = B * (n_layer * (dense + attention(1, L + 1)) + E * V)  # masked and shifted
    assert flops["generate_uncached"] == per_token(
        uncached + B * n_layer * 2 * L * E * HD + positions(L + 1), 1
    )
    recompute = B * (n_layer * (L * dense + attention(L, L)) + L * E * V) + positions(L)
    assert flops["recompute"] == per_token(recompute, 1)


def test_the_check_catches_a_procedure_that_computes_something_else():
    model = bench_model(n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64)
    tokens = torch.randint(256, (2, 40), generator=torch.Generator().manual_seed(0))
    assert check_same_function(model, tokens, 40, 8) <= 1e-4
    # a memory shorter than the context forgets: the logits of late tokens must differ from
    # recomputing

    short = cached_logits(model, tokens, 8, 8)
    assert (short - recompute_logits(model, tokens, 40)).abs().max() > 1e-3


@pytest.mark.parametrize(
    "pre_lnorm, same_length, mem_len", [(False, False, 6), (True, True, 5), (False, True, 0)]
)
def test_inference_cache_equals_plain_memory(pre_lnorm, same_length, mem_len):
    torch.manual_seed(0)
    model = TransformerXL(
        TXLConfig(
            n_token=30,
            d_model=16,
            n_head=2,
            d_head=8,
            mem_len=mem_len,
            pre_lnorm=pre_lnorm,
            same_length=same_length,
        )
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    seq = torch.randint(30, (2, 40))
    plain_mems = cached_mems = None
    cache = InferenceCache(len(model.layers))
    with torch.inference_mode():
        for segment in seq.split([7, 1, 1, 3, 1, 20, 1, 1, 5], dim=1):
            plain = model(segment, mems=plain_mems)
            cached = model(segment, mems=cached_mems, cache=cache)
            torch.testing.assert_close(cached.logits, plain.logits, atol=1e-5, rtol=1e-5)
            for a, b in zip(cached.mems, plain.mems):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
            plain_mems, cached_mems = plain.mems, cached.mems
    assert cache.length == plain_mems[0].size(1)


def test_mems_handed_out_by_the_cache_stay_valid():
    torch.manual_seed(0)
    model = TransformerXL(TXLConfig(n_token=30, d_model=16, n_head=2, d_head=8, mem_len=4)).eval()
    cache, out, kept = InferenceCache(2), None, []
    with torch.inference_mode():
        for t in range(30):  # many appends: the buffer is compacted often
            out = model(
                torch.tensor([[t % 30]]), mems=None if out is None else out.mems, cache=cache
            )
            kept.append([m.clone() for m in out.mems] + list(out.mems))
    for snapshot in kept:
        copies, views = snapshot[:2], snapshot[2:]
        assert all(torch.equal(c, v) for c, v in zip(copies, views))


def test_inference_cache_refuses_misuse_and_changes_nothing():
    model = TransformerXL(TXLConfig(n_token=30, d_model=16, n_head=2, d_head=8, mem_len=4)).eval()
    x = torch.randint(30, (1, 3))
    cache = InferenceCache(2)
    with pytest.raises(RuntimeError, match="eval mode and torch.inference_mode"):
        model(x, cache=cache)  # gradients on
    with torch.inference_mode():
        first = model(x, cache=cache)
        stale = model(x, mems=first.mems, cache=cache)
        with pytest.raises(ValueError, match="previous call"):
            model(x, mems=first.mems, cache=cache)  # not the memory the cache returned last
        with pytest.raises(ValueError, match="previous call"):
            model(x, cache=cache)  # mems=None with a used cache
        again = model(x, mems=stale.mems, cache=cache)  # the refused calls left the cache as it was
        plain = model(x, mems=model(x, mems=model(x).mems).mems)
    torch.testing.assert_close(again.logits, plain.logits, atol=1e-5, rtol=1e-5)


def test_saved_tensor_bytes_counts_activations_not_weights():
    layer = torch.nn.Linear(100, 50)
    x = torch.randn(8, 100, requires_grad=True)
    _, counted = saved_tensor_bytes(lambda: torch.relu(layer(x)).sum(), layer.parameters())
    assert counted == 8 * 100 * 4 + 8 * 50 * 4  # the input of the matmul, the output of relu


def test_the_reference_page_quotes_the_run_committed_in_chapters_07_and_07a():
    """The reference page's speed tables (chapter 07) and the one-token step's verdicts (07a): the
    ones the chapters printed in their stored runs, row for row and line for line."""
    root = Path(__file__).parents[1]
    notebooks = [
        json.loads((root / "notebooks" / name).read_text())
        for name in ("07_speed_benchmark.ipynb", "07a_step_and_training.ipynb")
    ]

    def printed(marker: str) -> list[str]:
        cells = [c for nb in notebooks for c in nb["cells"] if marker in "".join(c["source"])]
        text = "".join(t for cell in cells for out in cell["outputs"] for t in out.get("text", []))
        return [line for line in text.splitlines() if line.strip()]

    tables = [line for line in printed("= benchmark(") if line.startswith("| ")]
    assert len(tables) >= 10, tables
    steps = printed("steps_by_change") + printed("gpu_run[")  # tables and verdict lines
    assert len(steps) >= 2 * 8 + 3 + 4, steps
    reference = (root / "docs" / "reference.md").read_text().splitlines()
    quoted = tables + [line for line in steps if line.startswith(("| ", "B = ", "the same step"))]
    assert [line for line in quoted if line not in reference] == []


def test_quick_needs_no_transformers_and_compares_training_only_when_asked(monkeypatch):
    monkeypatch.setitem(
        sys.modules, "transformers", None
    )  # as if not installed: importing it fails
    records = bench_steps.main(["--quick", "--lengths", "48", "--repeats", "1"])
    assert records and not any(r["mode"] == "train" for r in records)


@pytest.mark.parametrize("flag, package", [("--plot", "matplotlib"), ("--train", "transformers")])
def test_a_missing_package_is_refused_before_measuring(monkeypatch, tmp_path, flag, package):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a)
    )
    monkeypatch.setattr(bench, "benchmark", lambda *a, **k: pytest.fail("measured before refusing"))
    argv = ["--quick", flag] + ([str(tmp_path / "speed.png")] if flag == "--plot" else [])
    with pytest.raises(ImportError, match=f"{flag} needs {package}"):
        bench_steps.main(argv)


def test_an_output_folder_that_does_not_exist_is_refused_before_measuring(monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "benchmark", lambda *a, **k: pytest.fail("measured before refusing"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        bench_steps.main(["--quick", "--json", str(tmp_path / "missing" / "records.json")])


def test_quick_keeps_the_sizes_the_command_line_gives():
    records = bench_steps.main(["--quick", "--lengths", "40", "--tgt-len", "8", "--repeats", "1"])
    timed = [r for r in records if r["mode"] in MODES]
    assert {r["L"] for r in timed} == {40}
    meta = next(r for r in records if r["mode"] == "meta")
    assert (meta["T"], meta["repeats"]) == (8, 1)


def test_every_generate_record_carries_its_batch_and_the_bandwidth_floor(tmp_path):
    """Each generate record: its batch, and the floor at the bandwidth measured in the same run (in
    the meta record)."""
    records = bench_steps.main(
        [
            "--quick",
            "--lengths",
            "48",
            "--repeats",
            "1",
            "--batch",
            "3",
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    config, bandwidth = (
        bench.bench_model(n_layer=2, d_model=64, n_head=2, d_head=32, d_inner=256).config,
        records[0]["read_bytes_per_s"],
    )
    generate = [
        r for r in json.loads((tmp_path / "r.json").read_text()) if r["mode"].startswith("generate")
    ]
    assert len(generate) == 2 and all(r["batch"] == 3 for r in generate)
    assert all(
        math.isclose(r["floor_ms_per_token"], bench.generation_floor_ms(config, 48, 3, bandwidth))
        and math.isclose(r["floor_ratio"], r["ms_per_token"] / r["floor_ms_per_token"])
        for r in generate
    )


def test_the_floor_counts_the_bytes_a_cached_step_reads():
    """Keys and values of the memory, W_r·R, the weights of each layer and the read-out, in float32:
    counted from the model."""
    model = bench.bench_model(n_layer=2, d_model=64, n_head=2, d_head=32, d_inner=256)
    weights = sum(
        p.numel()
        for layer in model.layers
        for name, p in layer.named_parameters()
        if p.dim() == 2 and "w_r" not in name
    )  # qkv, out, the two of ff
    L, B, H, D = 48, 3, 2, 32
    step_bytes = 4 * (
        len(model.layers) * (2 * L * H * D * B + L * H * D) + weights + model.head.weight.numel()
    )
    assert math.isclose(
        bench.generation_floor_ms(model.config, L, B, bandwidth=1e9), 1e3 * step_bytes / 1e9 / B
    )
