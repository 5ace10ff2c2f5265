"""The one-token step's changes, each against an independent computation: `Linear`'s blocked route
against nn.functional.linear, one-query scoring against chapter 04's four terms, the cache's one
projection of R against the plain forward; the step's count of dispatched operations (issue 47);
and the benchmark that times them (not its speed)."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from txl_lib.attention import attention_mask, one_query_score, score_terms
from txl_lib.bench import bench_model, count_operations, step_operations
from txl_lib.bench_steps import STEP_VERSIONS, format_step_changes, step_changes
from txl_lib.cache import InferenceCache, sees_every_key
from txl_lib.model import TXLConfig, TransformerXL
from txl_lib.infrastructure import Linear


def products(call) -> set:
    "The names of the matrix products `call()` ran."
    with FlopCounterMode(display=False) as counter:
        call()
    return {str(op).split(".")[1] for op in counter.get_flop_counts()["Global"]}


@pytest.mark.parametrize("n_out, bias", [(10, True), (12, False), (7, True)])
@pytest.mark.parametrize("shape", [(1, 6), (2, 1, 6), (3, 2, 6), (4, 2, 6), (9, 6), (3, 5, 6)])
def test_linear_equals_the_plain_product_by_either_route(n_out, bias, shape):
    torch.manual_seed(0)
    layer = Linear(6, n_out, bias=bias)
    x = torch.randn(shape)
    with torch.no_grad():
        expected = F.linear(x, layer.weight, layer.bias)
        torch.testing.assert_close(layer(x), expected, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(layer(x.transpose(0, -2)), expected.transpose(0, -2))
        rows = x.numel() // 6
        blocked = rows <= Linear.few_rows and n_out % 2 == 0
        assert products(lambda: layer(x)) == ({"bmm"} if blocked else {"addmm" if bias else "mm"})
    assert layer(x).is_contiguous()
    assert products(lambda: layer(x)) == {"addmm" if bias else "mm"}  # with gradients: nn.Linear's


@pytest.mark.parametrize("B, H, D, K", [(1, 1, 4, 1), (2, 3, 4, 9), (3, 2, 8, 17)])
def test_one_query_score_is_the_four_terms_of_chapter_04(B, H, D, K):
    torch.manual_seed(K)
    q, k, r = torch.randn(B, H, 1, D), torch.randn(B, H, K, D), torch.randn(H, K, D)
    u, v = torch.randn(H, D), torch.randn(H, D)
    terms = score_terms(q, k, r, u, v)  # the slow way: R's row for each distance
    expected = terms.a + terms.b + terms.c + terms.d
    torch.testing.assert_close(one_query_score(q, k, r, u, v), expected, atol=1e-5, rtol=1e-5)
    # an inner step: the cache calls it only for one query over every key (sees_every_key)


def model_of(**options) -> TransformerXL:
    torch.manual_seed(0)
    model = TransformerXL(TXLConfig(n_token=30, d_model=16, n_head=2, d_head=8, **options)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("one_query", [True, False])
@pytest.mark.parametrize(
    "options", [dict(mem_len=12), dict(mem_len=5, same_length=True), dict(mem_len=0)]
)
def test_one_token_steps_from_an_empty_memory_equal_the_plain_forward(one_query, options):
    model, seq = model_of(**options), torch.randint(30, (2, 40))
    cache, cached, plain = InferenceCache(2, one_query), None, None
    with torch.inference_mode():
        for t in range(seq.size(1)):  # the memory grows to mem_len, then slides
            token = seq[:, t : t + 1]
            plain = model(token, mems=None if plain is None else plain.mems)
            cached = model(token, mems=None if cached is None else cached.mems, cache=cache)
            torch.testing.assert_close(cached.logits, plain.logits, atol=1e-5, rtol=1e-5)
    # one projection of R per layer, for at most twice the most keys a call had
    assert all(layer.positions.size(1) <= 2 * (model.config.mem_len + 1) for layer in cache.layers)
    assert cache.r.size(0) == cache.layers[0].positions.size(1)


@pytest.mark.parametrize("same_length", [False, True])
@pytest.mark.parametrize("mem_len", [0, 1, 4, 7])
def test_sees_every_key_follows_the_mask(same_length, mem_len):
    model = model_of(mem_len=mem_len, same_length=same_length)
    for T, M in [(T, M) for T in (1, 2) for M in range(8)]:
        c = model.config  # the mask itself, independently
        hidden = attention_mask(T, M, c.same_length, c.mem_len).any().item()
        assert sees_every_key(model.config, T, M) == (T == 1 and not hidden)


@pytest.mark.parametrize("B", [1, 4])
def test_a_cached_one_token_step_dispatches_at_most_40_operations_per_layer(B):
    model = bench_model()  # chapter 07's model: 4 layers of width 256, at L = 1024
    counts = step_operations(model, L=1024, batch=B)
    assert sum(counts.values()) <= 40 * model.config.n_layer, counts
    assert "dropout" not in counts and "masked_fill" not in counts  # no dropout call, no mask


def test_no_dropout_call_in_an_evaluation_step_of_a_model_with_dropout():
    model = model_of(mem_len=8, dropout=0.3, dropatt=0.3)
    cache, ids = model.new_cache(), torch.randint(30, (2, 12))
    with torch.inference_mode():
        out = model(ids, cache=cache)
        counts = count_operations(lambda: model(ids[:, :1], mems=out.mems, cache=cache))
    assert counts and "dropout" not in counts
    model.train()  # in training the dropouts are drawn: two calls differ
    assert not torch.equal(model(ids).logits, model(ids).logits)


def test_step_changes_reports_every_version_with_its_spread():
    model = bench_model(n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32)
    records = step_changes(model, L=16, batches=(1, 2), rounds=3, steps=2)
    assert [(r["batch"], r["version"]) for r in records] == [
        (B, name) for B in (1, 2) for name in STEP_VERSIONS
    ]
    for r in records:
        for key in ("ms_per_token", "floor_ms_per_token", "floor_ratio", "gain"):
            low, high = r[f"{key}_range"]
            assert 0 < low <= r[key] <= high
    assert all(
        r["gain_range"] == [1.0, 1.0] for r in records if r["version"] == next(iter(STEP_VERSIONS))
    )
    table = format_step_changes(records).splitlines()
    assert len(table) == 2 + len(records) and all(row.count("|") == 7 for row in table)
