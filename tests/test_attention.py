"""Chapters 02-05 against brute force: update_memory, relative_positions, rel_shift, the masks,
the attention layer."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from txl_lib.attention import RelativeMultiHeadAttention, attention_mask, rel_shift
from txl_lib.memory import update_memory
from txl_lib.positions import relative_positions
from txl_lib.vanilla import VanillaTransformerLM

shapes = st.tuples(
    st.integers(1, 3), st.integers(1, 3), st.integers(1, 6), st.integers(0, 9)
)  # B, H, T, M


@settings(max_examples=80, deadline=None)
@given(shapes)
def test_rel_shift_matches_the_index_formula_on_causal_entries(shape):
    B, H, T, M = shape
    x = torch.randn(B, H, T, M + T)
    y = rel_shift(x)
    assert y.shape == x.shape
    for i in range(T):
        for j in range(M + i + 1):
            assert torch.equal(y[:, :, i, j], x[:, :, i, j + T - 1 - i])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.sampled_from([2, 4, 16]), st.integers(0, 50))
def test_relative_positions_rows_are_sinusoids_of_their_distance(klen, d_model, clamp_len):
    R = relative_positions(klen, d_model, clamp_len)
    assert R.shape == (klen, d_model)
    for k in range(klen):
        d = klen - 1 - k
        if clamp_len > 0:
            d = min(d, clamp_len)
        for i in range(d_model // 2):
            angle = d * 10000 ** (-2 * i / d_model)
            assert abs(R[k, i].item() - math.sin(angle)) < 1e-5
            assert abs(R[k, d_model // 2 + i].item() - math.cos(angle)) < 1e-5


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.lists(st.integers(1, 6), min_size=1, max_size=5), st.integers(0, 12))
def test_update_memory_keeps_the_last_positions_detached(B, segment_lengths, mem_len):
    stream = torch.randn(B, sum(segment_lengths), 4, requires_grad=True)
    memory, start = None, 0
    for T in segment_lengths:
        hidden = [stream[:, start : start + T] * 1.0, stream[:, start : start + T] * 2.0]
        start += T
        memory = update_memory(memory, hidden, mem_len)
        kept = min(mem_len, start)
        assert all(m.shape == (B, kept, 4) and not m.requires_grad for m in memory)
        torch.testing.assert_close(
            memory[0], stream[:, start - kept : start].detach(), rtol=0, atol=0
        )
        torch.testing.assert_close(
            memory[1], 2 * stream[:, start - kept : start].detach(), rtol=0, atol=0
        )


@pytest.mark.parametrize("memory_at", [-5, 0, 3])
def test_vanilla_memory_at_distinct_positions_equals_one_long_forward(memory_at):
    """Chapter 02's controls: a memory at positions p..p+T-1 and the segment after it is one pass
    over both."""
    torch.manual_seed(0)
    model = VanillaTransformerLM(11, n_layer=2, n_head=2, d_model=8, d_inner=16).eval()
    previous, current = torch.randint(11, (2, 3, 5))
    memory = update_memory(None, model(previous, first_position=memory_at).hiddens, mem_len=5)
    with_memory = model(current, mems=memory, first_position=memory_at + 5).logits
    one_pass = model(torch.cat([previous, current], 1), first_position=memory_at).logits[:, 5:]
    torch.testing.assert_close(with_memory, one_pass)


def originals_same_length_mask(T, M, mem_len):
    """The original's construction (MemTransformerLM._forward, same_length), restated: triu +
    tril of ones."""
    ones = torch.ones(T, M + T)
    beyond = M + T - mem_len
    shift = T - beyond if beyond > 0 else T
    return (torch.triu(ones, 1 + M) + torch.tril(ones, -shift)) > 0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.integers(0, 12), st.integers(0, 24))
def test_same_length_mask_equals_the_originals(T, M, mem_len):
    ours, original = (
        attention_mask(T, M, same_length=True, mem_len=mem_len),
        originals_same_length_mask(T, M, mem_len),
    )
    if mem_len > 0:
        assert torch.equal(ours, original)
    # the original hides every key, the query itself included (a NaN softmax); we keep the query
    # visible
    else:
        query_itself = torch.ones(T, M + T).triu(M).tril(M) > 0  # key j = M + i
        assert original.all() and torch.equal(ours, original & ~query_itself)
    assert ((~ours).sum(1) == torch.arange(M + 1, M + T + 1).clamp(max=max(mem_len, 1))).all()


def reference_attention(layer, x, mem, u, v, same_length, mem_len):
    """Independent reference: absolute key index j, distance M+i-j, R_{i-j} from the closed form,
    one (i, j) at a time."""
    B, T, E = x.shape
    M, H, D = mem.size(1), layer.n_head, layer.d_head
    h = torch.cat([mem, x], 1)
    if layer.pre_lnorm:
        h = torch.nn.functional.layer_norm(
            h, (E,), layer.norm.weight, layer.norm.bias, layer.norm.eps
        )
    Wq, Wk, Wv = layer.qkv.weight.split(H * D)
    out = torch.zeros(B, T, H * D, dtype=torch.float64)
    for b in range(B):
        for i in range(T):
            for n in range(H):
                rows = slice(n * D, (n + 1) * D)
                q = Wq[rows].double() @ h[b, M + i].double()
                logits, values = [], []
                for j in range(M + T):
                    if j > M + i or (same_length and j <= M + i - max(mem_len, 1)):
                        continue
                    dist = M + i - j
                    Rd = torch.tensor(
                        [
                            f(dist * 10000 ** (-2 * k / E))
                            for f in (math.sin, math.cos)
                            for k in range(E // 2)
                        ],
                        dtype=torch.float64,
                    )
                    k_j = Wk[rows].double() @ h[b, j].double()
                    r_d = layer.w_r.weight[rows].double() @ Rd
                    logits.append(
                        ((q + u[n].double()) @ k_j + (q + v[n].double()) @ r_d) / math.sqrt(D)
                    )
                    values.append(Wv[rows].double() @ h[b, j].double())
                p = torch.softmax(torch.stack(logits), 0)
                out[b, i, rows] = sum(pj * vj for pj, vj in zip(p, values))
    y = x.double() + out @ layer.out.weight.double().T
    if not layer.pre_lnorm:
        y = torch.nn.functional.layer_norm(
            y, (E,), layer.norm.weight.double(), layer.norm.bias.double(), layer.norm.eps
        )
    return y


@settings(max_examples=25, deadline=None)
@given(shapes, st.integers(1, 4), st.booleans(), st.booleans(), st.integers(1, 8))
def test_attention_layer_equals_the_slow_reference(shape, D, pre_lnorm, same_length, mem_len):
    B, H, T, M = shape
    E = 6
    torch.manual_seed(B * 1000 + H * 100 + T * 10 + M)
    layer = RelativeMultiHeadAttention(E, H, D, pre_lnorm=pre_lnorm).eval()
    torch.nn.init.normal_(layer.norm.weight, 1.0, 0.2)
    torch.nn.init.normal_(layer.norm.bias, 0.0, 0.2)
    x, mem = torch.randn(B, T, E), torch.randn(B, M, E)
    u, v = torch.randn(H, D), torch.randn(H, D)
    mask = attention_mask(T, M, same_length, mem_len)
    fast = layer(x, relative_positions(M + T, E), u, v, mask, mem if M else None)
    slow = reference_attention(layer, x, mem, u, v, same_length, mem_len)
    torch.testing.assert_close(fast.double(), slow, atol=2e-5, rtol=1e-5)
