"""Data helpers: bad input is refused clearly; streams and segments cover every token once, in
order."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from txl_lib.data import CharVocab, Segments, batchify, load_corpus, recall_task, sort_task, IGNORE
from txl_lib.training import document_segments, stream_documents


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: CharVocab(""), "empty text"),
        (lambda: CharVocab("abc").encode("abx"), "not in the vocabulary: 'x'"),
        (lambda: batchify(torch.arange(5), 6), "batch_size must be an int in [1, 5]"),
        (lambda: batchify(torch.arange(5), 0), "batch_size must be an int in [1, 5]"),
        (lambda: batchify(torch.arange(6).view(2, 3), 2), "ids has shape (2, 3), expected (*)"),
        (lambda: Segments(torch.arange(10).view(2, 5), 0), "tgt_len must be an int >= 1"),
        (lambda: Segments(torch.arange(10).view(2, 5), 2.5), "got 2.5"),
        (lambda: Segments(torch.arange(10), 2), "data (B streams of S >= 2) has shape (10,)"),
        (lambda: recall_task(3, distance=1), "distance must be an int >= 2"),
        (
            lambda: recall_task(3, distance=10, n_pairs=9, n_symbols=8),
            "n_pairs must be an int in [1, n_symbols=8]",
        ),
        (lambda: sort_task(3, 1), "n_digits must be an int >= 2"),
    ],
)
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)


def test_missing_and_empty_corpus_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="is neither 'shakespeare' nor a text file"):
        load_corpus(str(tmp_path / "nope.txt"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="is empty"):
        load_corpus(str(tmp_path / "empty.txt"))


def test_vocab_round_trip_on_the_corpus():
    text = load_corpus("shakespeare")[:5000]
    vocab = CharVocab(text)
    assert vocab.decode(vocab.encode(text)) == text


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 300), batch_size=st.integers(1, 8), tgt_len=st.integers(1, 40))
def test_segments_visit_every_token_once_in_order(n, batch_size, tgt_len):
    ids = torch.arange(n)
    if batch_size > n or n // batch_size < 2:
        return
    data = batchify(ids, batch_size)
    # brute force: row b holds the b-th contiguous slice of the kept tokens
    kept = n - n % batch_size
    for b in range(batch_size):
        assert data[b].tolist() == list(
            range(b * (kept // batch_size), (b + 1) * (kept // batch_size))
        )
    inputs, targets = [], []
    for x, y in Segments(data, tgt_len):
        assert 1 <= x.size(1) <= tgt_len and x.shape == y.shape
        inputs.append(x)
        targets.append(y)
    assert len(inputs) == len(Segments(data, tgt_len))
    assert torch.equal(torch.cat(inputs, 1), data[:, :-1])  # each token an input once, in order
    assert torch.equal(torch.cat(targets, 1), data[:, 1:])  # and a target once, shifted by one
    # the training loop's segmentation of a stream is the same
    loop = [
        s for s, _ in zip(document_segments(stream_documents(data), tgt_len), range(len(inputs)))
    ]
    assert all(torch.equal(a[0], b) for a, b in zip(loop, inputs))
    assert [first for *_, first in loop] == [True] + [False] * (len(inputs) - 1)


def test_recall_answer_is_the_queried_value_far_back():
    task = recall_task(100, distance=30, n_pairs=3, generator=torch.Generator().manual_seed(3))
    for x, y in zip(task.inputs, task.targets):
        key = x[-1]
        positions = [p for p in range(0, 6, 2) if x[p] == key]
        assert len(positions) == 1
        assert y[-1] == x[positions[0] + 1]
        assert len(x) - 1 - (positions[0] + 1) == 30 + (
            4 - positions[0]
        )  # `distance` for the last pair, +2 before
        assert (y[:-1] == IGNORE).all()
    assert task.inputs.max() < task.n_token


def test_sort_targets_are_the_sorted_digits():
    task = sort_task(50, 5, generator=torch.Generator().manual_seed(0))
    for x, y in zip(task.inputs, task.targets):
        assert y[4:].tolist() == sorted(x[:5].tolist())
        assert (y[:4] == IGNORE).all()


def originals_ordered_batches(ids, batch_size, bptt):
    """The original's LMOrderedIterator (data_utils.py, ext_len = 0), restated: time-major
    (steps, B) streams, fixed bptt, the last batch shorter."""
    n_step = len(ids) // batch_size
    data = (
        ids[: n_step * batch_size].view(batch_size, n_step).t()
    )  # (n_step, B): column b is stream b
    for i in range(0, n_step - 1, bptt):
        seq_len = min(bptt, n_step - 1 - i)
        yield data[i : i + seq_len], data[i + 1 : i + 1 + seq_len]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(4, 300), batch_size=st.integers(1, 8), tgt_len=st.integers(1, 40))
def test_segments_are_the_originals_ordered_iterator_batch_first(n, batch_size, tgt_len):
    if n // batch_size < 2:
        return
    ours = list(Segments(batchify(torch.arange(n), batch_size), tgt_len))
    theirs = list(originals_ordered_batches(torch.arange(n), batch_size, tgt_len))
    assert len(ours) == len(theirs)
    for (x, y), (x_time_major, y_time_major) in zip(ours, theirs):
        assert torch.equal(x, x_time_major.t()) and torch.equal(y, y_time_major.t())
