"""The original's attention types 0-3 against a slow transcription of its code, plus memory, shapes
and refusals.

`original_lm` below is written from a reading of kimiyoung/transformer-xl,
pytorch/mem_transformer.py (`MemTransformerLM._forward`, `MultiHeadAttn`,
`RelLearnableMultiHeadAttn`, `RelPartialLearnableMultiHeadAttn`, `PositionwiseFF`, `_update_mems`),
one query, key and head at a time, with no code of txl_lib.variants. It reads the weights of our
model by name, so that both compute with the same numbers."""

import math

import pytest
import torch
import torch.nn as nn

from txl_lib.model import TXLConfig, TransformerXL
from txl_lib.variants import PositionVariantLM, VariantConfig, config_of_type, fit_table
from txl_lib.pretrained import build_model


def config(**options):
    "TXLConfig for attn_type 0 (or none), VariantConfig for 1-3: the original's switch."
    return config_of_type(
        **{
            **dict(n_token=30, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=24, tgt_len=5),
            **options,
        }
    )


def perturbed(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model.eval()


class Halve(nn.Module):
    """A deterministic stand-in for the model's embedding/output dropout, to see where the dropout
    is applied."""

    def forward(self, x):
        return 0.5 * x


# --------------------------------------------------------------------------------------------------
# --------------

# The original, transcribed slowly (single sequence, lists of vectors, explicit loops)


def layer_norm(x, weight, bias):
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + 1e-5) * weight + bias


def sinusoid(position: float, E: int):
    "PositionalEmbedding: [sin(p * inv_freq), cos(p * inv_freq)], inv_freq = 1 / 10000^(2i/E)."
    inv_freq = 1 / 10000 ** (torch.arange(0.0, E, 2.0) / E)
    return torch.cat([torch.sin(position * inv_freq), torch.cos(position * inv_freq)])


def is_masked(i, j, M, T, c):
    "dec_attn_mask[i, j]: the future (triu 1+mlen); with same_length also tril(-mask_shift_len)."
    if j > i + M:
        return True
    if c.same_length:
        mask_len = M + T - c.mem_len
        shift = T - mask_len if mask_len > 0 else T
        return j <= i - shift
    return False


def table_for_keys(table, K):
    "RelLearnableMultiHeadAttn: pad with row 0 in front when klen > rows, else the last klen rows."
    rows = table.shape[0]
    if K > rows:
        return torch.cat([table[0:1].expand(K - rows, *table.shape[1:]), table])
    return table[-K:]


def original_attention(w, mem, p, c, attn_type, extra):
    """One sequence: w (T, E), mem (M, E) -> (T, E); p = this layer's weights; extra = the type's
    position inputs."""
    T, M, H, D = w.shape[0], mem.shape[0], c.n_head, c.d_head
    cat = torch.cat([mem, w])
    normed = layer_norm(cat, p["attn.norm.weight"], p["attn.norm.bias"]) if c.pre_lnorm else cat
    W_q, W_k, W_v = p["attn.qkv.weight"].split(H * D)
    query_source = (
        normed[M:] if attn_type in (0, 1) else w
    )  # MultiHeadAttn: q_net(h), h not normalised
    if attn_type == 0:
        r_head_k = [
            p["attn.w_r.weight"] @ r for r in extra["pos_emb"]
        ]  # klen rows, distance K-1 .. 0
    if attn_type == 1:
        r_emb, r_bias = (
            table_for_keys(extra["r_emb"], M + T),
            table_for_keys(extra["r_bias"], M + T),
        )
    heads = torch.zeros(T, H * D)
    for h in range(H):
        part = slice(h * D, (h + 1) * D)
        for i in range(T):
            q = W_q[part] @ query_source[i]
            visible = [j for j in range(M + T) if not is_masked(i, j, M, T, c)]
            scores = []
            for j in visible:
                k, row = W_k[part] @ normed[j], M + T - 1 - (M + i - j)  # row of distance M + i - j
                if attn_type == 0:
                    score = (q + extra["u"][h]) @ k + (q + extra["v"][h]) @ r_head_k[row][part]
                elif attn_type == 1:
                    score = (q + extra["u"][h]) @ k + q @ r_emb[row, h] + r_bias[row, h]
                else:
                    score = q @ k
                scores.append(score / math.sqrt(D))
            prob = torch.softmax(torch.stack(scores), 0)
            heads[i, part] = sum(pj * (W_v[part] @ normed[j]) for pj, j in zip(prob, visible))
    attn_out = heads @ p["attn.out.weight"].T
    return (
        w + attn_out
        if c.pre_lnorm
        else layer_norm(w + attn_out, p["attn.norm.weight"], p["attn.norm.bias"])
    )


def original_ff(x, p, c):
    "PositionwiseFF: Linear, ReLU, Linear; pre-norm or post-norm residual."
    core = lambda y: (
        torch.relu(y @ p["ff.0.weight"].T + p["ff.0.bias"]) @ p["ff.3.weight"].T + p["ff.3.bias"]
    )
    if c.pre_lnorm:
        return x + core(layer_norm(x, p["ff_norm.weight"], p["ff_norm.bias"]))
    return layer_norm(x + core(x), p["ff_norm.weight"], p["ff_norm.bias"])


def original_lm(model, ids, mems, drop, in_place=False):
    """MemTransformerLM._forward for one batch row at a time: logits (B, T, V) and the new mems
    (n_layer of them; the original also caches the last layer's output, never used).
    `in_place`: the memory's positions are added into the cached tensors (the original's
    `mems_i += ...`), so they stay in the next memory."""
    c, state = model.config, {k: v.detach() for k, v in model.state_dict().items()}
    attn_type = getattr(c, "attn_type", 0)  # a TXLConfig is the original's type 0
    E, B, T = c.d_model, *ids.shape
    M = 0 if mems is None else mems[0].shape[1]
    K, logits, new_mems = M + T, [], [[] for _ in range(c.n_layer)]
    for b in range(B):
        word_emb = state["word_emb.weight"][ids[b]] * math.sqrt(
            E
        )  # AdaptiveEmbedding: * d_proj**0.5
        distances = [min(d, c.clamp_len) if c.clamp_len > 0 else d for d in range(K - 1, -1, -1)]
        pos_emb = torch.stack([sinusoid(d, E) for d in distances]) if attn_type in (0, 2) else None
        core_out = drop(word_emb + pos_emb[-T:]) if attn_type == 2 else drop(word_emb)
        hids = []
        for l in range(c.n_layer):
            p = {
                k.removeprefix(f"layers.{l}."): v
                for k, v in state.items()
                if k.startswith(f"layers.{l}.")
            }
            mem = torch.zeros(0, E) if mems is None else mems[l][b].clone()
            extra = {}
            if attn_type == 0:
                u, v = (state["u"][l], state["v"][l]) if c.untie_r else (state["u"], state["v"])
                extra = dict(pos_emb=drop(pos_emb), u=u, v=v)
            if attn_type == 1:
                r_emb, r_bias = state["r_emb"][l], state["r_bias"][l]
                if c.clamp_len > 0:
                    r_emb, r_bias = r_emb[-c.clamp_len :], r_bias[-c.clamp_len :]
                extra = dict(r_emb=r_emb, u=state["u"][l], r_bias=r_bias)
            mem_positions = torch.zeros_like(mem)
            if attn_type == 2 and l == 0 and M > 0:
                mem_positions = pos_emb[:M]
            if attn_type == 3:
                if M > 0:
                    cur_emb = state["r_emb"][l][:-T]
                    if cur_emb.shape[0] < M:
                        cur_emb = torch.cat(
                            [cur_emb[0:1].expand(M - cur_emb.shape[0], -1, -1), cur_emb]
                        )
                    mem_positions = cur_emb[-M:].reshape(M, -1)
                core_out = core_out + state["r_emb"][l][-T:].reshape(
                    T, -1
                )  # hids[l] is this tensor
            hids.append(core_out)
            given, mem = mem, mem + mem_positions
            cached = mem if in_place else given
            core_out = original_ff(original_attention(core_out, mem, p, c, attn_type, extra), p, c)
            new_mems[l].append(
                torch.cat([cached, hids[l]])[-c.mem_len :] if c.mem_len else torch.zeros(0, E)
            )
        logits.append(drop(core_out) @ state["head.weight"].T + state["head.bias"])
    return torch.stack(logits), [torch.stack(m) for m in new_mems]


# --------------------------------------------------------------------------------------------------
# --------------


CASES = [
    dict(attn_type=t, pre_lnorm=pre, **options)
    for t in range(4)
    for pre in (False, True)
    for options in (dict(), dict(clamp_len=3), dict(same_length=True))
] + [dict(attn_type=0, untie_r=True)]


@pytest.mark.parametrize("options", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_every_type_equals_the_original_transcribed_slowly(options):
    """Segments of 5, 8, 5, 8 with memory 7: K up to 15 > 12 table rows; dropout replaced by a
    visible stand-in."""
    torch.manual_seed(0)
    model = perturbed(build_model(config(mem_len=7, **options)))
    model.drop = Halve()
    mems = theirs = None
    for T in (5, 8, 5, 8):
        ids = torch.randint(30, (2, T))
        with torch.no_grad():
            out = model(ids, mems=mems)
        logits, theirs_next = original_lm(model, ids, theirs, Halve())
        torch.testing.assert_close(out.logits, logits, atol=2e-5, rtol=2e-5)
        for ours, original in zip(out.mems, theirs_next):
            torch.testing.assert_close(ours, original, atol=2e-5, rtol=2e-5)
        mems, theirs = out.mems, theirs_next


@pytest.mark.parametrize("attn_type", [2, 3])
@pytest.mark.parametrize("mem_len", [4, 7])
def test_the_originals_in_place_addition_is_the_one_difference(attn_type, mem_len):
    """With the original's `mems_i += ...`: mem_len <= T replaces every memory entry each step,
    so it leaves no trace and logits and memories equal the original's; with mem_len = 7 > T =
    5, entries that stay collect a second encoding and the logits differ from the third
    segment on (the chapter's replay shows the same for type 2)."""
    torch.manual_seed(0)
    model = perturbed(build_model(config(attn_type=attn_type, mem_len=mem_len)))
    mems = theirs = None
    for segment in range(3):
        ids = torch.randint(30, (2, 5))
        with torch.no_grad():
            out = model(ids, mems=mems)
        logits, theirs = original_lm(model, ids, theirs, nn.Identity(), in_place=True)
        if mem_len > 5 and segment == 2:
            assert (out.logits - logits).abs().max() > 1e-2
        else:
            torch.testing.assert_close(out.logits, logits, atol=2e-5, rtol=2e-5)
        if mem_len <= 5:
            for ours, original in zip(out.mems, theirs):
                torch.testing.assert_close(ours, original, atol=2e-5, rtol=2e-5)
        mems = out.mems


def test_position_parameters_have_the_originals_shapes():
    """MemTransformerLM._create_params: r_emb (n_layer, max_klen, H, D), r_w_bias (n_layer, H,
    D), r_bias (n_layer, max_klen, H) for type 1; r_emb (n_layer, max_klen, H, D) for type 3;
    nothing for type 2."""
    c = dict(n_layer=2, max_klen=5 + 7, H=2, D=8)
    shapes = {
        1: dict(
            r_emb=(c["n_layer"], c["max_klen"], c["H"], c["D"]),
            u=(c["n_layer"], c["H"], c["D"]),
            r_bias=(c["n_layer"], c["max_klen"], c["H"]),
        ),
        2: dict(),
        3: dict(r_emb=(c["n_layer"], c["max_klen"], c["H"], c["D"])),
    }
    for attn_type, expected in shapes.items():
        model = build_model(config(attn_type=attn_type, mem_len=7))
        found = {
            n: tuple(p.shape) for n, p in model.named_parameters() if n in ("r_emb", "u", "r_bias")
        }
        assert found == expected


@pytest.mark.parametrize(
    "options",
    [
        dict(attn_type=1, mem_len=30),  # type 0: tests/test_model.py
        dict(attn_type=1, mem_len=30, pre_lnorm=True),
        dict(attn_type=1, mem_len=30, clamp_len=4),
    ],
)
def test_type_1_with_memory_equals_one_long_forward(options):
    torch.manual_seed(0)
    model = perturbed(build_model(config(**options)))
    seq = torch.randint(30, (2, 20))
    with torch.no_grad():
        whole = model(seq).logits
        for chunk in (5, 1, 7):
            pieces, mems = [], None
            for segment in seq.split(chunk, dim=1):
                out = model(segment, mems=mems)
                pieces.append(out.logits)
                mems = out.mems
            torch.testing.assert_close(torch.cat(pieces, 1), whole, atol=1e-5, rtol=1e-5)


def test_fit_table_repeats_the_first_row_in_front_or_keeps_the_last_rows():
    table = torch.arange(4.0)[:, None]
    assert fit_table(table, 6).flatten().tolist() == [0, 0, 0, 1, 2, 3]
    assert fit_table(table, 2).flatten().tolist() == [2, 3]


@pytest.mark.parametrize("attn_type", [1, 2, 3])
@pytest.mark.parametrize(
    "mem_len, same_length, clamp_len", [(0, False, 0), (7, False, 0), (4, True, 3)]
)
def test_every_type_trains_with_memory(attn_type, mem_len, same_length, clamp_len):
    torch.manual_seed(0)
    model = build_model(
        config(
            attn_type=attn_type,
            mem_len=mem_len,
            same_length=same_length,
            clamp_len=clamp_len,
            dropout=0.1,
        )
    )
    assert isinstance(model, PositionVariantLM)
    mems = None
    for T in (5, 3, 9):  # 9 > tgt_len: longer than the tables' rows allow
        x = torch.randint(30, (2, T))
        out = model(x, mems=mems, targets=x)
        out.losses.mean().backward()
        assert out.logits.shape == (2, T, 30) and torch.isfinite(out.logits).all()
        assert [tuple(m.shape) for m in out.mems] == [
            (2, min(mem_len, T + (0 if mems is None else mems[0].size(1))), 16)
        ] * 2
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
    assert type(config(attn_type=0)) is TXLConfig and type(config(attn_type=2)) is VariantConfig
    assert type(build_model(config(attn_type=0))) is TransformerXL
    with pytest.raises(
        TypeError,
        match="TransformerXL is built from TXLConfig configs, got VariantConfig: build_model",
    ):
        TransformerXL(config(attn_type=2))
    for bad in (4, 0, True, "1"):
        with pytest.raises(
            ValueError, match=r"attn_type of a VariantConfig .* must be an int in \[1, 3\]"
        ):
            VariantConfig(n_token=30, attn_type=bad)
    with pytest.raises(
        TypeError, match="PositionVariantLM is built from VariantConfig configs, got TXLConfig"
    ):
        PositionVariantLM(config(attn_type=0))
    with pytest.raises(ValueError, match="n_head\\*d_head = 12 to inputs of width d_model = 16"):
        build_model(config(attn_type=3, d_head=6))
