"""RECL (Transformer-XL, Appendix C) on loss tables whose answer is known by construction."""
import pytest
import torch

from txl_lib.model import TXLConfig, TransformerXL
from txl_lib.recl import losses_at_contexts, recl, relative_gain

CONTEXTS = [10, 20, 30, 40, 50, 60]


def improving(up_to, n=500, step=0.2, seed=0):
    "Losses (C, n) that fall by `step` per context step up to `up_to`, flat after, with per-token noise."
    base = 3 + torch.rand(n, generator=torch.Generator().manual_seed(seed))
    return torch.stack([base - step * CONTEXTS.index(min(c, up_to)) for c in CONTEXTS])


@pytest.mark.parametrize("up_to", CONTEXTS)
def test_a_model_alone_stops_where_its_loss_stops_falling(up_to):
    assert recl({"m": improving(up_to)}, CONTEXTS)["m"] == up_to


def test_a_group_scores_each_model_against_the_best_at_the_shorter_context():
    group = {"a": improving(40), "b": improving(20), "c": improving(10) + 1}
    assert recl(group, CONTEXTS) == {"a": 40, "b": 20, "c": 10}


def test_threshold_and_ratio():
    losses = improving(60, step=0.02)                        # gains of about 0.6 % per step
    assert recl({"m": losses}, CONTEXTS, threshold=0.01)["m"] == 10
    assert recl({"m": losses}, CONTEXTS, threshold=0.005)["m"] == 60
    assert relative_gain(torch.tensor([4.0, 1.0]), torch.tensor([2.0, 1.0]), r=0.5) == pytest.approx(0.5)
    assert relative_gain(torch.tensor([4.0, 1.0]), torch.tensor([2.0, 1.0]), r=1.0) == pytest.approx(0.4)


def test_bad_tables_are_refused():
    with pytest.raises(ValueError, match="len\\(contexts\\)"):
        recl({"a": torch.zeros(5, 3)}, CONTEXTS)
    with pytest.raises(ValueError, match="r must be in"):
        relative_gain(torch.ones(3), torch.ones(3), r=0)


def test_losses_at_contexts_gives_each_token_exactly_c_tokens_before_it():
    torch.manual_seed(0)
    model = TransformerXL(TXLConfig(n_token=20, d_model=16, n_head=2, d_head=8, mem_len=100)).eval()
    stream = torch.randint(20, (60,))
    losses = losses_at_contexts(model, stream, [4, 9], tgt_len=4, n_tokens=5)
    for k, c in enumerate([4, 9]):
        for i, t in enumerate(range(9, 14)):                 # the scored positions start at max(contexts)
            with torch.no_grad():
                logits = model(stream[None, t - c:t]).logits[0, -1]   # memory covers all: one forward over c tokens
            expected = torch.nn.functional.cross_entropy(logits[None], stream[t:t + 1])
            torch.testing.assert_close(losses[k, i], expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="at least"):
        losses_at_contexts(model, stream[:10], [4, 9], tgt_len=4, n_tokens=5)
