"""RECL (Transformer-XL, Appendix C) against a plain-loop transcription of the paper's formulas."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from txl_lib.model import TXLConfig, TransformerXL
from txl_lib.recl import (
    key_value_stream,
    losses_at_contexts,
    oracle_losses,
    recl,
    recl_by_seed,
    relative_gains,
)


def recl_by_the_formulas(losses, contexts, r=1.0, threshold=0.01, clip=True):
    "Appendix C, one symbol at a time, on nested lists: losses[name][k][t] is l_i(contexts[k], t)."
    names = list(losses)
    n_tokens = len(losses[names[0]][0])

    def b(k, t):  # b(c, t) = min_i l_i(c, t)
        return min(losses[name][k][t] for name in names)

    def top_r(k):  # T: the top-r fraction of tokens by b(c, t)
        size = max(1, int(r * n_tokens + 0.5))
        return sorted(range(n_tokens), key=lambda t: -b(k, t))[
            :size
        ]  # sorted() is stable: ties by position

    def f(name, k, k_long):  # f_i(c, c') = mean over T of min(b(c, t), l_i(c', t))
        hard = top_r(k)
        terms = [
            min(b(k, t), losses[name][k_long][t]) if clip else losses[name][k_long][t] for t in hard
        ]
        return sum(terms) / len(hard)

    def g(name, k):  # relative perplexity reduction from c to c + Δ
        return (math.exp(f(name, k, k)) - math.exp(f(name, k, k + 1))) / math.exp(f(name, k, k))

    result = {}
    for name in names:
        k = 0
        while k + 1 < len(contexts) and g(name, k) >= threshold:
            k += 1
        result[name] = contexts[k]
    return result


def as_tensors(losses):
    return {name: torch.tensor(table, dtype=torch.float64) for name, table in losses.items()}


# The three tables worked by hand in the chapter (the arithmetic is in its prose).
CLIPPED = {"A": [[2, 2], [3, 1], [3, 1]], "B": [[1, 3], [1, 3], [1, 3]]}
ONE_HARD = {"m": [[5] + [1] * 19, [4.85] + [1] * 19, [4.85] + [1] * 19]}
GROUP = {"S": [[1], [1], [1]], "L": [[3], [1.5], [1.5]]}


def test_the_min_clipping_changes_the_answer():
    # A is worse than the baseline on token 0 at c = 2 and better on token 1: with the min it gains
    # 1 - e^-0.5.

    assert (
        recl_by_the_formulas(CLIPPED, [1, 2, 3])
        == recl(as_tensors(CLIPPED), [1, 2, 3])
        == {"A": 2, "B": 1}
    )
    assert recl_by_the_formulas(CLIPPED, [1, 2, 3], clip=False)["A"] == 1
    assert relative_gains(as_tensors(CLIPPED))["A"][0].item() == pytest.approx(1 - math.exp(-0.5))


def test_r_changes_the_answer():
    # 0.15 nats on one token out of 2 / 10 / 20 hard tokens: g = 0.072, 0.015, 0.0075 against 0.01.
    for r, expected in [(0.1, 20), (0.5, 20), (1.0, 10)]:
        assert recl_by_the_formulas(ONE_HARD, [10, 20, 30], r=r) == {"m": expected}
        assert recl(as_tensors(ONE_HARD), [10, 20, 30], r=r) == {"m": expected}


def test_the_group_baseline_sets_the_bar():
    late = {"L": GROUP["L"]}
    assert recl(as_tensors(late), [1, 2, 3]) == recl_by_the_formulas(late, [1, 2, 3]) == {"L": 2}
    assert (
        recl(as_tensors(GROUP), [1, 2, 3])
        == recl_by_the_formulas(GROUP, [1, 2, 3])
        == {"S": 1, "L": 1}
    )


def test_a_gain_that_never_falls_below_the_threshold_gives_the_longest_context():
    falling = {"m": [[3.0], [2.0], [1.0]]}
    assert (
        recl(as_tensors(falling), [5, 10, 15])
        == recl_by_the_formulas(falling, [5, 10, 15])
        == {"m": 15}
    )


@settings(max_examples=200, deadline=None)
@given(
    n_models=st.integers(1, 4),
    n_contexts=st.integers(2, 6),
    n_tokens=st.integers(1, 12),
    r=st.sampled_from([0.05, 0.1, 0.25, 0.5, 0.75, 1.0]),
    threshold=st.sampled_from([0.001, 0.01, 0.05]),
    integer_losses=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_the_formulas_on_random_tables(
    n_models, n_contexts, n_tokens, r, threshold, integer_losses, seed
):
    g = torch.Generator().manual_seed(seed)
    draw = lambda: (
        torch.randint(0, 4, (n_contexts, n_tokens), generator=g).double()
        if integer_losses  # ties
        else 3 * torch.rand(n_contexts, n_tokens, generator=g, dtype=torch.float64)
    )
    losses = {f"m{i}": draw() for i in range(n_models)}
    contexts = list(range(8, 8 + 4 * n_contexts, 4))
    expected = recl_by_the_formulas(
        {k: v.tolist() for k, v in losses.items()}, contexts, r, threshold
    )
    assert recl(losses, contexts, r, threshold) == expected


@pytest.mark.parametrize(
    "losses, contexts, kwargs, match",
    [
        ({}, [1, 2], {}, "at least one table"),
        ({"a": torch.zeros(3)}, [1, 2], {}, r"has shape \(3,\), expected \(>=2, >=1\)"),
        (
            {"a": torch.zeros(3, 4, dtype=torch.long)},
            [1, 2, 3],
            {},
            "float losses",
        ),
        ({"a": torch.zeros(3, 4), "b": torch.zeros(3, 5)}, [1, 2, 3], {}, "one shape in all"),
        ({"a": torch.zeros(1, 4)}, [1], {}, r"expected \(>=2, >=1\)"),
        ({"a": torch.full((2, 2), float("nan"))}, [1, 2], {}, "finite"),
        ({"a": -torch.ones(2, 2)}, [1, 2], {}, ">= 0"),
        ({"a": torch.zeros(2, 2)}, [1, 2], {"r": 0}, r"r must be .* \(0, 1\]"),
        ({"a": torch.zeros(2, 2)}, [1, 2], {"r": 1.5}, r"r must be .* \(0, 1\]"),
        ({"a": torch.zeros(2, 2)}, [1, 2], {"r": True}, "r must be"),
        ({"a": torch.zeros(3, 2)}, [1, 2, 4], {}, r"c, c \+ Δ"),
        ({"a": torch.zeros(3, 2)}, [3, 2, 1], {}, r"c, c \+ Δ"),
        ({"a": torch.zeros(2, 2)}, [0, 1], {}, "each context must be an int >= 1"),
        ({"a": torch.zeros(2, 2)}, [1.0, 2.0], {}, "each context must be an int >= 1"),
        ({"a": torch.zeros(3, 2)}, [1, 2], {}, "one per row"),
        ({"a": torch.zeros(2, 2)}, [1, 2], {"threshold": 0}, r"threshold must be .* \(0, 1\)"),
        ({"a": torch.zeros(2, 2)}, [1, 2], {"threshold": 1}, r"threshold must be .* \(0, 1\)"),
    ],
)
def test_bad_input_is_refused_with_a_clear_error(losses, contexts, kwargs, match):
    with pytest.raises(ValueError, match=match):
        recl(losses, contexts, **kwargs)


def test_key_value_stream_pairs_each_key_with_its_current_value():
    K, V = 6, 16
    stream = key_value_stream(20000, K, V, rebind=0.3, generator=torch.Generator().manual_seed(0))
    keys, pairs = stream[0::2].tolist(), stream[1::2].tolist()
    assert all(0 <= k < K for k in keys) and all(
        K + k * V <= p < K + (k + 1) * V for k, p in zip(keys, pairs)
    )
    previous, changed, repeats = {}, 0, 0
    for k, p in zip(keys, pairs):
        if k in previous:
            repeats += 1
            changed += p != previous[k]
        previous[k] = p
    assert changed / repeats == pytest.approx(
        0.3 * (1 - 1 / V), abs=0.01
    )  # re-drawn w.p. 0.3, may draw the same
    fixed = key_value_stream(2000, K, V, rebind=0.0, generator=torch.Generator().manual_seed(1))
    assert len({(k, p) for k, p in zip(fixed[0::2].tolist(), fixed[1::2].tolist())}) == K


def oracle_by_scanning(stream, t, c, K, V, q):
    """-log p of stream[t] for the predictor that knows the process and sees stream[t-c:t], one
    token at a time."""
    token = stream[t]
    if token < K:
        return math.log(K)
    for s in range(t - 1, t - c - 1, -1):  # back through the window, most recent first
        if stream[s] >= K and (stream[s] - K) // V == (token - K) // V:
            return -math.log((1 - q) * (stream[s] == token) + q / V)
    return math.log(V)


def test_oracle_losses_match_a_scan_of_the_window():
    K, V, q, contexts, n = 4, 8, 0.2, [3, 6, 9, 12], 200
    stream = key_value_stream(150, K, V, q, generator=torch.Generator().manual_seed(2))
    table = oracle_losses(stream, contexts, n, K, V, q)
    ids = stream.tolist()
    expected = [
        [oracle_by_scanning(ids, t, c, K, V, q) for t in range(12, 12 + n)] for c in contexts
    ]
    torch.testing.assert_close(table, torch.tensor(expected), atol=1e-6, rtol=0)


def test_losses_at_contexts_gives_each_token_exactly_c_tokens_before_it():
    torch.manual_seed(0)
    model = TransformerXL(TXLConfig(n_token=20, d_model=16, n_head=2, d_head=8, mem_len=100)).eval()
    stream = torch.randint(20, (60,))
    losses = losses_at_contexts(model, stream, [4, 9], tgt_len=4, n_tokens=5)
    for k, c in enumerate([4, 9]):
        for i, t in enumerate(range(9, 14)):  # the scored positions start at max(contexts)
            with torch.no_grad():
                logits = model(stream[None, t - c : t]).logits[
                    0, -1
                ]  # memory covers all: one forward over c tokens
            expected = torch.nn.functional.cross_entropy(logits[None], stream[t : t + 1])
            torch.testing.assert_close(losses[k, i], expected, atol=1e-5, rtol=1e-5)


def test_losses_at_contexts_reads_with_the_memory_it_is_given():
    torch.manual_seed(0)
    model = TransformerXL(TXLConfig(n_token=20, d_model=16, n_head=2, d_head=8, mem_len=0)).eval()
    stream = torch.randint(20, (40,))
    without = losses_at_contexts(model, stream, [4, 12], tgt_len=4, n_tokens=3)
    torch.testing.assert_close(without[0], without[1])  # no memory: 12 tokens of context read as 4
    with_memory = losses_at_contexts(model, stream, [12], tgt_len=4, n_tokens=3, mem_len=8)
    with torch.no_grad():
        expected = [
            torch.nn.functional.cross_entropy(
                model(stream[None, t - 12 : t]).logits[0, -1:], stream[t : t + 1]
            )
            for t in range(12, 15)
        ]
    torch.testing.assert_close(with_memory[0], torch.stack(expected), atol=1e-5, rtol=1e-5)
    assert model.config.mem_len == 0  # the model's own setting is restored


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: key_value_stream(0), "n_pairs"),
        (lambda: key_value_stream(5, n_keys=0), "n_keys"),
        (lambda: key_value_stream(5, rebind=1.5), "rebind"),
        (lambda: oracle_losses(torch.arange(10), [2, 4], 20), "at least"),
        (lambda: oracle_losses(torch.full((30,), 200), [2, 4], 5), r"ids must lie in \[0, 102\)"),
        (
            lambda: losses_at_contexts(None, torch.zeros(3, 4, dtype=torch.long), [1], 4),
            "has shape",
        ),
        (lambda: losses_at_contexts(None, torch.arange(10), [], 4), "at least one context"),
        (lambda: losses_at_contexts(None, torch.arange(10), [2], 4, n_tokens=0), "n_tokens"),
    ],
)
def test_bad_stream_arguments_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_recl_by_seed_is_each_seeds_group_apart_and_names_a_missing_table():
    """Seed by seed, the RECL of the group {a, b} of that seed's tables; a missing table is one
    clear error."""
    generator = torch.Generator().manual_seed(0)
    tables = {
        f"{m}-seed{s}": torch.rand(4, 20, generator=generator) * 3 for m in "ab" for s in (0, 1)
    }
    found = recl_by_seed(tables, ["a", "b"], [0, 1], [8, 16, 24, 32], r=0.5)
    for s in (0, 1):
        alone = recl({"a": tables[f"a-seed{s}"], "b": tables[f"b-seed{s}"]}, [8, 16, 24, 32], r=0.5)
        assert (found["a"][s], found["b"][s]) == (alone["a"], alone["b"])
    with pytest.raises(ValueError, match="c-seed0"):
        recl_by_seed(tables, ["a", "c"], [0], [8, 16, 24, 32])
