"""The full model: parity with the HuggingFace port of the original code, memory equivalences,
parameter count."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from txl_lib.convert import from_hf, from_original
from txl_lib.model import TXLConfig, TransformerXL
from txl_lib.serialization import save_checkpoint
from loading import load_checkpoint
from txl_lib import build_model, AdaptiveConfig, KNNConfig, VariantConfig
from txl_lib import from_pretrained
from txl_lib.data import IGNORE, mean_loss, token_loss
from txl_lib.training import evaluate, with_config
from txl_lib.vanilla import VanillaTransformerLM

warnings.filterwarnings("ignore", message="IProgress not found")
from transformers import TransfoXLConfig, TransfoXLLMHeadModel  # noqa: E402


def random_port(seed, vocab_size=41, **options):
    torch.manual_seed(seed)
    config = TransfoXLConfig(
        vocab_size=vocab_size,
        cutoffs=[],
        div_val=1,
        d_model=12,
        d_embed=12,
        n_head=3,
        d_head=5,
        d_inner=20,
        n_layer=2,
        dropout=0.0,
        dropatt=0.0,
        **options,
    )
    port = TransfoXLLMHeadModel(config).eval()
    with torch.no_grad():
        for p in port.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return port


@pytest.mark.parametrize(
    "options",
    [
        dict(untie_r=True, same_length=False, clamp_len=0, pre_lnorm=False, mem_len=7),
        dict(untie_r=False, same_length=False, clamp_len=0, pre_lnorm=False, mem_len=3),
        dict(untie_r=True, same_length=True, clamp_len=0, pre_lnorm=False, mem_len=10),
        dict(untie_r=False, same_length=True, clamp_len=2, pre_lnorm=True, mem_len=5),
        dict(untie_r=True, same_length=False, clamp_len=4, pre_lnorm=True, mem_len=12),
        dict(untie_r=True, same_length=True, clamp_len=1, pre_lnorm=False, mem_len=2),
    ],
)
@pytest.mark.parametrize("B, T", [(1, 5), (3, 4)])
def test_parity_with_the_huggingface_port(options, B, T):
    port = random_port(hash((B, T)) % 1000, **options)
    ours = from_hf(port).eval()
    x = torch.randint(41, (B, 3 * T), generator=torch.Generator().manual_seed(B + T))
    port_mems = [torch.empty(0, B, 12)] * 2  # the original starts from an empty memory
    our_mems = None
    with torch.no_grad():
        for segment in x.split(T, dim=1):
            theirs, mine = port(segment, mems=port_mems), ours(segment, mems=our_mems)
            torch.testing.assert_close(
                mine.logits.log_softmax(-1), theirs.prediction_scores, atol=1e-5, rtol=0
            )
            for m, t in zip(mine.mems, theirs.mems):
                torch.testing.assert_close(m, t.transpose(0, 1), atol=1e-5, rtol=0)
            port_mems, our_mems = theirs.mems, mine.mems


def test_converter_refuses_what_does_not_fit():
    state = {
        k.removeprefix("transformer."): v for k, v in random_port(0, mem_len=4).state_dict().items()
    }
    with pytest.raises(ValueError, match="do not fit the config: shapes"):
        from_original(
            state, TXLConfig(n_token=41, n_layer=2, n_head=3, d_model=12, d_head=5, d_inner=20)
        )
    with pytest.raises(ValueError, match="missing"):
        from_original(
            state,
            TXLConfig(
                n_token=41, n_layer=3, n_head=3, d_model=12, d_head=5, d_inner=20, untie_r=True
            ),
        )
    with pytest.raises(ValueError, match="dec_attn.extra"):
        from_original({**state, "layers.0.dec_attn.extra": torch.zeros(1)}, TXLConfig(n_token=41))


@pytest.mark.parametrize(
    "config",
    [
        TXLConfig(n_token=30, n_layer=3, d_model=16, n_head=2, d_head=8, d_inner=24, mem_len=100),
        TXLConfig(
            n_token=30,
            n_layer=2,
            d_model=16,
            n_head=2,
            d_head=8,
            d_inner=24,
            mem_len=100,
            pre_lnorm=True,
            untie_r=True,
            clamp_len=5,
        ),
    ],
)
def test_memory_equals_one_long_forward(config):
    torch.manual_seed(0)
    model = TransformerXL(config).eval()
    seq = torch.randint(30, (2, 21))
    with torch.no_grad():
        whole = model(seq).logits
        for chunk in (7, 1, 5):
            pieces, mems = [], None
            for segment in seq.split(chunk, dim=1):
                out = model(segment, mems=mems)
                pieces.append(out.logits)
                mems = out.mems
            torch.testing.assert_close(torch.cat(pieces, 1), whole, atol=1e-5, rtol=1e-5)


def test_evaluate_with_its_own_memory_length_equals_one_long_forward():
    torch.manual_seed(0)
    model = TransformerXL(TXLConfig(n_token=30, d_model=16, n_head=2, d_head=8, mem_len=4)).eval()
    seq = torch.randint(30, (2, 25))
    x, y = seq[:, :-1], seq[:, 1:]
    with torch.no_grad():
        for p in model.parameters():  # larger weights: the far context matters
            p.add_(0.3 * torch.randn_like(p))
        whole = token_loss(model(x).logits, y)  # every target sees its whole prefix
    short = evaluate(model, x, y, tgt_len=6)  # the model's own memory of 4 forgets
    long = evaluate(model, x, y, tgt_len=6, mem_len=24)  # a memory holding the whole history
    torch.testing.assert_close(long.losses, whole, atol=1e-5, rtol=1e-5)
    assert (short.losses - whole).abs().max() > 1e-2
    assert model.config.mem_len == 4


def test_with_config_shares_the_weights_edits_nothing_and_refuses_bad_values():
    model = TransformerXL(TXLConfig(n_token=30, d_model=16, n_head=2, d_head=8, mem_len=4))
    view = with_config(model, mem_len=9)
    assert view.config.mem_len == 9 and model.config.mem_len == 4
    assert view.u is model.u and view.layers is model.layers  # the same weights, not a copy
    assert with_config(model, mem_len=None) is model
    with pytest.raises(ValueError, match="mem_len"):
        with_config(model, mem_len=-1)
    with pytest.raises(TypeError, match="no config field mem_len"):
        with_config(torch.nn.Linear(2, 2), mem_len=3)
    assert model.config.mem_len == 4


def test_init_mems_is_the_empty_memory():
    torch.manual_seed(0)
    model = TransformerXL(TXLConfig(n_token=30, d_model=16, n_head=2, d_head=8, mem_len=5)).eval()
    seq = torch.randint(30, (3, 4))
    explicit, implicit = model(seq, mems=model.init_mems(3)), model(seq)
    assert torch.equal(explicit.logits, implicit.logits)
    assert all(torch.equal(a, b) for a, b in zip(explicit.mems, implicit.mems))
    assert [tuple(m.shape) for m in model.init_mems(3)] == [(3, 0, 16), (3, 0, 16)]


def test_no_gradient_reaches_the_memory():
    torch.manual_seed(0)
    model = TransformerXL(TXLConfig(n_token=30, d_model=16, n_head=2, d_head=8, mem_len=6))
    first = model(torch.randint(30, (2, 6)))
    assert all(not m.requires_grad and m.grad_fn is None for m in first.mems)
    second = model(torch.randint(30, (2, 6)), mems=first.mems)
    second.logits.sum().backward()
    assert all(m.grad is None for m in first.mems)


def test_generate_with_memory_equals_recomputing_the_prefix():
    torch.manual_seed(0)
    model = TransformerXL(TXLConfig(n_token=30, d_model=16, n_head=2, d_head=8, mem_len=64)).eval()
    prompt = torch.randint(30, (3, 5))
    fast = model.generate(prompt, 10, temperature=0)
    slow = prompt
    with torch.no_grad():
        for _ in range(10):
            slow = torch.cat([slow, model(slow).logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(fast, slow)


def test_enwik8_base_has_41_1_million_parameters():
    with torch.device("meta"):
        model = TransformerXL(TXLConfig.enwik8_base())
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == 41.1


def test_checkpoint_round_trip_and_bad_files(tmp_path):
    from loading import load_checkpoint
    from txl_lib.serialization import save_checkpoint

    torch.manual_seed(0)
    model = TransformerXL(TXLConfig(n_token=30, d_model=16, n_head=2, d_head=8, untie_r=True))
    path = save_checkpoint(tmp_path / "m.pt", model, step=12)
    loaded, step = load_checkpoint(path)
    assert step == 12 and loaded.config == model.config
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values())
    )
    assert [p.name for p in tmp_path.iterdir()] == ["m.pt"]  # no temporary file left behind
    good = path.read_bytes()
    (tmp_path / "cut.pt").write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match="is corrupt or truncated, or not a torch file"):
        load_checkpoint(tmp_path / "cut.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a txl_lib checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")


def test_reference_run_of_chapter_06_loads_strictly_and_fits_its_budget():
    """Every model of reference/06_model loads strictly into the model its log describes; the files
    stay under 4 MB."""
    import json
    from pathlib import Path
    from safetensors.torch import load_file
    from txl_lib.vanilla import VanillaTransformerLM

    folder = Path(__file__).parents[1] / "reference" / "06_model"
    log = json.loads((folder / "training_log.json").read_text())
    weights = load_file(folder / "models.safetensors")
    assert sum(f.stat().st_size for f in folder.iterdir()) <= 4 * 2**20
    builders = {
        "sort": lambda: TransformerXL(TXLConfig(**log["sort"]["config"])),
        "shakespeare xl": lambda: TransformerXL(TXLConfig(**log["shakespeare"]["xl_config"])),
        "shakespeare vanilla": lambda: VanillaTransformerLM(
            len(log["shakespeare"]["vocab"]), **log["shakespeare"]["vanilla"]
        ),
    }
    assert sorted(log["models"]) == sorted(
        f"{group}/seed {s}" for group in builders for s in log["seeds"]
    )
    for key in log["models"]:
        prefix = key + "/"
        builders[key.split("/")[0]]().load_state_dict(
            {k.removeprefix(prefix): v for k, v in weights.items() if k.startswith(prefix)}
        )
    assert all(
        any(k.startswith(key + "/") for key in log["models"]) for k in weights
    )  # nothing unaccounted for


SIZES = dict(n_token=23, d_model=16, d_head=8, n_head=2, d_inner=32, mem_len=4)  # every kind below
MODEL_KINDS = {
    "vanilla": lambda: VanillaTransformerLM(23, n_layer=2, n_head=2, d_model=16, d_inner=32),
    "transformer-xl": lambda: build_model(TXLConfig(**SIZES)),
    "adaptive": lambda: build_model(AdaptiveConfig(**SIZES, cutoffs=(8, 15), div_val=2)),
    "knn": lambda: build_model(KNNConfig(**SIZES, knn_layer=1, knn_capacity=16, knn_top_k=4)),
    **{
        f"attn_type {t}": lambda t=t: build_model(VariantConfig(**SIZES, attn_type=t))
        for t in (1, 2, 3)
    },
}


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_every_model_gives_the_mean_loss_to_train_on(kind):
    torch.manual_seed(0)
    model = MODEL_KINDS[kind]().eval()
    x = torch.randint(23, (3, 6))
    targets = torch.randint(23, (3, 6))
    targets[0, :4], targets[2, 5] = IGNORE, IGNORE  # 5 of 18 targets not scored
    assert model(x).loss is None and model(x).losses is None
    out = model(x, targets=targets)
    assert out.loss.shape == () and out.loss.requires_grad
    torch.testing.assert_close(out.loss, mean_loss(out.losses, targets), atol=0, rtol=0)
    # independently: the log-probabilities of the targets, by hand, averaged over the 13 scored ones
    log_probs = model(x).logits.log_softmax(-1)  # adaptive: already log-probabilities
    scored = targets != IGNORE
    by_hand = -log_probs[scored].gather(1, targets[scored][:, None]).sum() / 13
    torch.testing.assert_close(out.loss, by_hand, atol=1e-5, rtol=1e-5)
    if out.logits is not None:  # PyTorch's mean over non-ignored targets
        torch.testing.assert_close(
            out.loss, F.cross_entropy(out.logits.flatten(0, 1), targets.flatten())
        )
    params = [
        p for p in model.parameters() if p.requires_grad
    ]  # the scalar a user trains on: its gradient
    grads = torch.autograd.grad(out.loss, params, allow_unused=True, retain_graph=True)
    expected = torch.autograd.grad(by_hand, params, allow_unused=True)
    for g, e in zip(grads, expected):
        assert (g is None) == (e is None) and (
            g is None or torch.allclose(g, e, atol=1e-6, rtol=1e-4)
        )
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    # nothing to score: the mean of nothing is NaN, as PyTorch's own mean over ignored targets
    nothing = model(x, targets=torch.full_like(targets, IGNORE))
    none_scored = F.cross_entropy(torch.zeros(18, 23), torch.full((18,), IGNORE))
    assert none_scored.isnan() and nothing.loss.isnan() and not nothing.losses.any()


def step_gradients_and_saved_bytes(model, checkpointed, tokens, seed=3):
    """Every parameter's gradient after a two-segment training step, and the bytes of the
    activations saved for it."""
    from txl_lib.bench_steps import saved_tensor_bytes

    model.zero_grad()
    model.checkpoint_activations = checkpointed
    torch.manual_seed(seed)  # the same dropout masks in both runs

    def step():
        out = model(tokens[:, :8])
        model(tokens[:, 8:16], mems=out.mems, targets=tokens[:, 9:17]).loss.backward()

    _, saved = saved_tensor_bytes(step, model.parameters())
    return {
        name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None
    }, saved


@pytest.mark.parametrize(
    "config",
    [
        TXLConfig.tiny(n_token=50, dropout=0.1, dropatt=0.1, untie_r=True),
        TXLConfig.tiny(n_token=50, dropout=0.1, pre_lnorm=True, same_length=True),
        VariantConfig.tiny(n_token=50, attn_type=1, dropout=0.1),
        VariantConfig.tiny(n_token=50, attn_type=2, dropout=0.1),
        VariantConfig.tiny(n_token=50, attn_type=3, dropout=0.1),
        AdaptiveConfig.tiny(n_token=50, cutoffs=[10, 30], div_val=2, dropout=0.1),
    ],
    ids=["type0-untied", "type0-prelnorm-samelength", "type1", "type2", "type3", "adaptive"],
)
def test_checkpointed_layers_give_the_same_gradients_and_keep_fewer_activations(config):
    model = build_model(config).train()
    tokens = torch.randint(50, (2, 17), generator=torch.Generator().manual_seed(0))
    kept, kept_bytes = step_gradients_and_saved_bytes(model, False, tokens)
    recomputed, recomputed_bytes = step_gradients_and_saved_bytes(model, True, tokens)
    assert kept.keys() == recomputed.keys() and len(kept) > 10
    for name in kept:  # recomputation with the replayed RNG: the same numbers
        torch.testing.assert_close(recomputed[name], kept[name], atol=1e-6, rtol=0, msg=name)
    assert (
        recomputed_bytes < 0.3 * kept_bytes
    )  # the option took effect (0.10-0.18 here): inputs only


def test_checkpoint_activations_is_refused_where_it_cannot_hold():
    knn = build_model(KNNConfig.tiny(n_token=50, knn_layer=1))
    knn.checkpoint_activations = True
    with pytest.raises(ValueError, match="its store changes in forward"):
        knn(torch.zeros(1, 4, dtype=torch.long))
    for model in (
        TransformerXL(TXLConfig.tiny(n_token=50)),
        build_model(VariantConfig.tiny(n_token=50, attn_type=2)),
    ):
        model.checkpoint_activations = 1
        with pytest.raises(
            TypeError, match="checkpoint_activations must be True or False, got int"
        ):
            model(torch.zeros(1, 4, dtype=torch.long))


def test_a_port_with_another_layer_norm_epsilon_is_refused():
    "Our layer norms use 1e-5; a port with another epsilon computes another function: refused."
    port = random_port(0, layer_norm_epsilon=0.5)
    with pytest.raises(ValueError, match="HuggingFace options we do not implement.*0.5"):
        from_hf(port)


@pytest.mark.parametrize("kind", ["folder", "checkpoint"])
def test_loading_a_model_draws_none_of_the_callers_random_numbers(kind, tmp_path):
    "The random initialisation a load overwrites runs on a forked generator."
    model = TransformerXL(TXLConfig.tiny(n_token=20))
    model.save_pretrained(tmp_path / "folder")
    save_checkpoint(tmp_path / "checkpoint.pt", model, step=1)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    if kind == "folder":
        loaded = from_pretrained(tmp_path / "folder")
    else:
        loaded = load_checkpoint(tmp_path / "checkpoint.pt")[0]
    assert torch.equal(torch.rand(3), expected)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), loaded.parameters()))
