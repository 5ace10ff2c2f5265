"""Issue 17, chapter 10: the KNN store is no hidden state. A call is a function of its inputs and
the memory it is given: the same (x, mems) twice gives the same outputs, no position sees a
later token of its segment, a failed call changes nothing, init_mems(B) is mems=None, generate
leaves the caller's memory alone, clear takes a bool mask."""

import copy

import pytest
import torch

from txl_lib.knn import KNNConfig, KNNMemory, KNNTransformerXL
from txl_lib.cache import InferenceCache
from txl_lib.training import evaluate

# T = 6 > mem_len = 3: every call sends positions of its own segment into the store, the case that
# broke causality

CONFIG = dict(
    n_token=30,
    n_layer=2,
    d_model=16,
    n_head=2,
    d_head=8,
    d_inner=24,
    tgt_len=6,
    mem_len=3,
    knn_layer=1,
    knn_capacity=64,
    knn_top_k=3,
)


@pytest.fixture
def knn():
    torch.manual_seed(0)
    model = KNNTransformerXL(KNNConfig(**CONFIG)).eval()
    with torch.no_grad():
        model.knn_attention.gate.fill_(2.0)  # mostly retrieved attention: the store matters
    return model


def tokens(S, seed=1, B=2):
    return torch.randint(30, (B, S), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def read(model, x, T=6):
    """Read x (B, S) in segments of T, memory carried: the logits of every segment and the last
    memory."""
    mems, logits = None, []
    for segment in x.split(T, dim=1):
        out = model(segment, mems=mems)
        mems = out.mems
        logits.append(out.logits)
    return logits, mems


def contents(store: KNNMemory) -> list:
    """What a store holds: per stream its pairs, oldest first (the slots after them are free, not
    part of it)."""
    return [store.stored(b) for b in range(store.length.numel())] + [
        store.length.clone(),
        store.next.clone(),
    ]


def same_store(a: KNNMemory, b: KNNMemory) -> bool:
    return all(
        torch.equal(x, y)
        for x, y in zip(
            torch.utils._pytree.tree_leaves(contents(a)),
            torch.utils._pytree.tree_leaves(contents(b)),
        )
    )


def frozen(store: KNNMemory) -> KNNMemory:
    "A deep copy of the store: its contents as they are now."
    return copy.deepcopy(store)


def unchanged(store: KNNMemory, before: KNNMemory) -> bool:
    return same_store(store, before)


def test_the_same_call_twice_gives_the_same_outputs_and_leaves_the_memory_alone(knn):
    _, mems = read(knn, tokens(18))
    before = frozen(mems.store)
    x = tokens(6, seed=2)
    with torch.no_grad():
        first, second = knn(x, mems=mems), knn(x, mems=mems)
    assert torch.equal(first.logits, second.logits)
    assert same_store(first.mems.store, second.mems.store)
    assert unchanged(mems.store, before)  # the memory passed in is intact
    assert (
        int(first.mems.store.length[0]) == int(mems.store.length[0]) + 6
    )  # the new one has the segment's 6


@pytest.mark.parametrize("changed", [1, 3, 5])
def test_a_later_token_never_changes_an_earlier_position_also_on_a_second_call(knn, changed):
    _, mems = read(knn, tokens(12))
    x = tokens(6, seed=3)
    y = x.clone()
    y[:, changed] = (y[:, changed] + 7) % 30
    with torch.no_grad():
        for _ in range(2):  # the second call: same mems again
            ours, theirs = knn(x, mems=mems).logits, knn(y, mems=mems).logits
            assert torch.equal(ours[:, :changed], theirs[:, :changed])
            assert not torch.equal(
                ours[:, changed:], theirs[:, changed:]
            )  # the change is seen from there on


def test_each_position_equals_the_call_that_stops_there(knn):
    """Independent computation: the logits at offset t are those of the call on the segment's first
    t + 1 tokens."""
    _, mems = read(knn, tokens(12))
    x = tokens(6, seed=4)
    with torch.no_grad():
        full = knn(x, mems=mems).logits
        for t in range(6):
            torch.testing.assert_close(
                knn(x[:, : t + 1], mems=mems).logits[:, t], full[:, t], rtol=0, atol=1e-6
            )


def test_init_mems_is_mems_none_even_after_another_document(knn):
    read(knn, tokens(24, seed=5))  # a previous document
    x = tokens(6, seed=6)
    with torch.no_grad():
        fresh, explicit = knn(x), knn(x, mems=knn.init_mems(2))
    assert torch.equal(fresh.logits, explicit.logits)
    assert same_store(fresh.mems.store, explicit.mems.store)
    assert knn.init_mems(2).store.length.tolist() == [0, 0]


def test_generate_in_the_middle_of_a_document_leaves_the_callers_memory_untouched(knn):
    x = tokens(24, seed=7)
    expected, _ = read(knn, x)
    _, mems = read(knn, x[:, :12])
    before = frozen(mems.store)
    knn.generate(tokens(5, seed=8, B=1), 7, temperature=0)
    assert unchanged(mems.store, before)
    with torch.no_grad():
        for i, segment in enumerate(x[:, 12:].split(6, dim=1)):
            out = knn(segment, mems=mems)
            mems = out.mems
            assert torch.equal(out.logits, expected[2 + i])


def test_generate_with_the_cache_equals_greedy_steps_without_it(knn):
    """generate (an InferenceCache, and the store in the memory) against a plain loop of uncached
    calls."""
    prompt = tokens(5, seed=9, B=2)
    ids = knn.generate(prompt, 9, temperature=0)
    with torch.no_grad():
        out, expected = knn(prompt), [prompt]
        for _ in range(9):
            expected.append(out.logits[:, -1].argmax(-1, keepdim=True))
            out = knn(expected[-1], mems=out.mems)
    assert torch.equal(ids, torch.cat(expected, dim=1))


def test_a_call_that_fails_the_cache_check_changes_nothing(knn):
    x = tokens(18, seed=10)
    expected, _ = read(knn, x)
    _, mems = read(knn, x[:, :12])
    before = frozen(mems.store)
    cache = InferenceCache(2)
    with torch.no_grad():
        knn(x[:, :6], cache=cache)  # the cache now follows another run
        with pytest.raises(ValueError, match="takes the mems of its previous call"):
            knn(x[:, 12:], mems=None, cache=cache)
        with pytest.raises(ValueError, match="takes the mems of its previous call"):
            knn(x[:, 12:], mems=mems, cache=cache)
        assert unchanged(mems.store, before) and knn.knn_attention.store is None
        assert torch.equal(knn(x[:, 12:], mems=mems).logits, expected[2])


def test_a_call_that_fails_inside_the_forward_pass_leaves_no_store_on_the_layer(knn):
    _, mems = read(knn, tokens(12))
    with pytest.raises(RuntimeError, match="eval mode"):  # cache while training: refused
        knn.train()(tokens(6), mems=mems, cache=InferenceCache(2))
    assert knn.knn_attention.store is None and knn.knn_attention.evict == 0


def test_training_and_evaluation_carry_the_store_in_the_memory(knn):
    "evaluate reads a document through out.mems: the same per-token loss as reading it by hand."
    x = tokens(25, seed=11)
    logits, _ = read(knn, x[:, :-1])
    by_hand = torch.nn.functional.cross_entropy(
        torch.cat(logits, 1).flatten(0, 1), x[:, 1:].flatten(), reduction="none"
    ).view(2, 24)
    torch.testing.assert_close(evaluate(knn, x[:, :-1], x[:, 1:], tgt_len=6).losses, by_hand)


@pytest.mark.parametrize("mask", [[True, False, True], torch.tensor([True, False, True])])
def test_clear_with_a_bool_mask_empties_exactly_the_true_streams(mask):
    store = KNNMemory(3, 2, 4, 8).add(torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4))
    before = frozen(store)
    cleared = store.clear(mask)
    assert cleared.length.tolist() == [0, 5, 0]
    assert unchanged(store, before)  # a new store; this one intact
    assert store.clear([1]).length.tolist() == [5, 0, 5] and store.clear([]).length.tolist() == [
        5,
        5,
        5,
    ]


@pytest.mark.parametrize(
    "streams, message",
    [
        ([True, False], r"indices in \[0, 3\) or a mask of 3 bools, got \[True, False\]"),
        ([[0, 1]], r"indices in \[0, 3\) or a mask of 3 bools, got \[\[0, 1\]\]"),
        ([3], r"indices in \[0, 3\) or a mask of 3 bools, got \[3\]"),
        ([-1], r"indices in \[0, 3\) or a mask of 3 bools, got \[-1\]"),
        ([0.5], r"indices .* or a mask of 3 bools"),
        ("0", r"indices .* or a mask of 3 bools"),
    ],
)
def test_clear_refuses_what_is_neither_indices_nor_a_mask(streams, message):
    store = KNNMemory(3, 2, 4, 8).add(torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4))
    before = frozen(store)
    with pytest.raises(ValueError, match=message):
        store.clear(streams)
    assert unchanged(store, before)


def test_a_memory_without_its_store_is_refused(knn):
    _, mems = read(knn, tokens(12))
    before = frozen(mems.store)
    with pytest.raises(TypeError, match="the KNN store an out.mems or init_mems carries"):
        knn(tokens(6), mems=list(mems))
    other_batch = KNNTransformerXL(KNNConfig(**CONFIG)).init_mems(3).store
    with pytest.raises(
        ValueError, match=r"mems' KNN store has shape \(3, 2, 64, 8\), expected \(2, 2, 64, 8\)"
    ):
        knn(tokens(6), mems=type(mems)(mems, other_batch))
    small = KNNTransformerXL(KNNConfig(**{**CONFIG, "knn_capacity": 8})).init_mems(2).store
    with pytest.raises(
        ValueError, match=r"mems' KNN store has shape \(2, 2, 8, 8\), expected \(2, 2, 64, 8\)"
    ):
        knn(tokens(6), mems=type(mems)(mems, small))
    assert unchanged(mems.store, before)


def test_copy_on_write_against_lists_over_random_branches():
    """Stores made from any earlier store (older ones, cleared ones, full ones) hold what plain
    lists say they hold."""
    g = torch.Generator().manual_seed(12)
    B, C = 3, 7
    versions = [
        (KNNMemory(B, 1, 1, C), [[] for _ in range(B)])
    ]  # (store, pairs per stream as lists)
    for step in range(200):
        store, lists = versions[int(torch.randint(len(versions), (1,), generator=g))]
        if torch.rand(1, generator=g) < 0.2:
            mask = (torch.rand(B, generator=g) < 0.5).tolist()
            new, new_lists = store.clear(mask), [[] if m else list(l) for m, l in zip(mask, lists)]
        else:
            n = int(torch.randint(0, 5, (1,), generator=g))
            pairs = torch.arange(step * 10, step * 10 + B * n, dtype=torch.float).view(B, 1, n, 1)
            new, new_lists = (
                store.add(pairs, -pairs),
                [(l + pairs[b, 0, :, 0].tolist())[-C:] for b, l in enumerate(lists)],
            )
        versions.append((new, new_lists))
        for old_store, old_lists in versions:  # every version still holds its own
            for b in range(B):
                keys, values = old_store.stored(b)
                assert keys.flatten().tolist() == old_lists[b] and values.flatten().tolist() == [
                    -x for x in old_lists[b]
                ]


@pytest.fixture
def reference_run(tmp_path):
    import shutil
    from pathlib import Path

    folder = tmp_path / "run"
    shutil.copytree(Path(__file__).parents[1] / "reference/10_knn_memory", folder)
    return folder


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: (f / "training_log.json").unlink(), r"training_log.json is missing"),
        (lambda f: (f / "models.safetensors").unlink(), r"models.safetensors is missing"),
        (
            lambda f: (f / "training_log.json").write_text("{not json"),
            r"training_log.json differs from the sha256 .*manifest.json lists",
        ),
        (
            lambda f: (f / "models.safetensors").write_bytes(b"\x00" * 100),
            r"models.safetensors differs from the sha256 .*manifest.json lists",
        ),
        (lambda f: (f / "manifest.json").unlink(), r"manifest.json is missing"),
    ],
)
def test_a_damaged_reference_run_is_refused_naming_the_file(reference_run, damage, message):
    from txl_lib.knn import load_recall_reference

    damage(reference_run)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        load_recall_reference(reference_run)


def test_a_consistent_reference_run_of_another_shape_is_refused(reference_run):
    from txl_lib.knn import load_recall_reference
    from txl_lib.infrastructure import write_manifest

    (reference_run / "training_log.json").write_text("[1, 2]")
    write_manifest(reference_run)  # listed, and still not a training log
    with pytest.raises(ValueError, match=r"training_log.json is not a reference training log"):
        load_recall_reference(reference_run)


def test_reference_weights_that_do_not_fit_are_refused_naming_the_file(reference_run):
    from safetensors.torch import load_file, save_file
    from txl_lib.knn import load_recall_reference
    from txl_lib.infrastructure import write_manifest

    weights = load_file(reference_run / "models.safetensors")
    weights.pop("XL + KNN memory, seed 1/layers.1.attn.gate")
    save_file(weights, reference_run / "models.safetensors")
    write_manifest(reference_run)  # a consistent folder: only the weights' names are wrong
    with pytest.raises(
        ValueError,
        match=r"models.safetensors: the weights do not fit .*missing \['layers.1.attn.gate'\]",
    ):
        load_recall_reference(reference_run)
