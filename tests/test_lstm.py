"""The LSTM baseline (chapter 06c) against independent computations: the LSTM equations written
as a loop, one pass over the whole text, greedy decoding by recomputing the prefix; and its
place in the library (save and load)."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from txl_lib import LSTMConfig, LSTMLM, build_model, evaluate, from_pretrained
from txl_lib.utils import seed_everything


def lstm_by_the_equations(model: LSTMLM, ids: torch.Tensor) -> torch.Tensor:
    """Logits (B, T, V) from the paper-style equations, one position and one layer at a time, with
    the model's weights."""
    c, lstm = model.config, model.lstm
    B, T = ids.shape
    h = [torch.zeros(B, c.d_model) for _ in range(c.n_layer)]
    cell = [torch.zeros(B, c.d_model) for _ in range(c.n_layer)]
    outputs = []
    for t in range(T):
        x = model.embed.weight[ids[:, t]]
        for layer in range(c.n_layer):
            gates = (
                x @ getattr(lstm, f"weight_ih_l{layer}").T
                + getattr(lstm, f"bias_ih_l{layer}")
                + h[layer] @ getattr(lstm, f"weight_hh_l{layer}").T
                + getattr(lstm, f"bias_hh_l{layer}")
            )
            i, f, g, o = gates.chunk(4, dim=1)  # PyTorch's gate order: input, forget, cell, output
            cell[layer] = torch.sigmoid(f) * cell[layer] + torch.sigmoid(i) * torch.tanh(g)
            h[layer] = torch.sigmoid(o) * torch.tanh(cell[layer])
            x = h[layer]
        outputs.append(x @ model.head.weight.T + model.head.bias)
    return torch.stack(outputs, 1)


@settings(max_examples=15, deadline=None)
@given(
    B=st.integers(1, 3),
    T=st.integers(1, 12),
    n_layer=st.integers(1, 3),
    d_model=st.integers(2, 12),
    tie=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_the_model_computes_the_lstm_equations(B, T, n_layer, d_model, tie, seed):
    seed_everything(seed)
    model = LSTMLM(LSTMConfig(n_token=9, n_layer=n_layer, d_model=d_model, tie_weight=tie)).eval()
    ids = torch.randint(9, (B, T))
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids).logits, lstm_by_the_equations(model, ids), atol=1e-5, rtol=0
        )


@settings(max_examples=15, deadline=None)
@given(cuts=st.lists(st.integers(1, 7), min_size=1, max_size=5), seed=st.integers(0, 1000))
def test_segments_with_the_state_carried_equal_one_pass(cuts, seed):
    seed_everything(seed)
    model = LSTMLM(LSTMConfig(n_token=11, n_layer=2, d_model=8)).eval()
    ids = torch.randint(11, (2, sum(cuts) + 1))
    whole = model(ids[:, :-1], targets=ids[:, 1:]).losses
    by_segments = evaluate(
        model, ids[:, :-1], ids[:, 1:], tgt_len=cuts[0]
    ).losses  # chapter 00b's loop
    torch.testing.assert_close(by_segments, whole, atol=1e-5, rtol=0)


def test_greedy_generation_with_the_state_equals_recomputing_the_prefix():
    seed_everything(0)
    model = LSTMLM(LSTMConfig(n_token=13, n_layer=2, d_model=16)).eval()
    prompt, ids = torch.randint(13, (2, 5)), None
    ids = prompt
    with torch.no_grad():
        for _ in range(12):
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(model.generate(prompt, 12, temperature=0), ids)


def test_save_and_load_give_back_the_same_model(tmp_path):
    seed_everything(0)
    model = build_model(LSTMConfig(n_token=17, n_layer=2, d_model=12, dropout=0.1)).eval()
    loaded = from_pretrained(model.save_pretrained(tmp_path / "lstm"))
    ids = torch.randint(17, (2, 9))
    assert type(loaded) is LSTMLM and loaded.config == model.config
    assert loaded.head.weight is loaded.embed.weight  # tied again
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_bad_calls_are_refused_before_anything_changes():
    model = LSTMLM(LSTMConfig(n_token=7, n_layer=1, d_model=4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(7, (2, 3))
    for call, message in [
        (lambda: model(ids, mems=[torch.zeros(3, 1, 4)] * 2), "expected \\(2, 1, 4\\)"),
        (lambda: model(ids, mems=torch.zeros(2, 1, 4)), "mems must be None or a list of 2 tensors"),
        (lambda: model(ids, targets=ids[:, :2]), "shape"),
        (lambda: model(ids, cache=object()), "cache must be None, or model.new_cache"),
    ]:
        with pytest.raises((ValueError, TypeError), match=message):
            call()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    for bad in [dict(n_layer=0), dict(dropout=-0.1), dict(tie_weight=1), dict(n_token=2.0)]:
        with pytest.raises((ValueError, TypeError)):
            LSTMConfig(**bad)
