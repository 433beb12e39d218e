"""Data order across epochs, by the row ids each step saw (not by losses): every epoch is a
permutation of all rows, a fresh one each epoch, the same for the same seed and another for
another seed; and a run stopped at a checkpoint exactly on an epoch boundary and resumed sees
the rows the uninterrupted run sees."""

from __future__ import annotations

from pathlib import Path

import pytest
from resume_runs import Stop, config, repeated_rows_data

import eagle_train.train as loop
from eagle_train.data.loader import BatchLoader, PreparedData


def epochs(data: PreparedData, seed: int, n: int) -> list[list[int]]:
    """The rows of ``n`` epochs, in the order a loader of micro-batch 2 hands them out."""
    loader = BatchLoader(data, 2, seed=seed, pad_id=0)
    per_epoch = loader.batches_per_epoch
    out = []
    for _ in range(n):
        out.append([r for _ in range(per_epoch) for r in loader.next().rows.tolist()])
    return out


@pytest.fixture(scope="module")
def eight_rows(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 rows (one chat, 8 ids): 4 micro-batches of 2 an epoch."""
    return repeated_rows_data(tiny_world, tmp_path_factory.mktemp("rows") / "same")


def test_epochs_are_fresh_permutations_seeded(eight_rows: Path) -> None:
    data = PreparedData(eight_rows)
    rows = len(data) // 2 * 2  # the whole micro-batches of one epoch
    first = epochs(data, 0, 3)
    for epoch in first:
        assert len(epoch) == len(set(epoch)) == rows and set(epoch) <= set(range(len(data)))
    assert first[0] != first[1] and first[1] != first[2] and first[0] != first[2]
    assert epochs(data, 0, 3) == first  # the same seed, the same order
    other = epochs(data, 1, 3)
    assert all(a != b for a, b in zip(first, other, strict=True))  # another seed, another


def test_resume_exactly_on_an_epoch_boundary_sees_the_same_rows(
    tiny_world: Path, eight_rows: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = eight_rows  # 4 steps an epoch
    seen: list[list[int]] = []
    real_next = BatchLoader.next

    def recording_next(self):
        batch = real_next(self)
        seen.append(batch.rows.tolist())
        return batch

    monkeypatch.setattr(BatchLoader, "next", recording_next)
    extra = ["train.grad_accum=1", "train.save_every=4", "train.max_steps=10"]
    extra.append("optim.implementation=fused")  # no torch.compile in a fast test
    loop.train(config(tiny_world, data, tmp_path / "whole", "eagle1", *extra))
    whole = list(seen)
    assert len(whole) == 10
    for epoch in (whole[:4], whole[4:8]):
        assert sorted(r for b in epoch for r in b) == list(range(8))
    assert whole[:4] != whole[4:8]

    real_save = loop._save

    def save_then_stop(run, root, keep_last):
        real_save(run, root, keep_last)
        if run.state.step == 4:  # the last step of epoch 0
            raise Stop

    seen.clear()
    cut = tmp_path / "cut"
    monkeypatch.setattr(loop, "_save", save_then_stop)
    with pytest.raises(Stop):
        loop.train(config(tiny_world, data, cut, "eagle1", *extra))
    assert seen == whole[:4]
    seen.clear()
    monkeypatch.setattr(loop, "_save", real_save)
    loop.train(config(tiny_world, data, cut, "eagle1", *extra, "train.resume=auto"))
    assert seen == whole[4:]
