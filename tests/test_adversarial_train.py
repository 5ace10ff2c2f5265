"""Issue 17, the training loop: inputs that used to give a wrong number without a word, hang, or
crash deep in torch."""

import itertools

import pytest
import torch

from txl_lib.data import IGNORE, batchify
from txl_lib.model import TXLConfig, TransformerXL
from txl_lib.training import check_training_args, evaluate, stream_documents, train

V = 12


def small_model(seed=0):
    torch.manual_seed(seed)
    return TransformerXL(
        TXLConfig(
            n_token=V, n_layer=1, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=8, mem_len=8
        )
    )


def streams(seed=0, length=200):
    return batchify(torch.randint(V, (length,), generator=torch.Generator().manual_seed(seed)), 2)


def test_evaluate_refuses_targets_of_another_shape_than_the_inputs():
    s = streams()
    with pytest.raises(ValueError, match=r"targets \(the shape of inputs\) has shape"):
        evaluate(
            small_model(), s[:, :-1][:, :40], s[:, 1:], tgt_len=8
        )  # targets longer than inputs
    with pytest.raises(ValueError, match=r"targets \(the shape of inputs\) has shape"):
        evaluate(small_model(), s[:, :-1], s[:1, 1:], tgt_len=8)


def test_int32_ids_and_targets_give_the_int64_results():
    s = streams()
    long_eval = evaluate(small_model(), s[:, :-1], s[:, 1:], tgt_len=8)
    int_eval = evaluate(small_model(), s[:, :-1].int(), s[:, 1:].int(), tgt_len=8)
    assert torch.equal(long_eval.losses, int_eval.losses)
    a, b = small_model(), small_model()
    assert train(a, stream_documents(s), 3, 8) == train(b, stream_documents(s.int()), 3, 8)


def test_train_raises_instead_of_hanging_when_no_segment_is_scored():
    s = streams()
    nothing_scored = itertools.repeat((s[:, :-1], torch.full_like(s[:, 1:], IGNORE)))
    with pytest.raises(ValueError, match="no scored target"):
        train(small_model(), nothing_scored, steps=2, tgt_len=8)


def test_a_non_finite_loss_stops_training_before_it_reaches_the_weights():
    with pytest.raises(FloatingPointError, match="is (nan|inf) at step"):
        train(small_model(), stream_documents(streams()), steps=50, tgt_len=8, lr=1e6, warmup=0)
    model = small_model()
    with torch.no_grad():
        model.u.fill_(float("nan"))  # every loss is nan from the first step
    kept = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(FloatingPointError, match="step 1"):
        train(model, stream_documents(streams()), steps=2, tgt_len=8)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, kept[k], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("clip", [-1, 0, float("nan"), float("inf"), True])
def test_bad_clip_and_lr_are_refused(clip):
    with pytest.raises(ValueError, match="clip"):
        check_training_args(2, 8, 1e-3, None, clip)
    with pytest.raises(ValueError, match="lr"):
        check_training_args(2, 8, clip, None, 0.25)


def test_evaluate_restores_the_mode_it_found():
    model = small_model().train()
    s = streams()
    evaluate(model, s[:, :-1], s[:, 1:], tgt_len=8)
    assert model.training
    evaluate(model.eval(), s[:, :-1], s[:, 1:], tgt_len=8)
    assert not model.training


def test_train_says_when_the_documents_run_out_before_the_steps():
    """Issue 31: train() took fewer steps than asked without a word when a finite list of documents
    ran out."""
    ids = torch.randint(10, (2, 17))
    model = TransformerXL(TXLConfig.tiny(n_token=10))
    with pytest.warns(UserWarning, match="train took 2 of 5 steps: the documents ran out"):
        losses = train(model, [(ids[:, :-1], ids[:, 1:])], steps=5, tgt_len=8)
    assert len(losses) == 2
