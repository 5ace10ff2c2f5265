"""Adaptive embedding and softmax (chapter 09): parity with the HuggingFace port and the
original's semantics, checkpoint loading, parameter counts, and the model's memory
equivalence."""

import dataclasses
import warnings

import pytest
import torch

from txl_lib.pretrained import from_pretrained
from txl_lib.adaptive import (
    AdaptiveConfig,
    AdaptiveTransformerXL,
    ProjectedAdaptiveLogSoftmax,
    WordVocab,
    from_state_dict,
    model_for,
)
from txl_lib.adaptive import (
    adaptive_config_from_hf as config_from_hf,
)  # the ports here are adaptive
from txl_lib.data import IGNORE
from txl_lib.model import TXLConfig, TransformerXL
from txl_lib.serialization import save_checkpoint
from txl_lib.training import evaluate

warnings.filterwarnings("ignore", message="IProgress not found")
from transformers import TransfoXLConfig, TransfoXLLMHeadModel  # noqa: E402
from transformers.models.deprecated.transfo_xl.modeling_transfo_xl_utilities import (  # noqa: E402
    ProjectedAdaptiveLogSoftmax as HFSoftmax,
)

V = 70


def perturbed(module, seed, scale=0.3):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn_like(p))
    return module


def hf_port(seed, cutoffs=(10, 25, 45), div_val=2, d_model=16, d_embed=24, **options):
    torch.manual_seed(seed)
    config = TransfoXLConfig(
        vocab_size=V,
        cutoffs=list(cutoffs),
        div_val=div_val,
        d_model=d_model,
        d_embed=d_embed,
        n_head=2,
        d_head=8,
        d_inner=32,
        n_layer=2,
        dropout=0.0,
        dropatt=0.0,
        **{**dict(mem_len=6, clamp_len=-1, same_length=False), **options},
    )
    return perturbed(TransfoXLLMHeadModel(config).eval(), seed + 100)


def loaded(port, tmp_path, safe=True):
    port.save_pretrained(tmp_path, safe_serialization=safe)
    return from_pretrained(tmp_path)


PORTS = [
    dict(div_val=1, d_embed=16),
    dict(div_val=1, d_embed=24),
    dict(div_val=2),
    dict(div_val=4, d_embed=64),
    dict(div_val=2, cutoffs=(30,), untie_r=False, same_length=True, pre_lnorm=True, clamp_len=3),
    dict(div_val=2, proj_share_all_but_first=False, tie_word_embeddings=False, mem_len=9),
]


@pytest.mark.parametrize("options", PORTS)
def test_per_token_nll_and_log_probs_equal_the_port_over_segments_with_memory(options, tmp_path):
    port = hf_port(len(tmp_path.name) % 7, **options)
    ours = loaded(port, tmp_path)
    assert isinstance(ours, AdaptiveTransformerXL)
    B, T = 2, 5
    x = torch.randint(V, (B, 4 * T), generator=torch.Generator().manual_seed(3))
    port_mems, our_mems = [torch.empty(0, B, 16)] * 2, None
    with torch.no_grad():
        for seg in x.split(T, 1):
            theirs = port(seg, mems=port_mems)
            with_labels = port(
                seg, mems=port_mems, labels=seg
            )  # the port's own NLL code (shifts by one)
            targets = torch.cat([seg[:, 1:], torch.full((B, 1), IGNORE)], 1)
            mine, probs = ours(seg, mems=our_mems, targets=targets), ours(seg, mems=our_mems)
            assert mine.logits is None
            torch.testing.assert_close(
                probs.logits, theirs.prediction_scores, atol=1e-5, rtol=1e-6
            )  # log-probs reach -35: a few float32 ulps
            flat = seg[:, 1:].reshape(
                -1
            )  # the port returns them grouped by cluster (keep_order=False)
            edges = [0, *port.config.cutoffs, V]
            grouped = torch.cat(
                [
                    ((flat >= lo) & (flat < hi)).nonzero().squeeze(1)
                    for lo, hi in zip(edges, edges[1:])
                ]
            )
            torch.testing.assert_close(
                mine.losses[:, :-1].reshape(-1)[grouped],
                with_labels.losses.reshape(-1),
                atol=1e-5,
                rtol=0,
            )
            assert (mine.losses[:, -1] == 0).all()
            for m, t in zip(mine.mems, theirs.mems):
                torch.testing.assert_close(m, t.transpose(0, 1), atol=1e-5, rtol=0)
            port_mems, our_mems = theirs.mems, mine.mems


def test_a_pytorch_model_bin_folder_loads_too(tmp_path):
    port = hf_port(1)
    ours, x = loaded(port, tmp_path, safe=False), torch.randint(V, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(
            ours(x).logits,
            port(x, mems=[torch.empty(0, 1, 16)] * 2).prediction_scores,
            atol=1e-5,
            rtol=0,
        )


def original_nll(state, hidden, target, cutoffs, div_val):
    """The original's proj_adaptive_softmax, token by token: tail cluster i reads head log-prob
    column -i."""
    edges = [0, *cutoffs, V]
    k = next(k for k in range(len(edges) - 1) if edges[k] <= target < edges[k + 1])

    def weights(i):
        if div_val == 1:
            w, b = state["crit.out_layers.0.weight"], state["crit.out_layers.0.bias"]
            return w[edges[i] : edges[i + 1]], b[edges[i] : edges[i + 1]]
        return state[f"crit.out_layers.{i}.weight"], state[f"crit.out_layers.{i}.bias"]

    def logits(i, w, b):
        proj = state.get(f"crit.out_projs.{i}")
        return (hidden if proj is None else hidden @ proj) @ w.T + b

    w0, b0 = weights(0)
    head = logits(
        0,
        torch.cat([w0, state["crit.cluster_weight"]]),
        torch.cat([b0, state["crit.cluster_bias"]]),
    )
    head = head.log_softmax(-1)
    if k == 0:
        return -head[target]
    return -head[-k] - logits(k, *weights(k)).log_softmax(-1)[target - edges[k]]


@pytest.mark.parametrize("div_val, d_embed", [(1, 16), (1, 24), (2, 24)])
def test_an_original_state_dict_gives_the_original_formula(div_val, d_embed):
    port = hf_port(div_val, div_val=div_val, d_embed=d_embed)
    state = {
        k.removeprefix("transformer."): v for k, v in port.state_dict().items()
    }  # read as the original's
    ours = from_state_dict(state, config_from_hf(port.config), source="original")
    hidden, targets = (
        torch.randn(40, 16, generator=torch.Generator().manual_seed(0)),
        torch.arange(40) + 29,
    )
    targets[targets >= V] -= V
    expected = torch.stack(
        [original_nll(state, h, t, (10, 25, 45), div_val) for h, t in zip(hidden, targets.tolist())]
    )
    with torch.no_grad():
        torch.testing.assert_close(ours.head(hidden, targets), expected, atol=1e-5, rtol=0)
        as_hf = from_state_dict(state, config_from_hf(port.config), source="hf").head(
            hidden, targets
        )
    tail = targets >= 10
    assert (
        as_hf[tail] - expected[tail]
    ).abs().max() > 1e-2  # the order matters for tail tokens only
    torch.testing.assert_close(as_hf[~tail], expected[~tail], atol=1e-5, rtol=0)


@pytest.mark.parametrize("div_val, d_embed", [(1, 16), (2, 24)])
def test_the_softmax_alone_equals_huggingfaces(div_val, d_embed):
    theirs, _ = HFSoftmax(V, d_embed, 16, [10, 25, 45], div_val=div_val), torch.manual_seed(0)
    for p in theirs.parameters():  # alone, the port leaves its projections uninitialised
        torch.nn.init.normal_(p, 0.0, 0.3)
    ours = ProjectedAdaptiveLogSoftmax(V, d_embed, 16, (10, 25, 45), div_val)
    names = {"out_layers": "outputs", "out_projs": "projections"}
    ours.load_state_dict(
        {
            ".".join([names.get(k.split(".")[0], k.split(".")[0]), *k.split(".")[1:]]): v
            for k, v in theirs.state_dict().items()
        }
    )
    hidden, targets = torch.randn(33, 16), torch.randint(V, (33,))  # seeded above
    with torch.no_grad():
        their_nll = theirs(
            hidden[None], targets[None].roll(1, 1), keep_order=True
        )  # the port shifts by one
        torch.testing.assert_close(ours(hidden[:-1], targets[:-1]), their_nll, atol=1e-5, rtol=0)
        full = ours.log_probs(hidden)
        torch.testing.assert_close(full, theirs(hidden), atol=1e-5, rtol=0)
        torch.testing.assert_close(full.exp().sum(1), torch.ones(33))


def test_wt103_parameter_counts_on_the_meta_device():
    def count(config):
        with torch.device("meta"):
            return sum(p.numel() for p in model_for(config).parameters())

    V103, E, F, N = 267_735, 410, 2100, 16
    layer = E * 3 * E + 2 * E * E + 2 * E + (E * F + F + F * E + E) + 2 * E  # qkv, r, o, LN, FF, LN
    by_hand = (
        V103 * E + V103 + 3 * E + 3 + N * layer + 2 * 10 * 41
    )  # tied table, biases, clusters, u, v
    assert count(AdaptiveConfig.wt103_base()) == by_hand
    assert round(by_hand / 1e6) == 151  # the paper's 151M


def test_tied_weights_stay_tied_after_loading(tmp_path):
    ours = loaded(hf_port(2), tmp_path)
    for k in range(4):
        assert ours.head.outputs[k].weight is ours.word_emb.tables[k].weight
    for k in (1, 2, 3):
        assert ours.head.projections[k] is ours.word_emb.projections[k]
    assert ours.head.projections[0] is not ours.word_emb.projections[0]


def adaptive_model(seed=0, **options):
    torch.manual_seed(seed)
    config = AdaptiveConfig(
        n_token=V,
        n_layer=2,
        d_model=16,
        n_head=2,
        d_head=8,
        d_inner=24,
        cutoffs=(10, 30),
        **{**dict(div_val=2, mem_len=100, tie_projs=(False, True, True)), **options},
    )
    return perturbed(AdaptiveTransformerXL(config), seed, 0.1).eval()


@pytest.mark.parametrize(
    "options", [dict(), dict(div_val=1, d_embed=12), dict(pre_lnorm=True, untie_r=True)]
)
def test_memory_equals_one_long_forward_and_evaluate(options):
    model = adaptive_model(**options)
    seq = torch.randint(V, (2, 25))
    with torch.no_grad():
        whole = model(seq[:, :-1], targets=seq[:, 1:]).losses
        for T in (6, 1):
            pieces, mems = [], None
            for x, y in zip(seq[:, :-1].split(T, 1), seq[:, 1:].split(T, 1)):
                out = model(x, mems=mems, targets=y)
                pieces.append(out.losses)
                mems = out.mems
            torch.testing.assert_close(torch.cat(pieces, 1), whole, atol=1e-5, rtol=1e-5)
    result = evaluate(model, seq[:, :-1], seq[:, 1:], tgt_len=8)
    torch.testing.assert_close(result.losses, whole, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="no predictions"):
        result.accuracy


def test_bfloat16_autocast_is_close_to_float32():
    model, seq = adaptive_model(3), torch.randint(V, (2, 12))
    with torch.inference_mode():
        full = model(seq[:, :-1], targets=seq[:, 1:]).losses
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(seq[:, :-1], targets=seq[:, 1:]).losses
            log_p = model(seq).logits
    assert torch.isfinite(low).all() and torch.isfinite(log_p).all()
    assert (low - full).abs().max() < 0.05


def test_greedy_generation_picks_the_argmax_of_a_full_forward():
    model = adaptive_model(1)
    prompt = torch.randint(V, (2, 4))
    out = model.generate(prompt, 6, temperature=0)
    with torch.no_grad():
        log_p = model(out[:, :-1]).logits
    torch.testing.assert_close(log_p.exp().sum(-1), torch.ones(2, 9))
    assert torch.equal(log_p[:, 3:].argmax(-1), out[:, 4:])


def test_txl_lib_checkpoints_and_original_state_dicts_round_trip(tmp_path):
    model = adaptive_model(2)
    save_checkpoint(tmp_path / "ours.pt", model, step=3)
    again = from_pretrained(tmp_path / "ours.pt")
    x = torch.randint(V, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(again(x).logits, model(x).logits)
    port = hf_port(4)
    state = {k.removeprefix("transformer."): v for k, v in port.state_dict().items()}
    torch.save(state, tmp_path / "original.pt")
    from_file = from_pretrained(tmp_path / "original.pt", config=config_from_hf(port.config))
    direct = from_state_dict(state, config_from_hf(port.config), source="original")
    with torch.no_grad():
        torch.testing.assert_close(from_file(x).logits, direct(x).logits)


def test_what_does_not_fit_is_refused(tmp_path):
    port = hf_port(5)
    port.save_pretrained(tmp_path / "hf")
    config = config_from_hf(port.config)
    state = {k.removeprefix("transformer."): v for k, v in port.state_dict().items()}
    torch.save(state, tmp_path / "state.pt")
    torch.save(torch.nn.Linear(2, 2), tmp_path / "pickled.pt")
    (tmp_path / "empty").mkdir()
    cases = [
        (
            lambda: from_pretrained(tmp_path / "hf", config=dataclasses.replace(config, n_layer=3)),
            "another config",
        ),
        (lambda: from_pretrained(tmp_path / "state.pt"), "pass config="),
        (
            lambda: from_pretrained(tmp_path / "pickled.pt", config=config),
            r"holds pickled code \(torch.nn.modules.linear.Linear\), which is never run here",
        ),
        (lambda: from_pretrained(tmp_path / "empty"), "without config.json"),
        (lambda: from_pretrained(tmp_path / "missing.pt"), "no checkpoint"),
        (
            lambda: from_state_dict(
                {**state, "crit.out_layers.1.weight": state["crit.out_layers.1.weight"] + 1}, config
            ),
            "different tensors",
        ),
        (lambda: from_state_dict(state, dataclasses.replace(config, d_inner=40)), "do not fit"),
        (lambda: from_state_dict({**state, "crit.extra": torch.zeros(1)}, config), "crit.extra"),
        (lambda: from_state_dict(state, config, source="tf"), "source must be"),
        (
            lambda: TransformerXL(config),
            "TransformerXL is built from TXLConfig configs, got AdaptiveConfig",
        ),
        (
            lambda: AdaptiveTransformerXL(TXLConfig(n_token=V)),
            "built from AdaptiveConfig configs, got TXLConfig",
        ),
    ]
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for call, message in cases:
        with pytest.raises((ValueError, TypeError, FileNotFoundError), match=message):
            call()
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(cutoffs=(10, 10)), "increasing"),
        (dict(cutoffs=(0, 10)), "increasing"),
        (dict(cutoffs=(10, V)), "increasing"),
        (dict(cutoffs=(10.5,)), "increasing"),
        (dict(cutoffs=(10,), tie_projs=(True,)), "one per cluster"),
        (dict(cutoffs=(10, 20), div_val=0), "div_val"),
        (dict(d_embed=0), "d_embed"),
        (dict(cutoffs=(10, 20, 30), div_val=8, d_embed=64), "leaves the last cluster no width"),
        (dict(cutoffs=(10,), dropout=1.5), "dropout"),  # chapter 06's checks run too
    ],
)
def test_adaptive_config_errors(options, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveConfig(n_token=V, **options)


def test_word_vocab_orders_by_frequency_and_round_trips():
    vocab = WordVocab("b a b c b a .")
    assert vocab.itos == ["b", "a", ".", "c"]
    assert vocab.decode(vocab.encode("a b .")) == "a b ."
    with pytest.raises(ValueError, match="not in the vocabulary"):
        vocab.encode("a d")
