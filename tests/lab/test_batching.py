"""Tests of attnlab.lab.batching: the order of the mini-batches, with and without length
bucketing, and the tasks' ``bucket`` option."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from tiny_tasks import tiny_task

from attnlab._checks import ConfigError
from attnlab.lab.batching import (
    BUCKET_POOL,
    batch_order,
    noisy_length_batches,
    pad_ids,
    token_batch,
)
from attnlab.lab.config import check_option_values


def _lengths(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 60, (n,), generator=g).tolist()


def _padded(batches: list[list[int]], lengths: list[int]) -> int:
    """The padded area: per batch, its size times its longest example."""
    return sum(len(b) * max(lengths[i] for i in b) for b in batches)


def test_without_bucketing_the_order_is_one_permutation_cut_into_batches():
    """What the tasks did before bucketing existed, so that old runs reproduce."""
    n, size = 23, 5
    got = list(batch_order(n, size, True, torch.Generator().manual_seed(3)))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(3)).tolist()
    assert got == [order[k : k + size] for k in range(0, n, size)]
    assert list(batch_order(7, 3, False, None)) == [[0, 1, 2], [3, 4, 5], [6]]


@pytest.mark.parametrize("n", [1, 9, 250, 3 * 4 * BUCKET_POOL + 7])
def test_bucketing_covers_every_example_once_with_less_padding(n):
    lengths = _lengths(n)
    size = 4
    plain = list(batch_order(n, size, True, torch.Generator().manual_seed(0)))
    bucketed = list(
        batch_order(n, size, True, torch.Generator().manual_seed(0), lengths=lengths, bucket=True)
    )
    assert sorted(i for b in bucketed for i in b) == list(range(n))
    assert all(1 <= len(b) <= size for b in bucketed)
    # each pool is the same set of examples in both; sorted batches pad least
    assert _padded(bucketed, lengths) <= _padded(plain, lengths)
    if n >= 250:
        assert _padded(bucketed, lengths) < 0.8 * _padded(plain, lengths)
        # within a batch the lengths are close: far less spread than in random batches
        spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in bucketed)
        assert spread < 0.25 * sum(
            max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in plain
        )


def test_bucketed_batches_stay_random_across_epochs():
    lengths = _lengths(400)
    g = torch.Generator().manual_seed(0)
    first = list(batch_order(400, 8, True, g, lengths=lengths, bucket=True))
    second = list(batch_order(400, 8, True, g, lengths=lengths, bucket=True))
    assert first != second
    assert sorted(map(sorted, first)) != sorted(map(sorted, second))  # other company too


def test_evaluation_order_is_kept_with_bucketing():
    lengths = [5, 1, 9, 2, 7]
    got = list(batch_order(5, 2, False, None, lengths=lengths, bucket=True))
    assert got == [[0, 1], [2, 3], [4]]


def test_bucketing_needs_the_lengths():
    with pytest.raises(ValueError, match="bucket=True needs the 3 lengths"):
        list(batch_order(3, 2, True, torch.Generator(), bucket=True))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        list(batch_order(3, 0, False, None))


@pytest.mark.parametrize(
    "name", ["sentiment", "target_sentiment", "translation", "multilabel", "meta_embedding"]
)
def test_task_option_bucket(name):
    """With bucket=true a task's training batches are sorted pools; the evaluation batches
    and the examples in them are the same as without."""
    plain, bucketed = tiny_task(name, batch_size=2), tiny_task(name, batch_size=2, bucket=True)
    data = plain.load_data()

    def indices(task, split, shuffle):
        g = torch.Generator().manual_seed(0)
        return [
            b["index"].tolist() for b in task.batches(data, split, 2, shuffle=shuffle, generator=g)
        ]

    assert indices(plain, "test", False) == indices(bucketed, "test", False)
    train = indices(bucketed, "train", True)
    assert sorted(i for b in train for i in b) == sorted(
        i for b in indices(plain, "train", True) for i in b
    )


def test_document_task_buckets_by_sentences_and_words():
    """A document pads to [sentences, longest sentence]: the batches are runs of the
    documents sorted by both (the tiny data is one pool)."""
    task = tiny_task("document", batch_size=2, bucket=True)
    data = task.load_data()
    g = torch.Generator().manual_seed(0)
    keys = [
        [(len(data.train.ids[i]), max((len(s) for s in data.train.ids[i]), default=0))
         for i in b["index"].tolist()]
        for b in task.batches(data, "train", 2, shuffle=True, generator=g)
    ]  # fmt: skip
    assert sum(len(k) for k in keys) == len(data.train.ids)
    for a in keys:
        for b in keys:
            assert a is b or max(a) <= min(b) or max(b) <= min(a)


def test_bad_bucket_values():
    task = tiny_task("sentiment", bucket="yes")
    data = task.load_data()
    with pytest.raises(ConfigError, match="option bucket must be true or false, got 'yes'"):
        next(task.batches(data, "train", 2, shuffle=True, generator=torch.Generator()))
    with pytest.raises(ConfigError, match="option bucket must be true or false"):
        check_option_values(type(task), {"bucket": 1})


def test_pad_ids():
    tokens, lengths = pad_ids([[3, 4], [], [5]])
    assert tokens.tolist() == [[3, 4], [0, 0], [5, 0]]
    assert lengths.tolist() == [2, 0, 1]
    assert pad_ids([[]])[0].shape == (1, 1)
    assert pad_ids([[1], []], pad=7)[0].tolist() == [[1], [7]]


def test_token_batch():
    batch = token_batch([[3, 4], [], [5, 6, 7]], [2, 1], pad=9)
    assert list(batch) == ["tokens", "lengths", "index"]
    assert batch["tokens"].tolist() == [[5, 6, 7], [9, 9, 9]]
    assert batch["lengths"].tolist() == [3, 0] and batch["index"].tolist() == [2, 1]


# ----------------------------------------------------------------------------- noisy sort


def test_noisy_length_batches_without_noise_cut_the_sorted_order():
    lengths = _lengths(70, seed=4)
    got = noisy_length_batches(lengths, 8, torch.Generator().manual_seed(1), noise=0.0)
    order = sorted(range(70), key=lambda i: lengths[i])  # stable, as the sort
    expected = [order[k : k + 8] for k in range(0, 70, 8)]
    assert sorted(got) == sorted(expected)  # the same batches ...
    assert got != expected  # ... in a random order (measured: not the sorted one)


def test_noisy_length_batches_cover_every_example_in_sorted_order_up_to_the_noise():
    """Every example once, in batches of the size; in one batch of all (the noisy sort's
    order as it is) an example is never after one longer than its length plus both
    noises allow; each epoch draws anew; the generator seeds it."""
    lengths = _lengths(300, seed=5)
    g = torch.Generator().manual_seed(2)
    first, second = (noisy_length_batches(lengths, 16, g) for _ in range(2))
    for batches in (first, second):
        assert sorted(i for b in batches for i in b) == list(range(300))
        assert sorted(len(b) for b in batches) == [12] + [16] * 18
    assert first != second
    assert noisy_length_batches(lengths, 16, torch.Generator().manual_seed(2)) == first
    ((order,),) = [noisy_length_batches(lengths, 300, g)]
    for a, b in itertools.pairwise(order):
        la, lb = lengths[a], lengths[b]
        assert lb >= la - math.ceil(0.1 * la) - math.ceil(0.1 * lb), (la, lb)
    assert order != sorted(range(300), key=lambda i: lengths[i])  # the noise moved some


def test_noisy_length_batches_draw_the_papers_noise():
    """The noise of a length L is uniform on the integers of [floor(-0.1 L), ceil(0.1 L)),
    Jain & Wallace's ``randint``: 10 moves to 9 or 10, 11 to 9, 10, 11 or 12, and the
    stable sort keeps the 10 (given first) first on a tie, so the 11 comes first only
    when the 10 draws 10 and the 11 draws 9: probability 1/8 (a symmetric range, 10 to
    9-11 and 11 to 9-13, would give 1/5)."""
    g = torch.Generator().manual_seed(0)
    draws = 4000
    swapped = sum(noisy_length_batches([10, 11], 2, g)[0] == [1, 0] for _ in range(draws))
    assert 0.10 < swapped / draws < 0.15, swapped / draws  # 1/8 +- 4.5 std


def test_noisy_length_batches_bad_arguments():
    g = torch.Generator()
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        noisy_length_batches([3], 0, g)
    for noise in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="noise must be a finite number >= 0"):
            noisy_length_batches([3], 1, g, noise=noise)
    assert noisy_length_batches([], 4, g) == []
