"""The original's attention types 1-3: memory equivalence where it holds (relative types), shapes and finiteness."""
import pytest
import torch

from txl_lib.model import TXLConfig, TransformerXL
from txl_lib.variants import PositionVariantLM, build_model, fit_table


def config(**options):
    return TXLConfig(**{**dict(n_token=30, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=24, tgt_len=5), **options})


def perturbed(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("options", [dict(attn_type=1, mem_len=30),   # type 0: tests/test_model.py
                                     dict(attn_type=1, mem_len=30, pre_lnorm=True),
                                     dict(attn_type=1, mem_len=30, clamp_len=4)])
def test_type_1_with_memory_equals_one_long_forward(options):
    torch.manual_seed(0)
    model = perturbed(build_model(config(**options)))
    seq = torch.randint(30, (2, 20))
    with torch.no_grad():
        whole = model(seq).logits
        for chunk in (5, 1, 7):
            pieces, mems = [], None
            for segment in seq.split(chunk, dim=1):
                out = model(segment, mems=mems); pieces.append(out.logits); mems = out.mems
            torch.testing.assert_close(torch.cat(pieces, 1), whole, atol=1e-5, rtol=1e-5)


def test_type_1_learned_rows_follow_the_distance_by_a_slow_loop():
    torch.manual_seed(0)
    model = perturbed(build_model(config(attn_type=1, n_layer=1, n_head=1, d_head=16, mem_len=3)))
    attn = model.layers[0].attn
    x, mem = torch.randn(1, 4, 16), torch.randn(1, 3, 16)
    r_emb, u, r_bias = model.relative_args(0)
    mask = torch.ones(4, 7, dtype=torch.bool).triu(4)
    fast = attn(x, r_emb, u, r_bias, mask, mem)
    context = torch.cat([mem, x], 1)[0]
    W_q, W_k, W_v = attn.qkv.weight.view(3, 16, 16)
    rows = fit_table(r_emb, 7)                                   # row j = distance 6 - j
    out = torch.zeros(4, 16)
    for i in range(4):
        q = W_q @ x[0, i]
        visible = [j for j in range(7) if not mask[i, j]]
        scores = torch.stack([(q + u[0]) @ (W_k @ context[j]) + q @ rows[6 - (3 + i - j), 0]
                              + fit_table(r_bias, 7)[6 - (3 + i - j), 0] for j in visible]) / 4.0
        out[i] = sum(p * (W_v @ context[j]) for p, j in zip(scores.softmax(0), visible))
    expected = attn.norm(x[0] + out @ attn.out.weight.T)
    torch.testing.assert_close(fast[0], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attn_type", [1, 2, 3])
@pytest.mark.parametrize("mem_len, same_length, clamp_len", [(0, False, 0), (7, False, 0), (4, True, 3)])
def test_every_type_runs_with_memory(attn_type, mem_len, same_length, clamp_len):
    torch.manual_seed(0)
    model = build_model(config(attn_type=attn_type, mem_len=mem_len, same_length=same_length, clamp_len=clamp_len))
    assert isinstance(model, PositionVariantLM)
    mems = None
    for T in (5, 3, 9):                                          # 9 > tgt_len: longer than the tables' rows allow
        x = torch.randint(30, (2, T))
        out = model(x, mems=mems, targets=x)
        out.loss.mean().backward()
        assert out.logits.shape == (2, T, 30) and torch.isfinite(out.logits).all()
        assert [tuple(m.shape) for m in out.mems] == [(2, min(mem_len, T + (0 if mems is None else mems[0].size(1))), 16)] * 2
        mems = out.mems


def test_absolute_types_do_not_touch_the_memory_they_are_given():
    torch.manual_seed(0)
    for attn_type in (2, 3):
        model = build_model(config(attn_type=attn_type, mem_len=10)).eval()
        mems = model(torch.randint(30, (2, 5))).mems
        before = [m.clone() for m in mems]
        model(torch.randint(30, (2, 5)), mems=mems)
        assert all(torch.equal(a, b) for a, b in zip(before, mems))


def test_types_are_routed_and_refused_clearly():
    assert type(build_model(config(attn_type=0))) is TransformerXL
    with pytest.raises(ValueError, match="build_model"):
        TransformerXL(config(attn_type=2))
    with pytest.raises(ValueError, match="attn_type must be 0, 1, 2 or 3"):
        config(attn_type=4)
    with pytest.raises(ValueError, match="use TransformerXL"):
        PositionVariantLM(config(attn_type=0))
