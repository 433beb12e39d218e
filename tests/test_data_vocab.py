"""Draft vocabulary mapping: top-Vd by count, ties to the lower id, ascending, offsets."""

from __future__ import annotations

import pytest
import torch

from eagle_train.data import (
    TokenCounter,
    build_vocab_mapping,
    load_vocab_mapping,
    save_vocab_mapping,
)


def test_known_counts():
    #                      id: 0  1  2  3  4  5  6  7  8  9
    counts = torch.tensor([0, 5, 9, 5, 0, 7, 5, 1, 9, 2])
    mapping = build_vocab_mapping(counts, 5)
    # top 5: 2 (9), 8 (9), 5 (7), then 1, 3, 6 tie at 5 -> 1 and 3 (lower ids) win.
    assert mapping.draft_ids.tolist() == [1, 2, 3, 5, 8]
    assert mapping.d2t.tolist() == [1, 1, 1, 2, 4]
    assert mapping.d2t.dtype == torch.int64
    assert mapping.t2d.dtype == torch.bool and mapping.t2d.shape == (10,)
    assert mapping.t2d.nonzero().flatten().tolist() == [1, 2, 3, 5, 8]
    # target_id = draft_id + d2t[draft_id]
    for draft_id, target_id in enumerate([1, 2, 3, 5, 8]):
        assert draft_id + int(mapping.d2t[draft_id]) == target_id


def test_ties_and_zero_counts_fill_by_lowest_id():
    mapping = build_vocab_mapping(torch.tensor([0, 0, 3, 0, 0, 0]), 3)
    assert mapping.draft_ids.tolist() == [0, 1, 2]
    assert mapping.d2t.tolist() == [0, 0, 0]
    full = build_vocab_mapping(torch.tensor([4, 1, 3]), 3)
    assert full.d2t.tolist() == [0, 0, 0] and bool(full.t2d.all())


def test_invalid_sizes():
    with pytest.raises(ValueError, match="draft_vocab_size"):
        build_vocab_mapping(torch.ones(4, dtype=torch.int64), 5)
    with pytest.raises(ValueError, match="1-D"):
        build_vocab_mapping(torch.ones(2, 2, dtype=torch.int64), 1)


def test_counts_from_several_ranks_add_up():
    """What a distributed trainer does: count per rank, all-reduce (a sum), then build."""
    ranks = [TokenCounter(8), TokenCounter(8)]
    ranks[0].add([1, 2, 2, 7], [0, 1, 1, 1])
    ranks[1].add([2, 3, 3, 3], [1, 1, 1, 0])
    total = ranks[0].result() + ranks[1].result()
    assert total.tolist() == [0, 0, 3, 2, 0, 0, 0, 1]
    assert build_vocab_mapping(total, 2).draft_ids.tolist() == [2, 3]


def test_counter_flushes_and_checks_ids():
    counter = TokenCounter(4, flush_every=3)
    for _ in range(5):
        counter.add([0, 1, 3], [1, 1, 1])
    assert counter.result().tolist() == [5, 5, 0, 5]
    bad = TokenCounter(4)
    bad.add([4], [1])
    with pytest.raises(ValueError, match="outside the target vocabulary of 4"):
        bad.result()


def test_save_and_load(tmp_path):
    mapping = build_vocab_mapping(torch.tensor([3, 0, 2, 9, 1]), 3)
    save_vocab_mapping(mapping, tmp_path / "vocab.safetensors")
    loaded = load_vocab_mapping(tmp_path / "vocab.safetensors")
    assert torch.equal(loaded.d2t, mapping.d2t)
    assert torch.equal(loaded.t2d, mapping.t2d)
    assert torch.equal(loaded.counts, mapping.counts)
