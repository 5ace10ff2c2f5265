"""Bad input at every public entry point: one clear error, and no state changed (model, memories,
files)."""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings, strategies as st

from txl_lib.bench import check_same_function
from txl_lib.convert import from_original
from txl_lib.data import IGNORE, CharVocab, batchify, load_corpus, recall_task
from txl_lib.cache import InferenceCache
from txl_lib.model import TXLConfig, TransformerXL
from txl_lib.serialization import save_checkpoint
from loading import load_checkpoint
from txl_lib.serialization import save_checksummed
from txl_lib.positions import relative_positions
from txl_lib.knn import KNNConfig
from txl_lib.lstm import LSTMConfig
from txl_lib.training import evaluate, stream_documents, train, with_config
from txl_lib.vanilla import VanillaTransformerLM

CONFIG = dict(n_token=20, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, mem_len=6)


@pytest.fixture
def env(tmp_path):
    torch.manual_seed(0)
    model = TransformerXL(TXLConfig(**CONFIG)).eval()
    ids = torch.randint(20, (2, 5))
    with torch.no_grad():
        mems = model(ids).mems
    checkpoint = save_checkpoint(tmp_path / "model.pt", model, step=3)
    return SimpleNamespace(model=model, ids=ids, mems=mems, checkpoint=checkpoint, tmp=tmp_path)


def config(**changes):
    return TXLConfig(**{**CONFIG, **changes})


def resave(e, payload_change):
    """A copy of the checkpoint with its payload changed, saved next to it with its checksum
    recomputed: a consistent file, wrong only in what was changed."""
    payload = torch.load(e.checkpoint, weights_only=True)
    payload_change(payload)
    return save_checksummed(
        e.tmp / "changed.pt", {k: payload[k] for k in ("config", "model", "step")}
    )


def stale_cache_call(e):
    cache = InferenceCache(2)
    with torch.inference_mode():
        first = e.model(e.ids, cache=cache)
        e.model(e.ids, mems=first.mems, cache=cache)
        e.model(e.ids, mems=first.mems, cache=cache)  # first.mems is no longer the cache's memory


def original_state():
    "A state dict with the original code's names (through the HuggingFace port, as chapter 06a)."
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

    torch.manual_seed(0)
    port = TransfoXLLMHeadModel(
        TransfoXLConfig(
            vocab_size=20,
            cutoffs=[],
            div_val=1,
            d_model=16,
            d_embed=16,
            n_head=2,
            d_head=8,
            d_inner=32,
            n_layer=2,
            untie_r=False,
        )
    )
    return {k.removeprefix("transformer."): v for k, v in port.state_dict().items()}


def grow(ids, n):
    return torch.cat([ids] * n, 1)


# (name, call, exception, fragment of the message)
CASES = [
    # TransformerXL.forward: token ids
    ("float ids", lambda e: e.model(e.ids.float()), TypeError, "integer token ids"),
    ("int16 ids", lambda e: e.model(e.ids.short()), TypeError, "torch.long or torch.int"),
    ("ids not a tensor", lambda e: e.model(e.ids.tolist()), TypeError, "must be a torch.Tensor"),
    (
        "id = n_token",
        lambda e: e.model(torch.full((2, 3), 20)),
        ValueError,
        "outside the vocabulary [0, 20)",
    ),
    (
        "negative id",
        lambda e: e.model(torch.full((2, 3), -1)),
        ValueError,
        "outside the vocabulary",
    ),
    ("1-D ids", lambda e: e.model(e.ids[0]), ValueError, "expected (>=1, >=1)"),
    ("3-D ids", lambda e: e.model(e.ids[None]), ValueError, "expected (>=1, >=1)"),
    ("empty segment", lambda e: e.model(e.ids[:, :0]), ValueError, "expected (>=1, >=1)"),
    # TransformerXL.forward: memories
    ("mems of 1 layer", lambda e: e.model(e.ids, mems=e.mems[:1]), ValueError, "list of 2 tensors"),
    ("mems a tensor", lambda e: e.model(e.ids, mems=e.mems[0]), ValueError, "list of 2 tensors"),
    (
        "mems wrong batch",
        lambda e: e.model(e.ids[:1], mems=e.mems),
        ValueError,
        "expected (1, 0..6, 16)",
    ),
    (
        "mems wrong width",
        lambda e: e.model(e.ids, mems=[m[..., :8] for m in e.mems]),
        ValueError,
        "expected (2, 0..6, 16)",
    ),
    (
        "mems float64",
        lambda e: e.model(e.ids, mems=[m.double() for m in e.mems]),
        ValueError,
        "torch.float64",
    ),
    (
        "mems uneven M",
        lambda e: e.model(e.ids, mems=[e.mems[0], e.mems[1][:, 1:]]),
        ValueError,
        "one shape in every layer",
    ),
    (
        "mems longer than mem_len",
        lambda e: e.model(e.ids, mems=[grow(m, 2) for m in e.mems]),
        ValueError,
        "expected (2, 0..6, 16)",
    ),
    (
        "mems element not a tensor",
        lambda e: e.model(e.ids, mems=[e.mems[0], None]),
        TypeError,
        "mems[1]",
    ),
    # TransformerXL.forward: targets
    (
        "targets wrong shape",
        lambda e: e.model(e.ids, targets=e.ids[:, 1:]),
        ValueError,
        "targets has shape (2, 4), expected (2, 5)",
    ),
    ("targets out of range", lambda e: e.model(e.ids, targets=e.ids + 20), ValueError, "IGNORE"),
    (
        "targets float",
        lambda e: e.model(e.ids, targets=e.ids.float()),
        TypeError,
        "targets must hold integer",
    ),
    # the inference cache
    (
        "cache with gradients on",
        lambda e: e.model(e.ids, cache=InferenceCache(2)),
        RuntimeError,
        "eval mode and torch.inference_mode()",
    ),
    ("cache with a stale memory", stale_cache_call, ValueError, "mems of its previous call"),
    # TXLConfig
    (
        "negative mem_len",
        lambda e: config(mem_len=-1),
        ValueError,
        "mem_len must be an int >= 0, got -1",
    ),
    ("float mem_len", lambda e: config(mem_len=4.0), ValueError, "mem_len must be an int"),
    ("negative clamp_len", lambda e: config(clamp_len=-2), ValueError, "clamp_len"),
    ("tgt_len 0", lambda e: config(tgt_len=0), ValueError, "tgt_len must be an int >= 1, got 0"),
    ("dropout 1", lambda e: config(dropout=1.0), ValueError, "dropout must be a float in [0, 1)"),
    ("negative dropatt", lambda e: config(dropatt=-0.1), ValueError, "dropatt"),
    ("odd d_model", lambda e: config(d_model=15), ValueError, "d_model must be even"),
    ("no heads", lambda e: config(n_head=0), ValueError, "n_head"),
    ("string flag", lambda e: config(same_length="yes"), TypeError, "same_length must be a bool"),
    # generate
    (
        "negative temperature",
        lambda e: e.model.generate(e.ids, 3, temperature=-1),
        ValueError,
        "temperature",
    ),
    ("top_k 0", lambda e: e.model.generate(e.ids, 3, top_k=0), ValueError, "top_k"),
    (
        "top_k above vocabulary",
        lambda e: e.model.generate(e.ids, 3, top_k=21),
        ValueError,
        "top_k must be an int in [1, 20]",
    ),
    (
        "negative max_new_tokens",
        lambda e: e.model.generate(e.ids, -1),
        ValueError,
        "max_new_tokens",
    ),
    ("float prompt", lambda e: e.model.generate(e.ids.float(), 3), TypeError, "input_ids"),
    (
        "do_sample not a bool",
        lambda e: e.model.generate(e.ids, 3, do_sample=1),
        TypeError,
        "do_sample must be True (sample) or False (greedy)",
    ),
    ("top_p 0", lambda e: e.model.generate(e.ids, 3, top_p=0), ValueError, "top_p"),
    ("top_p above 1", lambda e: e.model.generate(e.ids, 3, top_p=1.5), ValueError, "(0, 1]"),
    (
        "an unknown sampling option",
        lambda e: e.model.generate(e.ids, 3, top_q=0.5),
        TypeError,
        "top_q",
    ),
    # building blocks: inner calls (update_memory, relative_positions, rel_shift) check nothing:
    # their callers do; a function of the user's own still fails where its input cannot make sense
    (
        "relative_positions odd E",
        lambda e: relative_positions(4, 15),
        ValueError,
        "d_model must be an even",
    ),
    # data
    (
        "missing corpus",
        lambda e: load_corpus(str(e.tmp / "nope.txt")),
        FileNotFoundError,
        "neither 'shakespeare'",
    ),
    ("batchify too many rows", lambda e: batchify(torch.arange(5), 6), ValueError, "batch_size"),
    (
        "unknown character",
        lambda e: CharVocab("abc").encode("abd"),
        ValueError,
        "not in the vocabulary",
    ),
    ("recall distance", lambda e: recall_task(4, 1), ValueError, "distance"),
    # training and evaluation
    (
        "lr 0",
        lambda e: train(e.model, stream_documents(e.ids), 1, 4, lr=0),
        ValueError,
        "lr must be a finite number > 0",
    ),
    ("steps 0", lambda e: train(e.model, stream_documents(e.ids), 0, 4), ValueError, "steps"),
    (
        "eval_every alone",
        lambda e: train(e.model, stream_documents(e.ids), 1, 4, eval_every=2),
        ValueError,
        "eval_every >= 1 and an evaluator",
    ),
    (
        "an evaluator without eval_every",
        lambda e: train(e.model, stream_documents(e.ids), 1, 4, evaluator=lambda m, s: 0.0),
        ValueError,
        "eval_every >= 1 and an evaluator",
    ),
    ("evaluate tgt_len 0", lambda e: evaluate(e.model, e.ids, e.ids, 0), ValueError, "tgt_len"),
    (
        "evaluate with every target IGNORE",
        lambda e: evaluate(e.model, e.ids, torch.full_like(e.ids, IGNORE), 2),
        ValueError,
        "nothing to score",
    ),
    (
        "generate with an int for a generator",
        lambda e: e.model.generate(e.ids, 2, generator=42),
        TypeError,
        "generator must be None or a torch.Generator",
    ),
    (
        "with_config of a vanilla model",
        lambda e: with_config(VanillaTransformerLM(20, 1, 2, 16, 32), mem_len=3),
        TypeError,
        "no config field mem_len",
    ),
    # checkpoints
    (
        "missing checkpoint",
        lambda e: load_checkpoint(e.tmp / "none.pt"),
        FileNotFoundError,
        "no file at",
    ),
    (
        "truncated checkpoint",
        lambda e: load_checkpoint(
            (e.tmp / "cut.pt").write_bytes(e.checkpoint.read_bytes()[:200]) and e.tmp / "cut.pt"
        ),
        ValueError,
        "is corrupt or truncated, or not a torch file",
    ),
    (
        "text file as checkpoint",
        lambda e: load_checkpoint((e.tmp / "a.txt").write_text("hello") and e.tmp / "a.txt"),
        ValueError,
        "is corrupt or truncated, or not a torch file",
    ),
    (
        "torch file, not a checkpoint",
        lambda e: load_checkpoint(
            torch.save({"weights": 1}, e.tmp / "other.pt") or e.tmp / "other.pt"
        ),
        ValueError,
        "not a txl_lib checkpoint",
    ),
    (
        "checkpoint of another config",
        lambda e: load_checkpoint(e.checkpoint, expected=config(mem_len=8)),
        ValueError,
        "another config",
    ),
    (
        "weights not fitting their config",
        lambda e: load_checkpoint(resave(e, lambda p: p["config"].update(d_inner=64))),
        ValueError,
        "do not fit the config: shapes",
    ),
    (
        "unknown config key",
        lambda e: load_checkpoint(resave(e, lambda p: p["config"].update(colour=1))),
        ValueError,
        "does not have: ['colour']",
    ),
    (
        "save with a bad step",
        lambda e: save_checkpoint(e.checkpoint, e.model, step=-1),
        ValueError,
        "step",
    ),
    (
        "save into a missing folder",
        lambda e: save_checkpoint(e.tmp / "no" / "m.pt", e.model),
        FileNotFoundError,
        "does not exist",
    ),
    (
        "save a non-model",
        lambda e: save_checkpoint(e.checkpoint, torch.nn.Linear(2, 2)),
        TypeError,
        "a txl_lib model (with a config)",
    ),
    # converters
    (
        "original: unknown key",
        lambda e: from_original({**original_state(), "layers.0.extra": torch.zeros(1)}, config()),
        ValueError,
        "does not know",
    ),
    (
        "original: wrong config",
        lambda e: from_original(original_state(), config(d_inner=64)),
        ValueError,
        "do not fit the config: shapes",
    ),
    (
        "original: missing key",
        lambda e: from_original(
            {k: v for k, v in original_state().items() if "o_net" not in k}, config()
        ),
        ValueError,
        "missing",
    ),
    # the benchmark's check
    (
        "benchmark L below T",
        lambda e: check_same_function(e.model, e.ids, 2, 4),
        ValueError,
        "need T < L",
    ),
]


def snapshot(e):
    return (
        {k: v.clone() for k, v in e.model.state_dict().items()},
        [m.clone() for m in e.mems],
        e.checkpoint.read_bytes(),
        sorted(p.name for p in e.tmp.iterdir()),
    )


@pytest.mark.parametrize("name, call, error, fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_clearly_and_changes_nothing(env, name, call, error, fragment):
    params, mems, checkpoint, files = snapshot(env)
    with pytest.raises(error) as caught:
        call(env)
    assert fragment in str(caught.value), f"{name}: message {caught.value!s} lacks {fragment!r}"
    assert all(torch.equal(params[k], v) for k, v in env.model.state_dict().items())
    assert all(torch.equal(a, b) for a, b in zip(mems, env.mems))
    assert env.checkpoint.read_bytes() == checkpoint
    leftovers = (
        {p.name for p in env.tmp.iterdir()}
        - set(files)
        - {"cut.pt", "a.txt", "other.pt", "changed.pt"}
    )
    assert not leftovers, f"{name} left files behind: {leftovers}"


def test_there_are_at_least_30_cases():
    assert len(CASES) >= 30


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    B=st.integers(1, 3),
    T=st.integers(1, 6),
    M=st.integers(0, 6),
    pre=st.booleans(),
    same=st.booleans(),
    mem_len=st.integers(0, 7),
)
def test_valid_shapes_give_documented_shapes(B, T, M, pre, same, mem_len):
    torch.manual_seed(0)
    model = TransformerXL(config(pre_lnorm=pre, same_length=same, mem_len=mem_len)).eval()
    M = min(M, mem_len)
    mems = None if M == 0 else [torch.randn(B, M, 16) for _ in range(2)]
    with torch.no_grad():
        out = model(torch.randint(20, (B, T)), mems=mems, targets=torch.randint(20, (B, T)))
    assert out.logits.shape == (B, T, 20) and out.losses.shape == (B, T)
    assert [tuple(m.shape) for m in out.mems] == [(B, min(mem_len, M + T), 16)] * 2
    assert torch.isfinite(out.logits).all()


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    shape=st.lists(st.integers(0, 4), min_size=0, max_size=4),
    dtype=st.sampled_from(
        [torch.int64, torch.int32, torch.int16, torch.uint8, torch.float32, torch.bool]
    ),
    low=st.integers(-3, 25),
    n_mems=st.sampled_from([None, 0, 1, 2, 3]),
    width=st.sampled_from([8, 16]),
)
def test_random_inputs_give_a_result_or_a_clean_error(shape, dtype, low, n_mems, width):
    torch.manual_seed(0)
    model = TransformerXL(config()).eval()
    ids = torch.full(shape, low).to(dtype)
    B = shape[0] if shape else 1
    mems = None if n_mems is None else [torch.randn(B, 2, width) for _ in range(n_mems)]
    try:
        with torch.no_grad():
            out = model(ids, mems=mems)
    except (ValueError, TypeError) as e:
        assert len(str(e)) > 20  # a sentence, not a bare index
        return
    assert out.logits.shape == (*ids.shape, 20)


@pytest.mark.parametrize(
    "config_class, field",
    [
        (TXLConfig, f)
        for f in (
            "n_token",
            "n_layer",
            "n_head",
            "d_model",
            "d_head",
            "d_inner",
            "tgt_len",
            "mem_len",
            "clamp_len",
        )
    ]
    + [(KNNConfig, "knn_capacity"), (KNNConfig, "knn_top_k"), (LSTMConfig, "d_model")],
)
def test_a_huge_integer_field_is_refused_naming_the_field_and_the_bound(config_class, field):
    """Issue 31: 2**64 once passed the checks and crashed inside torch; every integer field has an
    upper bound."""
    with pytest.raises(
        ValueError, match=rf"^{field} must be an int in \[\d+, [\d,]+\], got {2**64}$"
    ):
        config_class(**{"n_token": 20, field: 2**64})
