"""Low precision: forward under torch.autocast (bfloat16 on CPU) is finite and close to float32."""

import pytest
import torch

from txl_lib.cache import InferenceCache
from txl_lib.model import TXLConfig, TransformerXL

TOLERANCE = 0.05  # max |log-probability difference| to float32, bfloat16 having 8 bits of mantissa


def run_segments(model, seq, T, autocast, cache=None):
    logprobs, mems = [], None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), torch.inference_mode():
        for segment in seq.split(T, dim=1):
            out = model(segment, mems=mems, cache=cache)
            logprobs.append(out.logits.float().log_softmax(-1))
            mems = out.mems
    return torch.cat(logprobs, 1), mems


@pytest.mark.parametrize(
    "options",
    [
        dict(mem_len=8),
        dict(mem_len=0),
        dict(mem_len=0, same_length=True),
        dict(mem_len=5, same_length=True),
        dict(mem_len=8, pre_lnorm=True, untie_r=True),
        dict(mem_len=3, clamp_len=2),
    ],
)
def test_bfloat16_autocast_is_finite_and_close_to_float32(options):
    torch.manual_seed(0)
    model = TransformerXL(
        TXLConfig(n_token=40, d_model=32, n_head=4, d_head=8, d_inner=64, **options)
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    seq = torch.randint(40, (2, 24))
    full, _ = run_segments(model, seq, 6, autocast=False)
    low, mems = run_segments(model, seq, 6, autocast=True)
    assert torch.isfinite(low).all() and all(torch.isfinite(m).all() for m in mems)
    by_token, _ = run_segments(model, seq, 1, autocast=False)
    cached, _ = run_segments(
        model, seq, 1, autocast=True, cache=InferenceCache(model.config.n_layer)
    )
    assert torch.isfinite(cached).all()
    assert (low - full).abs().max() < TOLERANCE and (cached - by_token).abs().max() < TOLERANCE


def test_a_bfloat16_model_generates():
    torch.manual_seed(0)
    model = TransformerXL(TXLConfig(n_token=40, d_model=32, n_head=4, d_head=8, mem_len=8)).to(
        torch.bfloat16
    )
    out = model.generate(torch.randint(40, (2, 3)), 10, temperature=0)
    assert out.shape == (2, 13) and ((out >= 0) & (out < 40)).all()
