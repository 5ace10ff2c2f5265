"""KNN memory (chapter 10): the store against brute force, eviction, capacity, stream isolation,
clear; the layer reduces to XL attention; nothing is attended twice; gradients stop at the
store; Transformer-XL's reach (N M + offset) against the store's; the reference run's files
and their loader."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from txl_lib.positions import relative_positions
from txl_lib.attention import attention_mask

from txl_lib.knn import (
    RECALL_MODELS,
    RECALL_RECIPE,
    KNNConfig,
    KNNMemory,
    KNNMems,
    KNNTransformerXL,
    load_recall_reference,
    mixed_recall,
    recall_config,
)
from txl_lib.model import TXLConfig, TransformerXL
from txl_lib.serialization import save_checkpoint
from loading import load_checkpoint
from txl_lib.training import train
from txl_lib.utils import seed_everything
from txl_lib.infrastructure import write_manifest


def filled_store(B=3, H=2, D=5, C=16, n=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(B, H, n, D, generator=g), torch.randn(B, H, n, D, generator=g)
    return KNNMemory(B, H, D, C).add(keys, values), keys, values


@pytest.mark.parametrize("n, k", [(11, 4), (16, 16), (3, 5), (40, 7)])
def test_search_equals_brute_force(n, k):
    store, keys, values = filled_store(n=n)
    keys, values = keys[:, :, -16:], values[:, :, -16:]  # what a capacity of 16 keeps
    queries = torch.randn(3, 2, 6, 5, generator=torch.Generator().manual_seed(1))
    found_keys, found_values, found = store.search(queries, k)
    for b in range(3):
        for h in range(2):
            for t in range(6):
                scores = [(queries[b, h, t] @ keys[b, h, j]).item() for j in range(keys.size(2))]
                best = sorted(range(len(scores)), key=lambda j: -scores[j])[:k]
                n_found = min(k, len(scores))
                assert found[b, h, t].tolist() == [True] * n_found + [False] * (
                    min(k, 16) - n_found
                )
                torch.testing.assert_close(found_keys[b, h, t, :n_found], keys[b, h, best])
                torch.testing.assert_close(found_values[b, h, t, :n_found], values[b, h, best])


def test_eviction_is_first_in_first_out_and_capacity_is_a_bound():
    store = KNNMemory(1, 1, 1, capacity=5)
    for start in range(0, 12, 3):  # 0..11 in chunks of 3
        chunk = torch.arange(start, start + 3, dtype=torch.float).view(1, 1, 3, 1)
        store = store.add(chunk, -chunk)
        keys, values = store.stored(0)
        expected = torch.arange(max(0, start + 3 - 5), start + 3, dtype=torch.float)
        assert (
            keys.flatten().tolist() == expected.tolist()
            and values.flatten().tolist() == (-expected).tolist()
        )
        assert (
            int(store.length[0]) == min(start + 3, 5) <= store.capacity and store.keys.size(2) == 5
        )
    store = store.add(
        torch.arange(20.0).view(1, 1, 20, 1), torch.zeros(1, 1, 20, 1)
    )  # more than the capacity at once
    assert store.stored(0)[0].flatten().tolist() == [15.0, 16.0, 17.0, 18.0, 19.0]


def test_streams_are_isolated_and_clear_empties_only_the_given_ones():
    store, keys, _ = filled_store(B=3, n=6)
    queries = torch.randn(3, 2, 4, 5, generator=torch.Generator().manual_seed(2))
    found_keys = store.search(queries, 6)[0]  # k = everything stored
    for b in range(3):
        for h in range(2):  # a stream finds its own keys, all of them
            assert {tuple(x) for x in found_keys[b, h, 0].tolist()} == {
                tuple(x) for x in keys[b, h].tolist()
            }
    store = store.clear([1])
    assert store.length.tolist() == [6, 0, 6]
    assert not store.search(queries, 3)[2][1].any() and store.search(queries, 3)[2][0].all()
    store = store.add(keys[:, :, :2], keys[:, :, :2])
    assert store.length.tolist() == [8, 2, 8] and torch.equal(store.stored(1)[0], keys[1, :, :2])


@pytest.mark.parametrize(
    "bad, message",
    [
        # add and search run inside the KNN layer on every step: they check nothing
        (lambda s: s.clear([3]), "streams must be"),
        (lambda s: s.stored(3), r"stream must be an int in \[0, 2\]"),
        (lambda s: KNNMemory(3, 2, 5, 0), "capacity must be"),
    ],
)
def test_bad_input_changes_nothing(bad, message):
    store, _, _ = filled_store()
    before = (store.keys.clone(), store.values.clone(), store.length.clone(), store.next.clone())
    with pytest.raises(ValueError, match=message):
        bad(store)
    assert all(
        torch.equal(a, b)
        for a, b in zip(before, (store.keys, store.values, store.length, store.next))
    )


SIZES = dict(n_token=30, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=24)


def config(**options):
    return KNNConfig(
        **SIZES,
        **{**dict(tgt_len=5, mem_len=5, knn_layer=1, knn_capacity=64, knn_top_k=3), **options},
    )


def plain_config(**options):
    "The same model without the KNN memory: chapter 06's config, the KNN fields left out."
    return TXLConfig(**SIZES, **{**dict(tgt_len=5, mem_len=5), **options})


def twins(**options):
    torch.manual_seed(0)
    knn = KNNTransformerXL(config(**options)).eval()
    plain = TransformerXL(
        plain_config(**{k: v for k, v in options.items() if not k.startswith("knn_")})
    ).eval()
    plain.load_state_dict(
        {k: v for k, v in knn.state_dict().items() if not k.endswith("attn.gate")}
    )
    return knn, plain


@pytest.mark.parametrize("options", [dict(), dict(pre_lnorm=True, untie_r=True), dict(knn_layer=0)])
def test_with_an_empty_store_the_layer_is_xl_attention_scaled_by_the_gate(options):
    knn, plain = twins(**options)
    ours, theirs = knn.knn_attention, plain.layers[knn.config.knn_layer].attn
    x, mem = torch.randn(2, 5, 16), torch.randn(2, 3, 16)
    c = plain.config
    r = relative_positions(8, c.d_model, c.clamp_len)
    mask = attention_mask(5, 3, c.same_length, c.mem_len)
    u, v = plain.biases(knn.config.knn_layer)
    ours.store, ours.evict = KNNMemory(2, 2, 8, 64), 0
    with torch.no_grad():
        ours.gate.copy_(torch.tensor([0.7, -1.3]))
        g = ours.gate.sigmoid()[:, None, None]
        q, k, val = theirs.keys_values(x, mem)
        score = theirs.relative_scores(q, k, theirs.project_positions(r), u, v)
        expected = theirs.output(x, (1 - g) * theirs.weighted_values(score, val, mask))
        torch.testing.assert_close(ours(x, r, u, v, mask, mem), expected)


def test_gate_closed_equals_transformer_xl_over_many_segments():
    knn, plain = twins()
    x = torch.randint(30, (2, 40))
    mk, mp = None, None
    with torch.no_grad():
        knn.knn_attention.gate.fill_(-1e4)
        for segment in x.split(5, dim=1):
            a, b = knn(segment, mems=mk), plain(segment, mems=mp)
            torch.testing.assert_close(a.logits, b.logits, atol=1e-6, rtol=0)
            mk, mp = a.mems, b.mems
    assert mk.store.length.tolist() == [35, 35]  # 40 positions, the last 5 still in the window


def test_positions_enter_the_store_exactly_when_they_leave_the_window():
    knn, _ = twins(mem_len=7)
    x = torch.randint(30, (2, 23))
    mems, total = None, 0
    with torch.no_grad():
        for segment in x.split(5, dim=1):
            mems, total = knn(segment, mems=mems).mems, total + segment.size(1)
            assert int(mems.store.length[0]) == max(
                0, total - 7
            )  # window + store = everything, no overlap
            assert mems[0].size(1) == min(7, total)
        full = knn(x[:, :16])  # one call (mem_len 7): 9 positions evicted
        _, k, v = knn.knn_attention.project(full.hiddens[1])  # keys of layer 1 from its inputs
    keys, values = full.mems.store.stored(0)
    torch.testing.assert_close(keys, k[0, :, :9])
    torch.testing.assert_close(values, v[0, :, :9])


def test_the_store_is_not_differentiated_through_and_gradients_reach_the_gate():
    knn, _ = twins()
    x, y = torch.randint(30, (2, 10)), torch.randint(30, (2, 10))
    knn.train()
    first = knn(x[:, :5], targets=y[:, :5])
    first.losses.mean().backward()  # the store was filled from this graph
    assert not first.mems.store.keys.requires_grad and not first.mems.store.values.requires_grad
    knn.zero_grad()
    second = knn(x[:, 5:], mems=first.mems, targets=y[:, 5:])
    second.losses.mean().backward()
    assert knn.knn_attention.gate.grad is not None and knn.knn_attention.gate.grad.abs().sum() > 0


def test_a_batch_must_match_the_store_and_bad_input_leaves_it_alone():
    knn, _ = twins()
    out = knn(torch.randint(30, (2, 5)))
    out = knn(torch.randint(30, (2, 5)), mems=out.mems)
    store, length = out.mems.store, out.mems.store.length.clone()
    with pytest.raises(TypeError, match="the KNN store an out.mems or init_mems carries"):
        knn(torch.randint(30, (3, 5)), mems=[torch.zeros(3, 5, 16)] * 2)
    with pytest.raises(
        ValueError, match=r"mems' KNN store has shape \(2, 2, 64, 8\), expected \(3,"
    ):
        knn(torch.randint(30, (3, 5)), mems=KNNMems([torch.zeros(3, 5, 16)] * 2, store))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        knn(torch.full((2, 5), 99), mems=out.mems)
    with pytest.raises(ValueError, match="targets"):
        knn(torch.randint(30, (2, 5)), mems=out.mems, targets=torch.zeros(2, 4, dtype=torch.long))
    assert (
        out.mems.store is store
        and torch.equal(store.length, length)
        and knn.knn_attention.store is None
    )


def test_config_and_checkpoint():
    for bad, message in [
        (dict(knn_layer=2), "knn_layer"),
        (dict(knn_top_k=100), r"knn_top_k must be an int in \[1, 64\]"),
        (dict(knn_capacity=0), "knn_capacity"),
        (dict(knn_layer=None), r"knn_layer \(the layer with the KNN memory\) must be an int"),
        (dict(dropout=2.0), "dropout"),
    ]:
        with pytest.raises(ValueError, match=message):
            config(**bad)
    with pytest.raises(
        TypeError, match="TransformerXL is built from TXLConfig configs, got KNNConfig"
    ):
        TransformerXL(config())
    with pytest.raises(
        TypeError, match="KNNTransformerXL is built from KNNConfig configs, got TXLConfig"
    ):
        KNNTransformerXL(plain_config())


def test_checkpoint_round_trip(tmp_path):
    knn, _ = twins()
    save_checkpoint(tmp_path / "knn.pt", knn, step=2)
    again, step = load_checkpoint(
        tmp_path / "knn.pt", build=KNNTransformerXL, read_config=lambda stored: KNNConfig(**stored)
    )
    x = torch.randint(30, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(x).logits, knn(x).logits)


def last_logits(model, x, T):
    "Logits at the last position of x (B, S), read in segments of T with memory carried."
    mems = None
    with torch.no_grad():
        for segment in x.split(T, dim=1):
            out = model(segment, mems=mems)
            mems = out.mems
    return out.logits[:, -1]


@pytest.mark.parametrize("n_layer, T, M", [(2, 8, 8), (2, 4, 8), (3, 5, 5)])
def test_xl_cannot_see_beyond_n_layer_times_mem_len_plus_offset_and_the_store_can(n_layer, T, M):
    torch.manual_seed(0)
    options = dict(
        n_token=30,
        n_layer=n_layer,
        d_model=16,
        n_head=2,
        d_head=8,
        d_inner=24,
        tgt_len=T,
        mem_len=M,
    )
    xl = TransformerXL(TXLConfig(**options)).eval()
    knn = KNNTransformerXL(
        KNNConfig(**options, knn_layer=n_layer - 1, knn_capacity=256, knn_top_k=3)
    ).eval()
    x = torch.randint(30, (2, 7 * T + 3), generator=torch.Generator().manual_seed(1))
    reach = n_layer * M + (x.size(1) - 1) % T  # N M + offset of the last position in its segment

    def changed_at(distance):
        y = x.clone()
        y[:, -1 - distance] = (y[:, -1 - distance] + 1) % 30
        return y

    for model, sees_beyond in [(xl, False), (knn, True)]:
        base = last_logits(model, x, T)
        assert not torch.equal(
            base, last_logits(model, changed_at(reach), T)
        )  # the bound is reached
        assert torch.equal(base, last_logits(model, changed_at(reach + 1), T)) != sees_beyond


def test_mixed_recall_alternates_between_the_distances():
    batches = mixed_recall((6, 40), 50, 4, seed=0)
    shapes = [next(batches)[0].shape for _ in range(4)]
    assert shapes == [(4, 8), (4, 42), (4, 8), (4, 42)]  # key, value, filler, QUERY, key


def test_the_reference_script_writes_what_load_recall_reference_reads(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "reference_10", Path(__file__).parents[1] / "reference/10_knn_memory.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "OUT", tmp_path / "run")
    monkeypatch.setattr(script, "SEEDS", (0, 1))
    monkeypatch.setattr(script, "RECALL_RECIPE", {**RECALL_RECIPE, "steps": 2})
    script.main()
    models, log = load_recall_reference(tmp_path / "run")
    assert list(models) == list(RECALL_MODELS) and all(len(m) == 2 for m in models.values())
    r = {**RECALL_RECIPE, "steps": 2}
    for name, with_knn in RECALL_MODELS.items():  # seed 1 again, by hand: the same weights
        seed_everything(1)
        again = (KNNTransformerXL if with_knn else TransformerXL)(recall_config(with_knn))
        train(
            again,
            mixed_recall(r["distances"], r["n_examples"], r["batch_size"], seed=r["data_seed"] + 1),
            steps=2,
            tgt_len=r["tgt_len"],
            lr=r["lr"],
        )
        loaded = models[name][1].state_dict()
        assert all(torch.equal(v, loaded[k]) for k, v in again.state_dict().items())
        assert not torch.equal(
            loaded["word_emb.weight"], models[name][0].state_dict()["word_emb.weight"]
        )
    log["configs"]["XL + KNN memory"]["knn_top_k"] = 3
    (tmp_path / "run" / "training_log.json").write_text(json.dumps(log))
    with pytest.raises(ValueError, match="training_log.json differs from the sha256"):
        load_recall_reference(tmp_path / "run")
    write_manifest(tmp_path / "run")  # consistent again, and made with another configuration
    with pytest.raises(ValueError, match="have another config"):
        load_recall_reference(tmp_path / "run")
